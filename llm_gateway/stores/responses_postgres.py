"""Response bindings (llm_gateway.stores.responses) in the Postgres key store's
``response_owners`` table, through the store's pool: one statement, one round trip each.

Concurrent binds of one id from any number of replicas are decided by the primary key
(``ON CONFLICT``): the first committed wins while it lives. Expiry is decided by this
process's clock, passed to each statement, as the SQLite store does; the sweep deletes a
bounded number of expired rows now and then, skipping rows another replica is deleting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from llm_gateway.stores.postgres import Connection, PostgresStore, from_timestamp, to_timestamp
from llm_gateway.stores.responses import SWEEP_EVERY_BINDS, SWEEP_ROWS, ResponseBinding

_COLUMNS = "response_id, subject_id, key_id, provider, model, created_at, expires_at"
# A live binding stays (the first bind wins); only an expired one is taken over.
_BIND = f"""
INSERT INTO response_owners AS o ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (response_id) DO UPDATE SET
    subject_id = EXCLUDED.subject_id, key_id = EXCLUDED.key_id,
    provider = EXCLUDED.provider, model = EXCLUDED.model,
    created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
WHERE o.expires_at <= %s
"""
_OWNER = f"SELECT {_COLUMNS} FROM response_owners WHERE response_id = %s AND expires_at > %s"
_SWEEP = """
DELETE FROM response_owners WHERE response_id IN (
    SELECT response_id FROM response_owners WHERE expires_at <= %s
    ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED)
"""


def _binding(row: tuple[Any, ...]) -> ResponseBinding:
    created_at, expires_at = from_timestamp(row[5]), from_timestamp(row[6])
    assert created_at is not None and expires_at is not None  # NOT NULL in the schema
    return ResponseBinding(row[0], row[1], row[2], row[3], row[4], created_at, expires_at)


class PostgresResponseOwners:
    backend = "postgres"

    def __init__(self, store: PostgresStore, *, clock: Callable[[], float] = time.time,
                 sweep_every: int = SWEEP_EVERY_BINDS) -> None:
        self._store = store  # shares the store's pool; the store owns and closes it
        self._clock = clock
        self._sweep_every = sweep_every
        self._binds = 0

    async def bind(self, binding: ResponseBinding) -> None:
        now = self._clock()
        if binding.expires_at <= now:
            return  # expired already: there is nothing to keep
        self._binds += 1
        async with self._store.connection() as conn:
            await conn.execute(_BIND, (
                binding.response_id, binding.subject_id, binding.key_id, binding.provider,
                binding.model, to_timestamp(binding.created_at),
                to_timestamp(binding.expires_at), to_timestamp(now)))
            if self._binds % self._sweep_every == 0:
                await conn.execute(_SWEEP, (to_timestamp(now), SWEEP_ROWS))

    async def owner(self, response_id: str) -> ResponseBinding | None:
        moment = to_timestamp(self._clock())

        async def lookup(conn: Connection) -> tuple[Any, ...] | None:
            cursor = await conn.execute(_OWNER, (response_id, moment))
            return await cursor.fetchone()

        # A read, so tried again on a fresh connection after a database restart, as key
        # lookups are: a GET right after a failover must not answer 503 for nothing.
        row = await self._store._read(lookup)
        return _binding(row) if row else None

    async def forget(self, response_id: str) -> None:
        async with self._store.connection() as conn:
            await conn.execute("DELETE FROM response_owners WHERE response_id = %s",
                               (response_id,))

    async def sweep(self, limit: int = SWEEP_ROWS) -> int:
        """Delete up to ``limit`` expired bindings, the oldest first; how many went."""
        async with self._store.connection() as conn:
            cursor = await conn.execute(_SWEEP, (to_timestamp(self._clock()), limit))
            return int(cursor.rowcount)

    async def close(self) -> None:
        return None
