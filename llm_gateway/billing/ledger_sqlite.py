"""The ledger in the workers' SQLite file (``llm_gateway.limits.sqlite``): the in-process
ledger's rules (``reserve_in``, ``settle_in``, ``sweep_in``) applied to rows, each call one
transaction that no other worker interleaves with. What `serve --workers N` counts budgets
in when there is neither Redis nor Postgres.

A reservation with an owner keeps its held row (its holds as JSON) in ``quota_held``; a
swept one's tombstone is in ``quota_swept``, and when each process was last heard of in
``quota_processes``, on the workers' clock (one machine's). A worker killed with requests
under way thus has its reservations released by any other worker's sweep, or by its
replacement's."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from llm_gateway.billing.ledger import (
    ORPHAN_SECONDS,
    Draw,
    Hold,
    LedgerAnswer,
    Owner,
    reserve_in,
    settle_in,
    sweep_in,
)

# Expired counters (their day or month is over) and buckets full again (untouched for a
# minute) are deleted every this many reservations of a process.
SWEEP_EVERY = 1000


class _Transactions(Protocol):
    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...
    def close(self) -> None: ...


def _holds_json(holds: list[Hold]) -> str:
    return json.dumps([[h.name, h.limit, h.amount, h.expires_at] for h in holds])


def _holds_of(text: str) -> list[Hold]:
    return [Hold(name, limit, amount, expires_at)
            for name, limit, amount, expires_at in json.loads(text)]


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

    def add_held(self, owner: Owner, holds: list[Hold]) -> None:
        # A second reservation of one owner: the two JSON arrays joined, as one.
        self._db.execute(
            "INSERT INTO quota_held VALUES (?, ?, ?) ON CONFLICT (process, request) DO UPDATE"
            " SET holds = substr(holds, 1, length(holds) - 1) || ', ' || substr(excluded.holds, 2)",
            (owner.process, owner.request, _holds_json(holds)))

    def take_held(self, owner: Owner) -> list[Hold] | None:
        row = self._db.execute(
            "DELETE FROM quota_held WHERE process = ? AND request = ? RETURNING holds",
            (owner.process, owner.request)).fetchone()
        return _holds_of(row[0]) if row is not None else None

    def take_swept(self, owner: Owner) -> bool:
        return self._db.execute(
            "DELETE FROM quota_swept WHERE process = ? AND request = ? RETURNING 1",
            (owner.process, owner.request)).fetchone() is not None

    def heard(self, process: str, at: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO quota_processes VALUES (?, ?)", (process, at))

    def silent(self, before: float, most: int) -> list[str]:
        return [row[0] for row in self._db.execute(
            "SELECT process FROM quota_processes WHERE heard_at < ? ORDER BY heard_at LIMIT ?",
            (before, most))]

    def take_held_of(self, process: str, most: int) -> list[tuple[str, list[Hold]]]:
        return [(request, _holds_of(holds)) for request, holds in self._db.execute(
            "DELETE FROM quota_held WHERE process = ? AND request IN (SELECT request FROM"
            " quota_held WHERE process = ? LIMIT ?) RETURNING request, holds",
            (process, process, most)).fetchall()]

    def add_swept(self, process: str, requests: list[str], at: float) -> None:
        self._db.executemany("INSERT OR REPLACE INTO quota_swept VALUES (?, ?, ?)",
                             [(process, request, at) for request in requests])

    def forget(self, process: str) -> None:
        self._db.execute("DELETE FROM quota_processes WHERE process = ?", (process,))

    def drop_swept(self, before: float, most: int) -> None:
        self._db.execute(
            "DELETE FROM quota_swept WHERE (process, request) IN (SELECT process, request"
            " FROM quota_swept WHERE at < ? LIMIT ?)", (before, most))


class SqliteLedger:
    backend = "sqlite"

    def __init__(self, file: _Transactions, clock: Callable[[], float] = time.time, *,
                 orphan_seconds: float = ORPHAN_SECONDS) -> None:
        self._file = file
        self._clock = clock
        self._orphan_seconds = orphan_seconds
        self._reservations = 0

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        now = self._clock()
        self._reservations += 1
        with self._file.transaction() as db:
            if self._reservations % SWEEP_EVERY == 0:
                db.execute("DELETE FROM quota_counters WHERE expires_at < ?", (now,))
                db.execute("DELETE FROM quota_buckets WHERE at < ?", (now - 60,))
            return reserve_in(_Rows(db), holds, draws, now, owner)

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None, owner: Owner | None = None,
                     ) -> None:
        now = self._clock()
        with self._file.transaction() as db:
            settle_in(_Rows(db), holds, spent, draws, used, now, owner)

    async def heartbeat(self, process: str) -> None:
        now = self._clock()
        with self._file.transaction() as db:
            _Rows(db).heard(process, now)

    async def sweep(self) -> int:
        now = self._clock()
        with self._file.transaction() as db:
            return sweep_in(_Rows(db), now, self._orphan_seconds)

    async def spent(self, names: list[str]) -> dict[str, int]:
        with self._file.transaction() as db:
            rows = _Rows(db)
            return {name: rows.counter(name)[0] for name in names}

    async def close(self) -> None:
        self._file.close()
