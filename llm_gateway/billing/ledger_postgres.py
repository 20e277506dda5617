"""The ledger in Postgres: functions (migrations 5-7), each call one statement. Counter and
bucket rows are locked in name order, so concurrent reservations of any replicas never
deadlock and never both take the last of a budget; buckets refill on the database's clock.

A reservation's owner (migration 7) is a row of ``quota_held`` (the counters and amounts
it holds) referencing its process in ``quota_processes``, heard of on the database's
clock; a swept one's tombstone is in ``quota_swept``. ``llmg_reserve`` and ``llmg_settle``
take the owner (NULL: aggregates only, as before), ``llmg_sweep`` releases the rows of
silent processes: it skips the processes another replica's sweep is on, and a row is
deleted by one settlement or sweep only, so every replica may sweep at once and each
reservation is released once. A function locks its process (key share: a process's
reservations do not queue on it) before any counter, as the sweep does, so none
deadlocks with another."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from llm_gateway.billing.ledger import (
    ORPHAN_SECONDS,
    SWEEP_PROCESSES,
    SWEEP_ROWS,
    TOMBSTONE_SECONDS,
    Draw,
    Hold,
    LedgerAnswer,
    Owner,
)


class _Connections(Protocol):
    def connection(self) -> Any: ...


class PostgresLedger:
    backend = "postgres"

    def __init__(self, store: _Connections, *, orphan_seconds: float = ORPHAN_SECONDS) -> None:
        self._store = store  # shares the store's pool; the store owns and closes it
        self._orphan_seconds = orphan_seconds

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        async with self._store.connection() as conn:
            cursor = await conn.execute(
                "SELECT * FROM llmg_reserve(%s, %s, %s, %s, %s, %s, %s, %s::text, %s::text)",
                ([h.name for h in holds], [h.limit for h in holds], [h.amount for h in holds],
                 [datetime.fromtimestamp(h.expires_at, UTC) for h in holds],
                 [d.name for d in draws], [d.capacity for d in draws],
                 [d.amount for d in draws], *_owner_args(owner)),
            )
            granted, refused, left = await cursor.fetchone()
        names = [hold.name for hold in holds] + [draw.name for draw in draws]
        return LedgerAnswer(granted, refused, dict(zip(names, left or [], strict=True)))

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None, owner: Owner | None = None,
                     ) -> None:
        async with self._store.connection() as conn:
            await conn.execute(
                "SELECT llmg_settle(%s, %s, %s, %s, %s, %s, %s, %s, %s::text, %s::text)",
                ([h.name for h in holds], [h.amount for h in holds], spent,
                 [datetime.fromtimestamp(h.expires_at, UTC) for h in holds],
                 [d.name for d in draws], [d.capacity for d in draws],
                 [d.amount for d in draws], used, *_owner_args(owner)),
            )

    async def heartbeat(self, process: str) -> None:
        async with self._store.connection() as conn:
            await conn.execute(
                "INSERT INTO quota_processes AS p (process, heard_at)"
                " VALUES (%s, clock_timestamp()) ON CONFLICT (process) DO UPDATE"
                " SET heard_at = greatest(p.heard_at, EXCLUDED.heard_at)", (process,))

    async def sweep(self) -> int:
        async with self._store.connection() as conn:
            cursor = await conn.execute(
                "SELECT llmg_sweep(%s, %s, %s, %s)",
                (self._orphan_seconds, SWEEP_PROCESSES, SWEEP_ROWS, TOMBSTONE_SECONDS))
            row = await cursor.fetchone()
        return int(row[0])

    async def spent(self, names: list[str]) -> dict[str, int]:
        async with self._store.connection() as conn:
            cursor = await conn.execute(
                "SELECT name, spent FROM quota_counters WHERE name = ANY(%s)", (names,))
            found = {name: int(spent) for name, spent in await cursor.fetchall()}
        return {name: found.get(name, 0) for name in names}

    async def close(self) -> None:
        return None


def _owner_args(owner: Owner | None) -> tuple[str | None, str | None]:
    return (owner.process, owner.request) if owner is not None else (None, None)
