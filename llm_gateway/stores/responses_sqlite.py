"""Response bindings (llm_gateway.stores.responses) in the SQLite key store's
``response_owners`` table, on the store's one connection and thread (``_run``), so a
``serve --workers N`` whose workers share the database file shares its bindings too.

Expiry is decided by this process's clock, in SQL: an expired row is never returned,
is replaced by a new bind of its id, and is deleted by the sweep (bounded, now and then).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.responses import SWEEP_EVERY_BINDS, SWEEP_ROWS, ResponseBinding
from llm_gateway.stores.sqlite import SqliteStore

T = TypeVar("T")

_COLUMNS = "response_id, subject_id, key_id, provider, model, created_at, expires_at"
# A live binding stays (the first bind wins); only an expired one is taken over.
_BIND = f"""
INSERT INTO response_owners ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (response_id) DO UPDATE SET
    subject_id = excluded.subject_id, key_id = excluded.key_id,
    provider = excluded.provider, model = excluded.model,
    created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE response_owners.expires_at <= ?
"""
_OWNER = f"SELECT {_COLUMNS} FROM response_owners WHERE response_id = ? AND expires_at > ?"
_SWEEP = """
DELETE FROM response_owners WHERE response_id IN (
    SELECT response_id FROM response_owners WHERE expires_at <= ?
    ORDER BY expires_at LIMIT ?)
"""
# What SQLite says when the database cannot do the work now (another writer holds it past
# the busy timeout, the disk fails or is full, the file cannot be opened): the store does
# not answer. Every other error (a missing table, a constraint) is a bug and surfaces.
_NOT_ANSWERING = ("locked", "busy", "disk i/o", "unable to open", "is full", "interrupted")


def _binding(row: tuple[Any, ...]) -> ResponseBinding:
    return ResponseBinding(*row)


class SqliteResponseOwners:
    backend = "sqlite"

    def __init__(self, store: SqliteStore, *, clock: Callable[[], float] = time.time,
                 sweep_every: int = SWEEP_EVERY_BINDS) -> None:
        self._store = store  # its connection and thread; the store owns and closes them
        self._clock = clock
        self._sweep_every = sweep_every
        self._binds = 0

    async def bind(self, binding: ResponseBinding) -> None:
        now = self._clock()
        if binding.expires_at <= now:
            return  # expired already: there is nothing to keep
        self._binds += 1
        sweep = self._binds % self._sweep_every == 0
        values = (binding.response_id, binding.subject_id, binding.key_id, binding.provider,
                  binding.model, binding.created_at, binding.expires_at, now)

        def write(db: sqlite3.Connection) -> None:
            db.execute(_BIND, values)
            if sweep:
                db.execute(_SWEEP, (now, SWEEP_ROWS))

        await self._run(write)

    async def owner(self, response_id: str) -> ResponseBinding | None:
        now = self._clock()
        row = await self._run(lambda db: db.execute(_OWNER, (response_id, now)).fetchone())
        return _binding(row) if row else None

    async def forget(self, response_id: str) -> None:
        await self._run(lambda db: db.execute(
            "DELETE FROM response_owners WHERE response_id = ?", (response_id,)))

    async def sweep(self, limit: int = SWEEP_ROWS) -> int:
        """Delete up to ``limit`` expired bindings, the oldest first; how many went."""
        now = self._clock()
        cursor = await self._run(lambda db: db.execute(_SWEEP, (now, limit)))
        return int(cursor.rowcount)

    async def close(self) -> None:
        return None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._store._run(work)
        except sqlite3.OperationalError as exc:
            if not any(words in str(exc).lower() for words in _NOT_ANSWERING):
                raise
            raise StoreUnavailable(f"sqlite: {exc}") from exc
