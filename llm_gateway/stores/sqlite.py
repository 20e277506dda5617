"""SQLite store: the embedded default. One connection, used from one worker thread."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.keys import KeyRecord
from llm_gateway.stores.migrations import MIGRATIONS

T = TypeVar("T")

_KEY_COLUMNS = (
    "id, subject_id, name, prefix, key_hash, is_active, revoked_at, expires_at, created_at, "
    "last_used_at, rate_limit_requests, rate_limit_window_seconds, allowed_models"
)


def _row_to_key(row: tuple) -> KeyRecord:
    return KeyRecord(
        id=row[0], subject_id=row[1], name=row[2], prefix=row[3], key_hash=bytes(row[4]),
        is_active=bool(row[5]), revoked_at=row[6], expires_at=row[7], created_at=row[8],
        last_used_at=row[9], rate_limit_requests=row[10], rate_limit_window_seconds=row[11],
        allowed_models=tuple(json.loads(row[12])),
    )


class SqliteStore:
    def __init__(self, path: str) -> None:
        self.path = path
        # A single thread owns the connection: SQLite serialises writers anyway, and
        # this keeps the event loop free of blocking calls.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._connection: sqlite3.Connection | None = None

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        # sqlite:///relative.db, sqlite:////absolute/path.db, sqlite:///:memory:
        path = url.removeprefix("sqlite://")
        path = path.removeprefix("/") if not path.startswith("//") else path[1:]
        return cls(path or "llm-gateway.db")

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute("PRAGMA busy_timeout=5000")
            self._connection = connection
        return self._connection

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: work(self._connect()))

    async def migrate(self) -> list[int]:
        def apply(db: sqlite3.Connection) -> list[int]:
            db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {row[0] for row in db.execute("SELECT version FROM schema_migrations")}
            applied = []
            for migration in MIGRATIONS:
                if migration.version in done:
                    continue
                db.execute("BEGIN IMMEDIATE")
                try:
                    # Re-check inside the write lock: another process may have migrated.
                    if db.execute("SELECT 1 FROM schema_migrations WHERE version = ?",
                                  (migration.version,)).fetchone():
                        db.execute("COMMIT")
                        continue
                    for statement in migration.sqlite.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute(
                        "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                        (migration.version, migration.description, time.time()),
                    )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                applied.append(migration.version)
            return applied

        return await self._run(apply)

    async def ping(self) -> None:
        await self._run(lambda db: db.execute("SELECT 1 FROM schema_migrations LIMIT 1").fetchall())

    async def close(self) -> None:
        def close(db: sqlite3.Connection) -> None:
            db.close()

        if self._connection is not None:
            await self._run(close)
            self._connection = None
        self._executor.shutdown(wait=True)

    async def insert_key(self, record: KeyRecord) -> None:
        values = (
            record.id, record.subject_id, record.name, record.prefix, record.key_hash,
            int(record.is_active), record.revoked_at, record.expires_at, record.created_at,
            record.last_used_at, record.rate_limit_requests, record.rate_limit_window_seconds,
            json.dumps(list(record.allowed_models)),
        )
        await self._run(lambda db: db.execute(
            f"INSERT INTO gateway_keys ({_KEY_COLUMNS}) VALUES ({', '.join('?' * 13)})", values
        ))

    async def key_by_prefix(self, prefix: str) -> KeyRecord | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_KEY_COLUMNS} FROM gateway_keys WHERE prefix = ?", (prefix,)
        ).fetchone())
        return _row_to_key(row) if row else None

    async def find_key(self, prefix_or_id: str) -> KeyRecord | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_KEY_COLUMNS} FROM gateway_keys WHERE prefix = ? OR id = ?",
            (prefix_or_id[:12], prefix_or_id),
        ).fetchone())
        return _row_to_key(row) if row else None

    async def list_keys(self) -> list[KeyRecord]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_KEY_COLUMNS} FROM gateway_keys ORDER BY created_at"
        ).fetchall())
        return [_row_to_key(row) for row in rows]

    async def revoke_key(self, key_id: str, now: float) -> bool:
        cursor = await self._run(lambda db: db.execute(
            "UPDATE gateway_keys SET is_active = 0, revoked_at = ? "
            "WHERE id = ? AND revoked_at IS NULL", (now, key_id),
        ))
        return cursor.rowcount == 1

    async def touch_keys(self, last_used: dict[str, float]) -> None:
        items = [(ts, key_id) for key_id, ts in last_used.items()]
        await self._run(lambda db: db.executemany(
            "UPDATE gateway_keys SET last_used_at = max(coalesce(last_used_at, 0), ?) "
            "WHERE id = ?", items,
        ))

    async def write_usage(self, records: list[UsageRecord]) -> None:
        rows = [
            (
                r.request_id, r.key_id, r.subject_id, r.adapter, r.endpoint, r.model, r.upstream,
                int(r.stream), r.status, r.error_type, r.prompt_tokens, r.completion_tokens,
                r.total_tokens, r.cost_usd, r.cost_diem, r.response_id,
                json.dumps(r.finish_reasons), r.started_at, r.duration_ms, r.ttfb_ms,
                r.first_chunk_ms, r.max_gap_ms, r.attempts,
            )
            for r in records
        ]

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN")
            try:
                db.executemany(
                    f"INSERT OR IGNORE INTO usage_records ({_USAGE_COLUMNS}) "
                    f"VALUES ({', '.join('?' * 23)})", rows,
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._run(write)

    async def usage_records(self) -> list[UsageRecord]:
        """All records, oldest first: for tests, reports and the CLI."""
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_USAGE_COLUMNS} FROM usage_records ORDER BY started_at"
        ).fetchall())
        return [
            UsageRecord(
                request_id=r[0], key_id=r[1], subject_id=r[2], adapter=r[3], endpoint=r[4],
                model=r[5], upstream=r[6], stream=bool(r[7]), status=r[8], error_type=r[9],
                prompt_tokens=r[10], completion_tokens=r[11], total_tokens=r[12],
                cost_usd=r[13], cost_diem=r[14], response_id=r[15],
                finish_reasons=json.loads(r[16]), started_at=r[17], duration_ms=r[18],
                ttfb_ms=r[19], first_chunk_ms=r[20], max_gap_ms=r[21], attempts=r[22],
            )
            for r in rows
        ]


_USAGE_COLUMNS = (
    "request_id, key_id, subject_id, adapter, endpoint, model, upstream, stream, status, "
    "error_type, prompt_tokens, completion_tokens, total_tokens, cost_usd, cost_diem, "
    "response_id, finish_reasons, started_at, duration_ms, ttfb_ms, first_chunk_ms, "
    "max_gap_ms, attempts"
)
