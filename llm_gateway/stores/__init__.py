"""Stores for keys and usage records: SQLite (embedded default) and Postgres."""

from __future__ import annotations

from typing import Protocol

from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import is_postgres_url
from llm_gateway.extras import need
from llm_gateway.keys import KeyRecord


class StoreUnavailable(Exception):
    """The store did not answer (connection refused or lost, pool exhausted, timeout).

    Callers apply their failure policy to this, and only to this: any other error is a
    bug or a constraint and must surface as one.
    """


class Store(Protocol):
    async def migrate(self) -> list[int]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def insert_key(self, record: KeyRecord) -> None: ...
    async def key_by_prefix(self, prefix: str) -> KeyRecord | None: ...
    async def find_key(self, prefix_or_id: str) -> KeyRecord | None: ...
    async def list_keys(self) -> list[KeyRecord]: ...
    async def revoke_key(self, key_id: str, now: float) -> bool: ...
    async def touch_keys(self, last_used: dict[str, float]) -> None: ...
    async def write_usage(self, records: list[UsageRecord]) -> None: ...
    async def usage_records(self) -> list[UsageRecord]: ...
    async def usage_of(self, request_or_trace_id: str) -> list[UsageRecord]: ...


def open_store(database_url: str) -> Store:
    """The store a DATABASE_URL names."""
    if database_url.startswith("sqlite:"):
        from llm_gateway.stores.sqlite import SqliteStore

        return SqliteStore.from_url(database_url)
    if is_postgres_url(database_url):
        need("postgres")
        from llm_gateway.stores.postgres import PostgresStore

        return PostgresStore(database_url)
    raise ValueError(f"unsupported DATABASE_URL scheme: {database_url.split(':', 1)[0]}")
