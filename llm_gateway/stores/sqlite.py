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

from llm_gateway.keys import KeyRecord
from llm_gateway.stores.admin_sqlite import AdminSqliteMixin
from llm_gateway.stores.migrations import MIGRATIONS
from llm_gateway.stores.reconcile_drift import ReconcileSqliteMixin
from llm_gateway.stores.usage_sqlite import UsageSqliteMixin

T = TypeVar("T")

_KEY_COLUMNS = (
    "id, subject_id, name, prefix, key_hash, is_active, revoked_at, expires_at, created_at, "
    "last_used_at, rate_limit_requests, rate_limit_window_seconds, allowed_models, "
    "rate_limit_burst"
)


def _row_to_key(row: tuple) -> KeyRecord:
    return KeyRecord(
        id=row[0], subject_id=row[1], name=row[2], prefix=row[3], key_hash=bytes(row[4]),
        is_active=bool(row[5]), revoked_at=row[6], expires_at=row[7], created_at=row[8],
        last_used_at=row[9], rate_limit_requests=row[10], rate_limit_window_seconds=row[11],
        allowed_models=tuple(json.loads(row[12])), rate_limit_burst=row[13],
    )


class SqliteStore(UsageSqliteMixin, AdminSqliteMixin, ReconcileSqliteMixin):
    dialect = "sqlite"

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
            json.dumps(list(record.allowed_models)), record.rate_limit_burst,
        )
        await self._run(lambda db: db.execute(
            f"INSERT INTO gateway_keys ({_KEY_COLUMNS}) VALUES ({', '.join('?' * 14)})", values
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
