"""Lua scripts on Redis, on the request path: pipelined connections, no pool.

The limiter takes, and the budget ledger reserves and settles, with one script call per
request each. Through redis-py's asyncio client a call costs about 135 µs of CPU on the
gateway's loop (a pooled connection checked out and back, a timeout context, a retry
wrapper, generic command packing and parsing): more than all of the engine's own work for
that request. This client only writes EVALSHA frames (packed by hiredis, the parser
redis-py uses too) on one connection per server and matches replies to callers in order
(``pipe``), so a call costs about the round trip's loop wake-up (measured: 26 µs of CPU
under uvloop), and concurrent calls share a write and a read. redis-py stays for
everything off the request path (shared health, tests, the CLI; ``plain``) and as the
vocabulary of errors: callers catch ``redis.exceptions`` as before.

REDIS_URL's three forms (llm_gateway.redis_urls):

- one server: one connection;
- Sentinel: one connection to the primary, whose address the sentinels give each time it
  is opened (``sentinel``); a primary that answers ``-READONLY`` or ``-LOADING`` (it was
  demoted, or is loading after a restart) has not run the script, so the call is made
  again on a connection to the primary the sentinels name now, a few times at most;
- Cluster: one connection per primary, each call to the one owning its keys' slot
  (``cluster``).

A call whose connection breaks after it was written is never made again (the script may
have run): it fails, and the failure policies answer it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import ResponseError

from llm_gateway.redis_scripts.cluster import ClusterScripts
from llm_gateway.redis_scripts.pipe import (
    CONNECT_TIMEOUT_SECONDS,
    REPLY_TIMEOUT_SECONDS,
    Node,
    NotConnected,
    Script,
    _Pipe,
    reply_error,
)
from llm_gateway.redis_scripts.sentinel import SentinelLocator
from llm_gateway.redis_urls import RedisTarget, parse_redis_url

# How often, and how far apart, a call refused by a demoted or loading primary is tried
# on the primary the sentinels name (a failover takes the sentinels about a second).
FAILOVER_ATTEMPTS = 5
FAILOVER_WAIT_SECONDS = 0.1
_PING = b"*1\r\n$4\r\nPING\r\n"

__all__ = ["CONNECT_TIMEOUT_SECONDS", "REPLY_TIMEOUT_SECONDS", "RedisScripts", "Script"]


def node_options(target: RedisTarget) -> dict[str, Any]:
    """What a Sentinel's or Cluster's node connection needs besides its address."""
    return {"username": target.username, "password": target.password, "db": target.db}


class RedisScripts:
    """Runs scripts on the Redis that ``url`` names (any REDIS_URL form)."""

    def __init__(self, url: str, *, connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
                 reply_timeout: float = REPLY_TIMEOUT_SECONDS) -> None:
        target = parse_redis_url(url)
        self.kind = target.kind
        self.script_loads = 0  # how often a script was (re)loaded: tests, diagnostics
        timeouts = {"connect_timeout": connect_timeout, "reply_timeout": reply_timeout}
        self.locator: SentinelLocator | None = None
        self.cluster: ClusterScripts | None = None
        self._node: Node | None = None
        if target.kind == "cluster":
            self.cluster = ClusterScripts(target.hosts, node_options(target),
                                          on_load=self._loaded, **timeouts)
        elif target.kind == "sentinel":
            self.locator = SentinelLocator(target.hosts, target.service, timeout=connect_timeout)
            self._node = Node(node_options(target), self.locator, primary_only=True,
                              on_load=self._loaded, **timeouts)
        else:
            self._node = Node(parse_url(url), on_load=self._loaded, **timeouts)

    def _loaded(self) -> None:
        self.script_loads += 1

    @property
    def _pipe(self) -> _Pipe | None:
        """The single server's or Sentinel primary's connection (tests)."""
        return self._node.pipe if self._node is not None else None

    async def run(self, script: Script, keys: list[str], args: list[Any], *,
                  grace: float = 0.0) -> Any:
        """The script's reply. Raises redis-py's ConnectionError or TimeoutError when Redis
        does not answer, and ResponseError for an error the script raised. ``grace``: how
        long the call may wait to share a write with later calls while others are under
        way (for work no request waits on: the next call carries it, or the grace's end
        does)."""
        frame = hiredis.pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))
        if self.cluster is not None:
            try:
                reply = await self.cluster.run(script, frame, keys, grace)
            except ValueError as exc:  # keys in several slots: Redis's own word for it
                raise ResponseError(f"CROSSSLOT {exc}") from None
        else:
            assert self._node is not None
            reply = await self._node.run(script, frame, grace)
            if self.locator is not None and reply_error(reply, "READONLY", "LOADING"):
                reply = await self._on_new_primary(script, frame)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def _on_new_primary(self, script: Script, frame: bytes) -> Any:
        """The call again on the primary the sentinels name now (the one it went to was
        demoted, or is loading): refused there, the script ran nowhere."""
        assert self._node is not None
        last = "a demoted or loading primary"
        for attempt in range(FAILOVER_ATTEMPTS):
            self._node.retire()
            if attempt:
                await asyncio.sleep(FAILOVER_WAIT_SECONDS)
            try:
                reply = await self._node.run(script, frame)
            except NotConnected as exc:
                last = str(exc)
                continue
            if not reply_error(reply, "READONLY", "LOADING"):
                return reply
            last = str(reply)
        raise NotConnected(f"no primary took the call during the failover: {last}")

    async def ping(self) -> None:
        if self.cluster is not None:
            await self.cluster.ping()
            return
        assert self._node is not None
        reply = await self._node.call(_PING)
        if isinstance(reply, ResponseError):
            raise reply

    async def close(self) -> None:
        """Close the connections, once the calls made on them have their replies (a
        deferred call is written now)."""
        if self.cluster is not None:
            await self.cluster.close()
        if self._node is not None:
            await self._node.close()
