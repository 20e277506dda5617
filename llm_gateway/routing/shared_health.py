"""Passive health shared by every process, so that one's evidence keeps the others off a
failing target: through Redis between replicas, or through the workers' SQLite file
(``llm_gateway.limits.sqlite``) between the workers of one `serve --workers N`.

Each outcome that matters (a failure, or a success while the target is not clean) is
applied to the target's shared evidence with the same ``health.apply`` every process uses
locally, atomically (Redis: an optimistic WATCH/MULTI transaction; SQLite: a locked
transaction), so two processes reporting at once both count. Each process refreshes its
own book from the shared view every ``REFRESH_SECONDS``. Times are wall-clock seconds:
replicas are assumed NTP-synchronised to well under a cooldown. The shared store not
answering leaves every process on its own evidence, as without sharing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from llm_gateway.routing.health import CLEAN, Evidence, HealthBook, Outcome, apply

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

log = logging.getLogger("llm_gateway.routes")

REFRESH_SECONDS = 0.5
# Evidence nobody refreshed for this long is forgotten by Redis (a removed target).
EXPIRE_SECONDS = 24 * 3600

Change = Callable[[Evidence], Evidence]


class EvidenceUnavailable(Exception):
    """The shared store did not answer; the process goes on with its own evidence."""


class SharedEvidence(Protocol):
    backend: str

    async def update(self, target: str, change: Change) -> None:
        """Apply ``change`` to the target's shared evidence, atomically."""
        ...

    async def read(self, targets: list[str]) -> dict[str, Evidence]:
        """The shared evidence of each target that has any."""
        ...

    async def close(self) -> None: ...


class SharedHealth:
    def __init__(self, shared: SharedEvidence, book: HealthBook,
                 targets: Callable[[], Iterable[str]]) -> None:
        self._shared = shared
        self._book = book
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
        await self._shared.close()

    async def _publish(self, target: str, outcome: Outcome, retry_after: float | None) -> None:
        def change(shared: Evidence) -> Evidence:
            return apply(shared, outcome, self._book.clock(), self._book.policy, retry_after)

        try:
            await self._shared.update(target, change)
        except EvidenceUnavailable as exc:
            log.warning("shared health: could not publish to %s: %s", self._shared.backend,
                        exc)

    async def refresh(self) -> bool:
        """Take the shared view; False when the shared store did not answer."""
        targets = sorted(set(self._targets()))
        if not targets:
            return True
        try:
            shared = await self._shared.read(targets)
        except EvidenceUnavailable:
            return False  # on our own evidence until the shared store answers again
        self._book.replace_all(shared)
        return True

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            await self.refresh()


class RedisEvidence:
    """One hash per target, updated in an optimistic transaction (one key: one Cluster
    slot)."""

    backend = "Redis"

    def __init__(self, redis_url: str, *, namespace: str = "llmg") -> None:
        # redis-py is imported by what uses it: a process without REDIS_URL saves ~8 MiB.
        from llm_gateway.redis_scripts.plain import plain_client

        self._redis: Redis | RedisCluster = plain_client(redis_url, socket_timeout=2.0,
                                                        socket_connect_timeout=1.0)
        self._prefix = f"{namespace}:health:"

    async def update(self, target: str, change: Change) -> None:
        from redis.exceptions import WatchError

        key = self._prefix + target
        try:
            for _ in range(5):  # another replica wrote in between: read and apply again
                async with self._redis.pipeline(transaction=True) as pipe:
                    try:
                        await pipe.watch(key)
                        updated = change(_evidence(await pipe.hgetall(key)))
                        pipe.multi()
                        pipe.hset(key, mapping=_fields(updated))
                        pipe.expire(key, EXPIRE_SECONDS)
                        await pipe.execute()
                        return
                    except WatchError:
                        continue
        except _redis_errors() as exc:
            raise EvidenceUnavailable(type(exc).__name__) from exc

    async def read(self, targets: list[str]) -> dict[str, Evidence]:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for target in targets:
                    pipe.hgetall(self._prefix + target)
                rows = await pipe.execute()
        except _redis_errors() as exc:
            raise EvidenceUnavailable(type(exc).__name__) from exc
        return {target: _evidence(row) for target, row in zip(targets, rows, strict=True) if row}

    async def close(self) -> None:
        await self._redis.aclose()


def _redis_errors() -> tuple[type[Exception], ...]:
    """What redis-py raises when Redis does not answer (its Cluster client's
    "unreachable" is no RedisError)."""
    from redis.exceptions import RedisClusterException, RedisError

    return RedisError, RedisClusterException, OSError


class _Transactions(Protocol):
    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...
    def close(self) -> None: ...


class SqliteEvidence:
    """One row per target in the workers' file (table ``target_health``)."""

    backend = "the workers' file"

    def __init__(self, file: _Transactions) -> None:
        self._file = file

    async def update(self, target: str, change: Change) -> None:
        try:
            with self._file.transaction() as db:
                row = db.execute(f"SELECT {_EVIDENCE_COLUMNS} FROM target_health "
                                 "WHERE target = ?", (target,)).fetchone()
                updated = change(_row_evidence(row) if row is not None else CLEAN)
                db.execute(f"INSERT OR REPLACE INTO target_health (target, {_EVIDENCE_COLUMNS}) "
                           "VALUES (?, ?, ?, ?, ?, ?)",
                           (target, updated.failures, updated.successes, int(updated.degraded),
                            updated.down_until, updated.limited_until))
        except sqlite3.Error as exc:
            raise EvidenceUnavailable(type(exc).__name__) from exc

    async def read(self, targets: list[str]) -> dict[str, Evidence]:
        wanted = set(targets)
        try:
            with self._file.transaction() as db:
                rows = db.execute(f"SELECT target, {_EVIDENCE_COLUMNS} "
                                  "FROM target_health").fetchall()
        except sqlite3.Error as exc:
            raise EvidenceUnavailable(type(exc).__name__) from exc
        return {row[0]: _row_evidence(row[1:]) for row in rows if row[0] in wanted}

    async def close(self) -> None:
        self._file.close()


def _fields(evidence: Evidence) -> dict[str, str]:
    return {
        "failures": str(evidence.failures), "successes": str(evidence.successes),
        "degraded": "1" if evidence.degraded else "0", "down_until": repr(evidence.down_until),
        "limited_until": repr(evidence.limited_until),
    }


def _evidence(row: dict[bytes, bytes]) -> Evidence:
    if not row:
        return CLEAN
    return Evidence(
        failures=int(row.get(b"failures", b"0")), successes=int(row.get(b"successes", b"0")),
        degraded=row.get(b"degraded") == b"1",
        down_until=float(row.get(b"down_until", b"0")),
        limited_until=float(row.get(b"limited_until", b"0")),
    )


# A 429's cooldown (limited_until) too: one worker's 429 keeps the others off the target.
_EVIDENCE_COLUMNS = "failures, successes, degraded, down_until, limited_until"


def _row_evidence(row: tuple) -> Evidence:
    failures, successes, degraded, down_until, limited_until = row
    return Evidence(failures=failures, successes=successes, degraded=bool(degraded),
                    down_until=down_until, limited_until=limited_until)
