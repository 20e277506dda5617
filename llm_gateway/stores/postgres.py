"""Postgres store: the state every replica shares. psycopg 3, async, one pool per process.

Times are ``timestamptz`` in the database and Unix seconds (float) in KeyRecord and
UsageRecord; this module converts at the boundary. Connections run in autocommit mode:
each statement here is one round trip and its own transaction, except where a
``transaction()`` block says otherwise.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from llm_gateway.keys import KeyRecord
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.admin_postgres import AdminPostgresMixin
from llm_gateway.stores.migrations import MIGRATIONS
from llm_gateway.stores.reconcile_drift import ReconcilePostgresMixin
from llm_gateway.stores.usage_postgres import UsagePostgresMixin

T = TypeVar("T")
Connection = psycopg.AsyncConnection[tuple[Any, ...]]

# Serialises `migrate` across replicas that start together (a database-wide lock id;
# the digits spell nothing, they only need to be unique to this application).
_MIGRATION_LOCK_ID = 7_324_001
# A request must not hang on a dead database: get a connection within this or fail.
POOL_TIMEOUT_SECONDS = 3.0
# No statement may hang a request: a table someone holds locked (a long ALTER, a LOCK
# TABLE) is given up on after a second, and anything slower than five seconds is stopped.
# Either becomes StoreUnavailable, which the failure policies answer. Migrations and
# reports, which may take longer, lift the statement limit for their own transaction.
STATEMENT_LIMITS = "-c lock_timeout=1000 -c statement_timeout=5000"
CONNECT_TIMEOUT_SECONDS = 3

_KEY_COLUMNS = (
    "id, subject_id, name, prefix, key_hash, is_active, revoked_at, expires_at, created_at, "
    "last_used_at, rate_limit_requests, rate_limit_window_seconds, allowed_models, "
    "rate_limit_burst"
)


def to_timestamp(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def from_timestamp(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _row_to_key(row: tuple[Any, ...]) -> KeyRecord:
    created_at = from_timestamp(row[8])
    assert created_at is not None  # NOT NULL in the schema
    return KeyRecord(
        id=str(row[0]), subject_id=row[1], name=row[2], prefix=row[3], key_hash=bytes(row[4]),
        is_active=row[5], revoked_at=from_timestamp(row[6]), expires_at=from_timestamp(row[7]),
        created_at=created_at, last_used_at=from_timestamp(row[9]),
        rate_limit_requests=row[10], rate_limit_window_seconds=row[11],
        allowed_models=tuple(row[12]), rate_limit_burst=row[13],
    )


def _as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


class PostgresStore(UsagePostgresMixin, AdminPostgresMixin, ReconcilePostgresMixin):
    dialect = "postgres"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        # Opened on first use, inside the event loop that will use it (the pool's
        # workers are tasks of that loop).
        self.pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=POOL_TIMEOUT_SECONDS,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                    # Added to the URL's own options (a search_path, say), not instead.
                    "options": f"{conninfo_to_dict(url).get('options') or ''} "
                               f"{STATEMENT_LIMITS}".strip()},
            name="llm-gateway",
        )
        self._opened = False

    async def _open(self) -> None:
        if not self._opened:
            self._opened = True
            # wait=False: a database that is down at start-up is retried by the pool in
            # the background; callers get StoreUnavailable meanwhile, not a hang.
            await self.pool.open(wait=False)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection; failures to reach the database become StoreUnavailable."""
        await self._open()
        try:
            async with self.pool.connection() as conn:
                try:
                    yield conn
                except psycopg.errors.ReadOnlySqlTransaction:
                    # Its server is read-only now (demoted after a switchover, or a
                    # standby): closed, the pool drops it, and the next connection goes to
                    # the host that is read-write (target_session_attrs=read-write).
                    await conn.close()
                    raise
        except (psycopg.OperationalError, psycopg.InterfaceError,
                psycopg.errors.ReadOnlySqlTransaction) as exc:
            raise StoreUnavailable(f"postgres: {type(exc).__name__}: {exc}") from exc

    async def _read(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """Run an idempotent read, once more if the first connection turns out dead.

        After a database restart every idle pooled connection is broken; ``pool.check()``
        drops them all, so the second try gets a fresh one instead of the next corpse.
        """
        try:
            async with self.connection() as conn:
                return await work(conn)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, PoolTimeout):
                raise  # no connection at all: the database is down, not just restarted
            await self.pool.check()
            async with self.connection() as conn:
                return await work(conn)

    async def migrate(self) -> list[int]:
        applied: list[int] = []
        async with self.connection() as conn, conn.transaction():
            # Replicas starting together: one migrates, the others wait and find it done.
            await conn.execute("SET LOCAL statement_timeout = 0")
            await conn.execute("SET LOCAL lock_timeout = 0")
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, description TEXT NOT NULL,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            cursor = await conn.execute("SELECT version FROM schema_migrations")
            done = {row[0] for row in await cursor.fetchall()}
            for migration in MIGRATIONS:
                if migration.version in done:
                    continue
                await conn.execute(migration.postgres.encode())  # several statements
                await conn.execute(
                    "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                    (migration.version, migration.description),
                )
                applied.append(migration.version)
        return applied

    async def ping(self) -> None:
        async def probe(conn: Connection) -> None:
            # The key table: readiness must fail when key lookups would.
            await conn.execute("SELECT 1 FROM gateway_keys LIMIT 1")

        await self._read(probe)

    async def close(self) -> None:
        if self._opened:
            await self.pool.close()
            self._opened = False

    async def insert_key(self, record: KeyRecord) -> None:
        async with self.connection() as conn:
            await conn.execute(
                f"INSERT INTO gateway_keys ({_KEY_COLUMNS}) VALUES ({', '.join(['%s'] * 14)})",
                (
                    uuid.UUID(record.id), record.subject_id, record.name, record.prefix,
                    record.key_hash, record.is_active, to_timestamp(record.revoked_at),
                    to_timestamp(record.expires_at), to_timestamp(record.created_at),
                    to_timestamp(record.last_used_at), record.rate_limit_requests,
                    record.rate_limit_window_seconds, list(record.allowed_models),
                    record.rate_limit_burst,
                ),
            )

    async def key_by_prefix(self, prefix: str) -> KeyRecord | None:
        async def lookup(conn: Connection) -> tuple[Any, ...] | None:
            # gateway_keys.prefix is UNIQUE: an index lookup.
            cursor = await conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM gateway_keys WHERE prefix = %s", (prefix,)
            )
            return await cursor.fetchone()

        row = await self._read(lookup)
        return _row_to_key(row) if row else None

    async def find_key(self, prefix_or_id: str) -> KeyRecord | None:
        key_id = _as_uuid(prefix_or_id)
        async with self.connection() as conn:
            if key_id is None:
                cursor = await conn.execute(
                    f"SELECT {_KEY_COLUMNS} FROM gateway_keys WHERE prefix = %s",
                    (prefix_or_id[:12],),
                )
            else:
                cursor = await conn.execute(
                    f"SELECT {_KEY_COLUMNS} FROM gateway_keys WHERE prefix = %s OR id = %s",
                    (prefix_or_id[:12], key_id),
                )
            row = await cursor.fetchone()
        return _row_to_key(row) if row else None

    async def list_keys(self) -> list[KeyRecord]:
        async with self.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM gateway_keys ORDER BY created_at"
            )
            rows = await cursor.fetchall()
        return [_row_to_key(row) for row in rows]

    async def revoke_key(self, key_id: str, now: float) -> bool:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "UPDATE gateway_keys SET is_active = FALSE, revoked_at = %s "
                "WHERE id = %s AND revoked_at IS NULL",
                (to_timestamp(now), uuid.UUID(key_id)),
            )
            return cursor.rowcount == 1

    async def touch_keys(self, last_used: dict[str, float]) -> None:
        """One statement for the whole batch; last_used_at never moves backwards."""
        if not last_used:
            return
        ids = [uuid.UUID(key_id) for key_id in last_used]
        moments = [to_timestamp(ts) for ts in last_used.values()]
        async with self.connection() as conn:
            await conn.execute(
                "UPDATE gateway_keys AS k SET last_used_at = GREATEST(k.last_used_at, t.used) "
                "FROM unnest(%s::uuid[], %s::timestamptz[]) AS t(id, used) WHERE k.id = t.id",
                (ids, moments),
            )

