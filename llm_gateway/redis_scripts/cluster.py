"""Scripts on a Redis Cluster: each call goes to the primary that owns its keys' slot.

The slot of a call is its first key's (CRC16 of the key's hash tag, mod 16384; redis-py's
``key_slot``); every key of one call must share it, as the gateway's names do by their
hash tags (a call whose keys do not is a bug, refused here before anything is sent). One
pipelined connection per primary (``Node``), opened when first needed.

The slot map comes from ``CLUSTER SLOTS``, asked of any node known (the URL's seeds
first). It is asked again when a node answers ``-MOVED`` (the slot has a new owner: a
failover, a resharding), when a node cannot be reached, and on ``-CLUSTERDOWN``; a call
follows ``-MOVED`` at once and ``-ASK`` (a slot being migrated) with ``ASKING`` first,
and waits a little on ``-TRYAGAIN`` and ``-CLUSTERDOWN``, a few times at most: past that
the cluster counts as down (``NotConnected``), which the failure policies answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llm_gateway.redis_scripts.pipe import (
    CONNECT_TIMEOUT_SECONDS,
    REPLY_TIMEOUT_SECONDS,
    Address,
    Node,
    NotConnected,
    Script,
    reply_error,
)

# Redirections and waits one call follows before the cluster counts as down.
MOST_ATTEMPTS = 6
RETRY_WAIT_SECONDS = 0.1
# A map asked for again this soon after the last is the last's (a burst of MOVED).
REFRESH_SECONDS = 0.05

SlotMap = list[Address | None]


def slot_of(keys: list[str]) -> int | None:
    """The slot every key shares (None: no keys); ValueError when they do not share one."""
    slots = {key_slot(key.encode()) for key in keys}
    if len(slots) > 1:
        raise ValueError(f"the keys of one script call are in {len(slots)} Redis Cluster "
                         "slots; they need one hash tag")
    return slots.pop() if slots else None


def parse_slots(reply: list[Any], asked: Address) -> SlotMap:
    """A ``CLUSTER SLOTS`` reply as slot -> its primary (an empty host is the asked one's)."""
    owners: SlotMap = [None] * REDIS_CLUSTER_HASH_SLOTS
    for start, end, primary, *_ in reply:
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        address = (host if host and host != "?" else asked[0], int(primary[1]))
        for slot in range(int(start), int(end) + 1):
            owners[slot] = address
    return owners


def redirection(reply: Any) -> tuple[str, Address] | None:
    """``("MOVED" | "ASK", address)`` for a redirection reply, else None."""
    if not reply_error(reply, "MOVED ", "ASK "):
        return None
    kind, _, target = str(reply).split(" ", 2)
    host, _, port = target.rpartition(":")
    return kind, (host, int(port))


class ClusterScripts:
    def __init__(self, seeds: tuple[Address, ...], options: dict[str, Any], *,
                 connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
                 reply_timeout: float = REPLY_TIMEOUT_SECONDS,
                 on_load: Callable[[], None] = lambda: None) -> None:
        self._seeds = seeds
        self._options = options
        self._timeouts = {"connect_timeout": connect_timeout, "reply_timeout": reply_timeout}
        self._on_load = on_load
        self._nodes: dict[Address, Node] = {}
        self._slots: SlotMap = []
        self._refreshed_at = 0.0
        self._refreshing: asyncio.Future[None] | None = None
        self.refreshes = 0  # how often the slot map was asked for: tests, diagnostics

    def node(self, address: Address) -> Node:
        if (node := self._nodes.get(address)) is None:
            node = self._nodes[address] = Node({**self._options, "host": address[0],
                                                "port": address[1]},
                                               on_load=self._on_load, **self._timeouts)
        return node

    async def run(self, script: Script, frame: bytes, keys: list[str], grace: float) -> Any:
        slot = slot_of(keys)
        asking: Address | None = None
        reply: Any = None
        for attempt in range(MOST_ATTEMPTS):
            address = asking or await self._owner(slot)
            try:
                reply = await self.node(address).run(script, frame, grace,
                                                     asking=asking is not None)
            except NotConnected:
                if attempt == MOST_ATTEMPTS - 1:
                    raise
                await self._wait_and_refresh()  # a failed primary: who took its slots?
                continue
            except (RedisConnectionError, RedisTimeoutError):
                # Sent, and the connection broke or hung: the script may have run, so the
                # call is not made again; the next ones go where the map now says.
                self._refresh_soon()
                raise
            asking = None
            if (redirect := redirection(reply)) is not None:
                kind, target = redirect
                if kind == "ASK":
                    asking = target
                else:
                    if slot is not None and self._slots:
                        self._slots[slot] = target
                    self._refresh_soon()
                continue
            if reply_error(reply, "TRYAGAIN", "CLUSTERDOWN"):
                await self._wait_and_refresh()
                continue
            return reply
        raise NotConnected(f"the Redis Cluster did not serve the call: {reply}")

    async def ping(self) -> None:
        """Every primary answers PING."""
        await self._owner(None)
        primaries = {address for address in self._slots if address is not None}
        for reply in await asyncio.gather(*(self.node(a).call(b"*1\r\n$4\r\nPING\r\n")
                                            for a in sorted(primaries))):
            if isinstance(reply, ResponseError):
                raise reply

    async def close(self) -> None:
        nodes, self._nodes = list(self._nodes.values()), {}
        await asyncio.gather(*(node.close() for node in nodes))

    def _open(self, address: Address) -> bool:
        pipe = self._nodes[address].pipe if address in self._nodes else None
        return pipe is not None and not pipe.closed

    async def _owner(self, slot: int | None) -> Address:
        if not self._slots:
            await self.refresh()
        if slot is None:  # no keys: any primary
            owner = next((address for address in self._slots if address), None)
        else:
            owner = self._slots[slot]
        if owner is None:
            raise NotConnected(f"no node of the Redis Cluster serves slot {slot}")
        return owner

    async def _wait_and_refresh(self) -> None:
        await asyncio.sleep(RETRY_WAIT_SECONDS)
        with contextlib.suppress(NotConnected):
            await self.refresh()

    def _refresh_soon(self) -> None:
        task = asyncio.ensure_future(self.refresh())
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def refresh(self) -> None:
        """Ask a node for the slot map; calls that ask together share one answer."""
        if self._refreshing is not None:
            return await asyncio.shield(self._refreshing)
        if self._slots and time.monotonic() - self._refreshed_at < REFRESH_SECONDS:
            return None
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            self._slots = await self._ask_for_slots()
            self._refreshed_at = time.monotonic()
            self.refreshes += 1
            self._refreshing.set_result(None)
        except BaseException as exc:
            self._refreshing.set_exception(exc)
            self._refreshing.exception()
            raise
        finally:
            self._refreshing = None
        return None

    async def _ask_for_slots(self) -> SlotMap:
        known = {address for address in self._slots if address is not None}
        candidates = list(dict.fromkeys([*sorted(known), *self._seeds, *self._nodes]))
        # Nodes with an open connection first: they were alive a moment ago, where a
        # failed one could cost a connect timeout on a real network.
        candidates.sort(key=lambda address: not self._open(address))
        failures = []
        for address in candidates:
            try:
                reply = await self.node(address).call(
                    b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n")
            except (RedisConnectionError, RedisTimeoutError) as exc:
                failures.append(f"{address[0]}:{address[1]}: {type(exc).__name__}")
                continue
            if isinstance(reply, ResponseError) or not reply:
                failures.append(f"{address[0]}:{address[1]}: {reply or 'no slots'}")
                continue
            return parse_slots(reply, address)
        raise NotConnected("no node of the Redis Cluster gave its slots: "
                           + "; ".join(failures))
