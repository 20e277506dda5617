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
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.keys import KeyRecord
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.migrations import MIGRATIONS

T = TypeVar("T")
Connection = psycopg.AsyncConnection[tuple[Any, ...]]

# Serialises `migrate` across replicas that start together (a database-wide lock id;
# the digits spell nothing, they only need to be unique to this application).
_MIGRATION_LOCK_ID = 7_324_001
# A request must not hang on a dead database: get a connection within this or fail.
POOL_TIMEOUT_SECONDS = 3.0
CONNECT_TIMEOUT_SECONDS = 3

_KEY_COLUMNS = (
    "id, subject_id, name, prefix, key_hash, is_active, revoked_at, expires_at, created_at, "
    "last_used_at, rate_limit_requests, rate_limit_window_seconds, allowed_models"
)
_USAGE_COLUMNS = (
    "request_id, key_id, subject_id, adapter, endpoint, model, upstream, stream, status, "
    "error_type, prompt_tokens, completion_tokens, total_tokens, cost_usd, cost_diem, "
    "response_id, finish_reasons, started_at, duration_ms, ttfb_ms, first_chunk_ms, "
    "max_gap_ms, attempts"
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
        allowed_models=tuple(row[12]),
    )


def _row_to_usage(r: tuple[Any, ...]) -> UsageRecord:
    started_at = from_timestamp(r[17])
    assert started_at is not None
    return UsageRecord(
        request_id=r[0], key_id=str(r[1]), subject_id=r[2], adapter=r[3], endpoint=r[4],
        model=r[5], upstream=r[6], stream=r[7], status=r[8], error_type=r[9],
        prompt_tokens=r[10], completion_tokens=r[11], total_tokens=r[12], cost_usd=r[13],
        cost_diem=r[14], response_id=r[15], finish_reasons=list(r[16]), started_at=started_at,
        duration_ms=r[18], ttfb_ms=r[19], first_chunk_ms=r[20], max_gap_ms=r[21],
        attempts=r[22],
    )


def _as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


class PostgresStore:
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
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS},
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
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
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
            await conn.execute("SELECT 1 FROM schema_migrations LIMIT 1")

        await self._read(probe)

    async def close(self) -> None:
        if self._opened:
            await self.pool.close()
            self._opened = False

    async def insert_key(self, record: KeyRecord) -> None:
        async with self.connection() as conn:
            await conn.execute(
                f"INSERT INTO gateway_keys ({_KEY_COLUMNS}) VALUES ({', '.join(['%s'] * 13)})",
                (
                    uuid.UUID(record.id), record.subject_id, record.name, record.prefix,
                    record.key_hash, record.is_active, to_timestamp(record.revoked_at),
                    to_timestamp(record.expires_at), to_timestamp(record.created_at),
                    to_timestamp(record.last_used_at), record.rate_limit_requests,
                    record.rate_limit_window_seconds, list(record.allowed_models),
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

    async def write_usage(self, records: list[UsageRecord]) -> None:
        rows = [
            (
                r.request_id, uuid.UUID(r.key_id), r.subject_id, r.adapter, r.endpoint, r.model,
                r.upstream, r.stream, r.status, r.error_type, r.prompt_tokens,
                r.completion_tokens, r.total_tokens, r.cost_usd, r.cost_diem, r.response_id,
                list(r.finish_reasons), to_timestamp(r.started_at), r.duration_ms, r.ttfb_ms,
                r.first_chunk_ms, r.max_gap_ms, r.attempts,
            )
            for r in records
        ]
        async with self.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            # executemany pipelines the rows: one batch costs about one round trip.
            await cursor.executemany(
                f"INSERT INTO usage_records ({_USAGE_COLUMNS}) "
                f"VALUES ({', '.join(['%s'] * 23)}) ON CONFLICT (request_id) DO NOTHING",
                rows,
            )

    async def usage_records(self) -> list[UsageRecord]:
        """All records, oldest first: for tests, reports and the CLI."""
        async with self.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_USAGE_COLUMNS} FROM usage_records ORDER BY started_at"
            )
            rows = await cursor.fetchall()
        return [_row_to_usage(r) for r in rows]
