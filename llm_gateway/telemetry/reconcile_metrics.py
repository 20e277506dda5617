"""The last reconciliation against each provider's bill, on /metrics: ``llm-gateway
reconcile`` runs as a CronJob, not in a gateway, so what it found is kept in the database
(``reconcile_drift``) and every gateway exports it from there.

A scrape never waits for the database: it shows what the last read found, and starts the
next read (on the serving loop) once that is ``READ_EVERY`` seconds old; the first scrape
after a start shows the families empty. Label values are checked as the reconcile command
checked them when it wrote them (``is_metric_label``); a row that fails is not shown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from llm_gateway.billing.reconcile import is_metric_label

READ_EVERY = 60.0
log = logging.getLogger("llm_gateway")


class ReconcileDriftCollector:
    def __init__(self, read: Callable[[], Awaitable[Sequence[Any]]], *,
                 every: float = READ_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._every = every
        self._clock = clock
        self._rows: Sequence[Any] = ()
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self._read_if_stale()
        drift = GaugeMetricFamily(
            "llm_gateway_reconcile_drift_ratio",
            "The last reconciliation's worst relative drift of each model against the "
            "provider's own bill (provider minus gateway, over the gateway's figure)",
            labels=["provider", "model"])
        last = GaugeMetricFamily(
            "llm_gateway_reconcile_last_run_timestamp_seconds",
            "When each provider was last reconciled (Unix seconds)", labels=["provider"])
        runs: dict[str, float] = {}
        for row in self._rows:
            if is_metric_label(row.provider) and is_metric_label(row.model):
                drift.add_metric([row.provider, row.model], row.drift_ratio)
                runs[row.provider] = max(runs.get(row.provider, 0.0), row.reconciled_at)
        for provider, at in sorted(runs.items()):
            last.add_metric([provider], at)
        yield drift
        yield last

    def _read_if_stale(self) -> None:
        if self._reading is not None and not self._reading.done():
            return
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._every:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # scraped off the serving loop (a test's registry): nothing to read with
        self._read_at = now
        self._reading = loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            self._rows = list(await self._read())
        except Exception as exc:  # the last rows stay; the next stale scrape tries again
            log.warning("reading the reconciliation drift failed: %s", type(exc).__name__)
