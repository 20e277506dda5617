"""Usage records in SQLite: money as INTEGER counts of 1e-10 USD (exact, and SUM() too)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from llm_gateway.billing.records import USAGE_COLUMNS, UsageRecord
from llm_gateway.billing.refusals import REFUSAL_COLUMNS

_COLUMNS = ", ".join(USAGE_COLUMNS)
_ADD_REFUSALS = (
    f"INSERT INTO refusal_counts ({', '.join(REFUSAL_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (minute, key_id, subject_id, status, code) "
    "DO UPDATE SET requests = requests + excluded.requests")
MONEY_UNITS = Decimal(10) ** 10  # stored integers are this many per USD


def to_units(amount: Decimal | None) -> int | None:
    return None if amount is None else int((amount * MONEY_UNITS).to_integral_value())


def from_units(units: int | None) -> Decimal | None:
    return None if units is None else Decimal(units) / MONEY_UNITS


# How a record's field is kept in its column, where it is not kept as it is.
_TO_COLUMN: dict[str, Callable[[Any], Any]] = {
    "stream": int, "tokens_estimated": int, "finish_reasons": json.dumps, "tags": json.dumps,
    "cost_usd": to_units, "provider_cost_usd": to_units, "provider_cost_diem": to_units,
}


def _row(r: UsageRecord) -> tuple[Any, ...]:
    return tuple(_TO_COLUMN.get(name, _same)(getattr(r, name)) for name in USAGE_COLUMNS)


def _same(value: Any) -> Any:
    return value


def _record(row: tuple[Any, ...]) -> UsageRecord:
    values = dict(zip(USAGE_COLUMNS, row, strict=True))
    values.pop("ended_at")
    values["stream"] = bool(values["stream"])
    values["tokens_estimated"] = bool(values["tokens_estimated"])
    values["finish_reasons"] = json.loads(values["finish_reasons"])
    values["tags"] = json.loads(values["tags"])
    for name in ("cost_usd", "provider_cost_usd", "provider_cost_diem"):
        values[name] = from_units(values[name])
    return UsageRecord(**values)


class UsageSqliteMixin:
    """For SqliteStore: ``_run`` runs a function on its one connection's thread."""

    _run: Callable[..., Awaitable[Any]]

    async def write_usage(self, records: list[UsageRecord]) -> None:
        """Idempotent by request id: a record written twice (a replayed spool) is one row."""
        rows = [_row(r) for r in records]

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN")
            try:
                db.executemany(
                    f"INSERT OR IGNORE INTO usage_records ({_COLUMNS}) "
                    f"VALUES ({', '.join('?' * len(USAGE_COLUMNS))})", rows,
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._run(write)

    async def write_refusals(self, rows: list[tuple[Any, ...]]) -> None:
        """Refusal counts (REFUSAL_COLUMNS' rows), added to what the store holds."""

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN")
            try:
                db.executemany(_ADD_REFUSALS, rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._run(write)

    async def usage_records(self) -> list[UsageRecord]:
        """All records, oldest first: for tests and tools (reports aggregate in SQL)."""
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_COLUMNS} FROM usage_records ORDER BY started_at"
        ).fetchall())
        return [_record(row) for row in rows]

    async def usage_of(self, request_or_trace_id: str) -> list[UsageRecord]:
        """The records of a request id or a trace id (both indexed), oldest first."""
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_COLUMNS} FROM usage_records WHERE request_id = ? "
            f"UNION SELECT {_COLUMNS} FROM usage_records WHERE trace_id = ? "
            "ORDER BY started_at", (request_or_trace_id, request_or_trace_id)).fetchall())
        return [_record(row) for row in rows]

    async def usage_rows(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """A read-only query over usage records (the reports' SQL)."""
        return await self._run(lambda db: db.execute(sql, params).fetchall())  # type: ignore[no-any-return]

    async def drop_usage_before(self, day: date) -> str:
        """Retention: records of days before ``day`` (UTC) go; says how many, for the log."""
        cutoff = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        cursor = await self._run(lambda db: db.execute(
            "DELETE FROM usage_records WHERE started_at < ?", (cutoff,)))
        counted = await self._run(lambda db: db.execute(
            "DELETE FROM refusal_counts WHERE minute < ?", (cutoff,)))
        return f"{cursor.rowcount} records, {counted.rowcount} refusal counts"
