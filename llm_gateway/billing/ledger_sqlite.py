"""The ledger in the workers' SQLite file (``llm_gateway.limits.sqlite``): the in-process
ledger's rule (``reserve_in``, ``settle_in``) applied to rows, each call one transaction
that no other worker interleaves with. What `serve --workers N` counts budgets in when
there is neither Redis nor Postgres."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from llm_gateway.billing.ledger import Draw, Hold, LedgerAnswer, reserve_in, settle_in

# Expired counters (their day or month is over) and buckets full again (untouched for a
# minute) are deleted every this many reservations of a process.
SWEEP_EVERY = 1000


class _Transactions(Protocol):
    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...
    def close(self) -> None: ...


class _Rows:
    """``LedgerState`` on the file's rows, inside one transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def counter(self, name: str) -> tuple[int, int]:
        row = self._db.execute("SELECT spent, reserved FROM quota_counters WHERE name = ?",
                               (name,)).fetchone()
        return (row[0], row[1]) if row is not None else (0, 0)

    def bucket(self, name: str) -> tuple[float, float] | None:
        row = self._db.execute("SELECT level, at FROM quota_buckets WHERE name = ?",
                               (name,)).fetchone()
        return (row[0], row[1]) if row is not None else None

    def set_counter(self, name: str, spent: int, reserved: int, expires_at: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO quota_counters VALUES (?, ?, ?, ?)",
                         (name, spent, reserved, expires_at))

    def set_bucket(self, name: str, level: float, at: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO quota_buckets VALUES (?, ?, ?)",
                         (name, level, at))


class SqliteLedger:
    backend = "sqlite"

    def __init__(self, file: _Transactions, clock: Callable[[], float] = time.time) -> None:
        self._file = file
        self._clock = clock
        self._reservations = 0

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer:
        now = self._clock()
        self._reservations += 1
        with self._file.transaction() as db:
            if self._reservations % SWEEP_EVERY == 0:
                db.execute("DELETE FROM quota_counters WHERE expires_at < ?", (now,))
                db.execute("DELETE FROM quota_buckets WHERE at < ?", (now - 60,))
            return reserve_in(_Rows(db), holds, draws, now)

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None) -> None:
        now = self._clock()
        with self._file.transaction() as db:
            settle_in(_Rows(db), holds, spent, draws, used, now)

    async def close(self) -> None:
        self._file.close()
