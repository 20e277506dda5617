"""The last reconciliation's drift per provider and model (migration 15): written by
``llm-gateway reconcile``, read by every gateway for /metrics. A run replaces its
provider's rows whole, so a model that no longer drifts (or is no longer used) leaves the
metric with the next run."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class DriftRow:
    provider: str
    model: str
    drift_ratio: float  # the model's worst relative drift, signed (provider minus gateway)
    within_tolerance: bool
    since: str  # the days reconciled, [since, until)
    until: str
    reconciled_at: float  # Unix seconds


_COLUMNS = "provider, model, drift_ratio, within_tolerance, since, until, reconciled_at"


def _rows(provider: str, drifts: Mapping[str, tuple[float, bool]], since: str, until: str,
          at: float) -> list[DriftRow]:
    return [DriftRow(provider, model, ratio, within, since, until, at)
            for model, (ratio, within) in sorted(drifts.items())]


class ReconcileSqliteMixin:
    _run: Callable[..., Awaitable[Any]]

    async def replace_reconcile_drift(self, provider: str,
                                      drifts: Mapping[str, tuple[float, bool]], *,
                                      since: str, until: str, at: float) -> None:
        rows = [(r.provider, r.model, r.drift_ratio, int(r.within_tolerance), r.since,
                 r.until, r.reconciled_at) for r in _rows(provider, drifts, since, until, at)]

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM reconcile_drift WHERE provider = ?", (provider,))
                db.executemany(f"INSERT INTO reconcile_drift ({_COLUMNS}) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._run(write)

    async def reconcile_drifts(self) -> list[DriftRow]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_COLUMNS} FROM reconcile_drift ORDER BY provider, model").fetchall())
        return [DriftRow(p, m, float(r), bool(w), s, u, float(at))
                for p, m, r, w, s, u, at in rows]


class ReconcilePostgresMixin:
    # A psycopg connection; not imported here, since a SQLite gateway must not load psycopg.
    connection: Callable[[], AbstractAsyncContextManager[Any]]

    async def replace_reconcile_drift(self, provider: str,
                                      drifts: Mapping[str, tuple[float, bool]], *,
                                      since: str, until: str, at: float) -> None:
        rows = [(r.provider, r.model, r.drift_ratio, r.within_tolerance,
                 date.fromisoformat(r.since), date.fromisoformat(r.until),
                 datetime.fromtimestamp(r.reconciled_at, UTC))
                for r in _rows(provider, drifts, since, until, at)]
        async with self.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            await cursor.execute("DELETE FROM reconcile_drift WHERE provider = %s", (provider,))
            await cursor.executemany(f"INSERT INTO reconcile_drift ({_COLUMNS}) "
                                     "VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)

    async def reconcile_drifts(self) -> list[DriftRow]:
        async with self.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_COLUMNS} FROM reconcile_drift ORDER BY provider, model")
            rows = await cursor.fetchall()
        return [DriftRow(p, m, float(r), bool(w), s.isoformat(), u.isoformat(), at.timestamp())
                for p, m, r, w, s, u, at in rows]
