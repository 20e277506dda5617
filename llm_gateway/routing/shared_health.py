"""Passive health shared by every replica, through Redis: one replica's evidence keeps the
others off a failing target.

Each outcome that matters (a failure, or a success while the target is not clean) is
applied to the target's shared evidence with the same ``health.apply`` every replica uses
locally, inside an optimistic transaction (WATCH/MULTI), so two replicas reporting at once
both count. Each replica refreshes its own book from Redis every ``REFRESH_SECONDS``.
Times are wall-clock seconds: replicas are assumed NTP-synchronised to well under a
cooldown. Redis being down leaves every replica on its own evidence, as without sharing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from redis.asyncio import Redis
from redis.exceptions import RedisError, WatchError

from llm_gateway.routing.health import CLEAN, Evidence, HealthBook, Outcome, apply

log = logging.getLogger("llm_gateway.routes")

REFRESH_SECONDS = 0.5
# Evidence nobody refreshed for this long is forgotten by Redis (a removed target).
EXPIRE_SECONDS = 24 * 3600


class SharedHealth:
    def __init__(self, redis_url: str, book: HealthBook, targets: Callable[[], Iterable[str]],
                 *, namespace: str = "llmg") -> None:
        self._redis: Redis = Redis.from_url(redis_url, socket_timeout=2.0,
                                           socket_connect_timeout=1.0)
        self._book = book
        self._prefix = f"{namespace}:health:"
        self._targets = targets  # the route table's, whichever version is in force
        self._pending: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def listener(self, target: str, outcome: Outcome, retry_after: float | None,
                 before: Evidence) -> None:
        """A router listener: publish what changes the shared evidence (a success on a
        target that was clean changes nothing, and is most of the traffic)."""
        if outcome is Outcome.SUCCESS and before == CLEAN:
            return
        task = asyncio.get_running_loop().create_task(self._publish(target, outcome,
                                                                    retry_after))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def start(self) -> None:
        if self._task is None:
            await self.refresh()
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._pending):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        await self._redis.aclose()

    async def _publish(self, target: str, outcome: Outcome, retry_after: float | None) -> None:
        key = self._prefix + target
        try:
            for _ in range(5):  # another replica wrote in between: read and apply again
                async with self._redis.pipeline(transaction=True) as pipe:
                    try:
                        await pipe.watch(key)
                        shared = _evidence(await pipe.hgetall(key))
                        updated = apply(shared, outcome, self._book.clock(), self._book.policy,
                                        retry_after)
                        pipe.multi()
                        pipe.hset(key, mapping=_fields(updated))
                        pipe.expire(key, EXPIRE_SECONDS)
                        await pipe.execute()
                        return
                    except WatchError:
                        continue
        except (RedisError, OSError) as exc:
            log.warning("shared health: could not publish to Redis: %s", type(exc).__name__)

    async def refresh(self) -> None:
        targets = sorted(set(self._targets()))
        if not targets:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for target in targets:
                    pipe.hgetall(self._prefix + target)
                rows = await pipe.execute()
        except (RedisError, OSError):
            return  # on our own evidence until Redis answers again
        self._book.replace_all({
            target: _evidence(row) for target, row in zip(targets, rows, strict=True) if row
        })

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            await self.refresh()


def _fields(evidence: Evidence) -> dict[str, str]:
    return {
        "failures": str(evidence.failures), "successes": str(evidence.successes),
        "degraded": "1" if evidence.degraded else "0", "down_until": repr(evidence.down_until),
    }


def _evidence(row: dict[bytes, bytes]) -> Evidence:
    if not row:
        return CLEAN
    return Evidence(
        failures=int(row.get(b"failures", b"0")), successes=int(row.get(b"successes", b"0")),
        degraded=row.get(b"degraded") == b"1",
        down_until=float(row.get(b"down_until", b"0")),
    )
