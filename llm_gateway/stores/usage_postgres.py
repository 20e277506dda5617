"""Usage records in Postgres: partitioned by day (UTC), created ahead by the writer (and
``llm-gateway usage partitions``), dropped whole by retention."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from llm_gateway.billing.records import USAGE_COLUMNS, UsageRecord
from llm_gateway.billing.refusals import REFUSAL_COLUMNS

_COLUMNS = ", ".join(USAGE_COLUMNS)
_ADD_REFUSALS = (
    f"INSERT INTO refusal_counts ({', '.join(REFUSAL_COLUMNS)}) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (minute, key_id, subject_id, status, code) "
    "DO UPDATE SET requests = refusal_counts.requests + EXCLUDED.requests")
PARTITION_PREFIX = "usage_records_p"


def _moment(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def utc_day(seconds: float) -> date:
    return _moment(seconds).date()


def partition_name(day: date) -> str:
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


# How a record's field is kept in its column, where it is not kept as it is.
_TO_COLUMN: dict[str, Callable[[Any], Any]] = {
    "started_at": _moment, "ended_at": _moment, "finish_reasons": list, "tags": Jsonb,
}


def _row(r: UsageRecord) -> tuple[Any, ...]:
    return tuple(_TO_COLUMN.get(name, _same)(getattr(r, name)) for name in USAGE_COLUMNS)


def _same(value: Any) -> Any:
    return value


def _record(row: tuple[Any, ...]) -> UsageRecord:
    values = dict(zip(USAGE_COLUMNS, row, strict=True))
    values.pop("ended_at")
    values["started_at"] = values["started_at"].timestamp()
    values["finish_reasons"] = list(values["finish_reasons"])
    for name in ("cost_usd", "provider_cost_usd", "provider_cost_diem"):
        if values[name] is not None:
            values[name] = Decimal(values[name])
    return UsageRecord(**values)


class UsagePostgresMixin:
    """For PostgresStore: ``connection()`` lends a pooled connection."""

    connection: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]
    _known_partitions: set[date]

    async def write_usage(self, records: list[UsageRecord]) -> None:
        """Idempotent by (request id, start): a replayed record is one row."""
        await self.ensure_usage_partitions(utc_day(r.started_at) for r in records)
        rows = [_row(r) for r in records]
        async with self.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            # executemany pipelines the rows: one batch costs about one round trip.
            await cursor.executemany(
                f"INSERT INTO usage_records ({_COLUMNS}) "
                f"VALUES ({', '.join(['%s'] * len(USAGE_COLUMNS))}) "
                "ON CONFLICT (request_id, started_at) DO NOTHING",
                rows,
            )

    async def write_refusals(self, rows: list[tuple[Any, ...]]) -> None:
        """Refusal counts (REFUSAL_COLUMNS' rows), added to what the store holds: one
        upsert per row, so that replicas writing the same minute add up."""
        # In one order on every replica: two batches locking the same rows never deadlock.
        rows = [(_moment(row[0]), *row[1:]) for row in sorted(rows)]
        async with self.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            await cursor.executemany(_ADD_REFUSALS, rows)

    async def ensure_usage_partitions(self, days: Iterable[date]) -> list[str]:
        """Create the day partitions that do not exist yet; returns those created."""
        known = self.__dict__.setdefault("_known_partitions", set())
        created = []
        for day in sorted(set(days) - known):
            name = partition_name(day)
            start, end = (datetime(d.year, d.month, d.day, tzinfo=UTC)
                          for d in (day, day + timedelta(days=1)))
            try:
                async with self.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT to_regclass(%s) IS NULL", (name,))
                    missing = (await cursor.fetchone() or (True,))[0]
                    if missing:
                        # DDL takes no parameters; the bounds come from a date, not input.
                        await conn.execute(
                            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF usage_records "
                            f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')")
                        created.append(name)
            except (psycopg.errors.DuplicateTable, psycopg.errors.UniqueViolation):
                pass  # another replica created it at the same moment
            known.add(day)
        return created

    async def usage_partitions(self) -> list[date]:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'usage_records'::regclass ORDER BY c.relname")
            rows = await cursor.fetchall()
        return [datetime.strptime(row[0].removeprefix(PARTITION_PREFIX), "%Y%m%d").date()
                for row in rows if row[0].startswith(PARTITION_PREFIX)]

    async def drop_usage_partitions_before(self, day: date) -> list[str]:
        """Retention: whole days older than ``day`` go, as whole partitions."""
        dropped = []
        for partition in await self.usage_partitions():
            if partition < day:
                name = partition_name(partition)
                async with self.connection() as conn:
                    await conn.execute(f"DROP TABLE IF EXISTS {name}")
                dropped.append(name)
                self.__dict__.setdefault("_known_partitions", set()).discard(partition)
        return dropped

    async def drop_usage_before(self, day: date) -> str:
        """Retention: whole day partitions before ``day`` go; says which, for the log."""
        dropped = await self.drop_usage_partitions_before(day)
        async with self.connection() as conn:
            counted = await conn.execute("DELETE FROM refusal_counts WHERE minute < %s",
                                         (datetime(day.year, day.month, day.day, tzinfo=UTC),))
        return (f"{len(dropped)} day partitions ({', '.join(dropped) or 'none'}), "
                f"{counted.rowcount} refusal counts")

    async def usage_records(self) -> list[UsageRecord]:
        """All records, oldest first: for tests and tools (reports aggregate in SQL)."""
        async with self.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_COLUMNS} FROM usage_records ORDER BY started_at")
            rows = await cursor.fetchall()
        return [_record(row) for row in rows]

    async def usage_of(self, request_or_trace_id: str) -> list[UsageRecord]:
        """The records of a request id or a trace id (both indexed, on every partition),
        oldest first."""
        async with self.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_COLUMNS} FROM usage_records WHERE request_id = %s "
                f"OR trace_id = %s ORDER BY started_at",
                (request_or_trace_id, request_or_trace_id))
            rows = await cursor.fetchall()
        return [_record(row) for row in rows]

    async def usage_rows(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """A read-only query over usage records (the reports' SQL), which may take longer
        than the pool's statement limit."""
        async with self.connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 60000")
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall()


