"""The writer that makes usage records durable without slowing requests.

Every admitted request produces exactly one UsageRecord (billing.records), whatever
happened to it. The writer batches them off the request path (one transaction per batch)
and keeps records that failed to write for the next attempt, so a store hiccup loses
nothing. It also applies the retention (``USAGE_RETENTION_DAYS``) at start and once a day,
and writes the counts of the requests refused before admission (billing.refusals), which
have no record, once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

from llm_gateway.billing.records import UsageRecord
from llm_gateway.billing.refusals import RefusalTally, bucket_row
from llm_gateway.billing.spool import Orphan, Spool
from llm_gateway.errors import Rejection
from llm_gateway.keys import KeyRecord

log = logging.getLogger("llm_gateway.billing")

RETENTION_INTERVAL_SECONDS = 86_400.0
# A retention pass that failed (the store did not answer) is tried again this much later.
RETENTION_RETRY_SECONDS = 3_600.0
# Refusal counts go to the store this often: under a flood of refusals one upsert per
# bucket a second, not one every pass of the writer.
REFUSALS_INTERVAL_SECONDS = 1.0


class UsageSink(Protocol):
    async def write_usage(self, records: list[UsageRecord]) -> None: ...


class UsageWriter:
    """Collects records and writes them in batches from one background task.

    With a spool, every record is on disk before it is queued (and every admitted request
    is, as it is admitted): what the database has not got survives an outage and a kill.
    Memory holds at most ``max_pending`` records; past that the spool alone holds them,
    and they are read back from it once the database answers again. A record the spool
    could not take (``Spool`` says why, once) stays in memory whatever the count: it is
    nowhere else.

    ``retention_days`` (0: keep all): the records of days before today minus that many
    are dropped at start and once a day, by the sink's ``drop_usage_before``.
    """

    # Every 50 ms: the gateway usually runs on one CPU, and a batch written every 200 ms
    # (some 300 records at full load) showed as a 2.5 ms p99 on requests; smaller batches
    # more often keep each pause short.
    def __init__(self, sink: UsageSink, spool: Spool | None = None, *, interval: float = 0.05,
                 batch_size: int = 500, max_pending: int = 20_000,
                 retention_days: int = 0) -> None:
        self._sink = sink
        self.spool = spool
        self.retention_days = retention_days
        self._retention_due = 0.0  # monotonic; 0: at the first pass of the writer
        self._interval = interval
        self._batch_size = batch_size
        self._max_pending = max_pending
        self._pending: list[tuple[UsageRecord, object]] = []
        self._overflowed = False  # some records are only in the spool
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.spooled = 0  # records the database could not take at first
        self.replayed = 0  # records written from the spool (outages, dead processes)
        self.refusals = RefusalTally()
        self._refusals_due = 0.0  # monotonic
        self._refusals_failing = False

    def check_spool(self) -> None:
        """At start-up: SpoolUnwritable (a ConfigError) when the spool cannot be written."""
        if self.spool is not None:
            self.spool.check()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def admitted(self, record: UsageRecord, reservation: dict[str, object] | None = None) -> None:
        if self.spool is not None:
            self.spool.admitted(record, reservation)

    def progress(self, request_id: str, facts: dict[str, object]) -> None:
        if self.spool is not None:
            self.spool.progress(request_id, facts)

    def refused(self, rejection: Rejection, key: KeyRecord | None,
                at: float | None = None) -> None:
        """Count a request refused before admission (written within a second)."""
        self.refusals.count(rejection, key, time.time() if at is None else at)

    def add(self, record: UsageRecord) -> None:
        segment = self.spool.finished(record) if self.spool is not None else None
        if len(self._pending) >= self._max_pending and segment is not None:
            self._overflowed = True  # on disk only, read back after the outage
            return
        self._pending.append((record, segment))
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    @property
    def pending(self) -> int:
        """Records the database does not have yet."""
        if self.spool is None:
            return len(self._pending)
        return self.spool.pending + sum(1 for _, segment in self._pending if segment is None)

    @property
    def spool_failures(self) -> int:
        """Lines the spool could not write (its records went on from memory only)."""
        return self.spool.failures if self.spool is not None else 0

    async def flush(self) -> None:
        """Write everything pending now; on failure the records stay pending."""
        try:
            await self._flush_records()
        finally:
            await self._write_refusals()

    async def _flush_records(self) -> None:
        async with self._lock:
            if self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._sink.write_usage([record for record, _ in batch])
                except Exception:
                    self.spooled += len(batch)
                    # What the spool holds may wait there; what it does not, only here.
                    spooled = [item for item in batch if item[1] is not None]
                    kept = [item for item in batch if item[1] is None] + spooled[:self._max_pending]
                    self._pending[:0] = kept
                    self._overflowed |= len(spooled) > self._max_pending
                    raise
                if self.spool is not None:
                    self.spool.written([segment for _, segment in batch])  # type: ignore[misc]
            if self._overflowed and self.spool is not None:
                await self._read_back()

    async def _write_refusals(self) -> None:
        """The refusals counted so far to the store; kept for the next pass if it fails."""
        self._refusals_due = time.monotonic() + REFUSALS_INTERVAL_SECONDS
        write = getattr(self._sink, "write_refusals", None)
        taken = self.refusals.take()
        if self.refusals.dropped:
            log.warning("%d refusals were not counted: %d counts waited for the store "
                        "already", self.refusals.dropped, self.refusals.max_buckets)
            self.refusals.dropped = 0
        if write is None or not taken:
            return
        try:
            await write([bucket_row(bucket, n) for bucket, n in taken.items()])
        except Exception as exc:  # kept in memory (bounded), written once the store answers
            self.refusals.give_back(taken)
            if not self._refusals_failing:
                log.warning("writing refusal counts failed, kept for retry: %s",
                            type(exc).__name__)
            self._refusals_failing = True
            return
        self._refusals_failing = False

    async def _read_back(self) -> None:
        assert self.spool is not None
        for segment, records in self.spool.own_unwritten():
            if records:
                await self._sink.write_usage(records)
                self.replayed += len(records)
            self.spool.all_written(segment)
        self._pending = [item for item in self._pending if item[1] is None]
        self._overflowed = False

    async def replay_orphans(
        self, account: Callable[[Orphan], Awaitable[None]] | None = None,
    ) -> int:
        """Write what dead processes left in the spool; returns how many records. Each
        goes through ``account`` first (the engine prices a record the kill cut short and
        settles what its request held on the ledger)."""
        if self.spool is None:
            return 0
        count = 0
        for path, orphans in self.spool.orphans():
            if account is not None:
                for orphan in orphans:
                    await account(orphan)
            records = [orphan.record for orphan in orphans]
            for start in range(0, len(records), self._batch_size):
                await self._sink.write_usage(records[start:start + self._batch_size])
            count += len(records)
            path.unlink(missing_ok=True)
        if count:
            log.warning("usage spool: %d records left by a stopped process were written", count)
        self.replayed += count
        return count

    async def apply_retention(self, today: date | None = None) -> str | None:
        """Drop the records of the days before ``today`` (UTC) minus ``retention_days``;
        says what went, once in the log. None: no retention, or a sink without it."""
        drop = getattr(self._sink, "drop_usage_before", None)
        if not self.retention_days or drop is None:
            return None
        today = today or datetime.now(UTC).date()
        before = today - timedelta(days=self.retention_days)
        dropped = str(await drop(before))
        log.info("usage retention (USAGE_RETENTION_DAYS=%d): dropped %s from before %s",
                 self.retention_days, dropped, before.isoformat())
        return dropped

    async def _retention_if_due(self) -> None:
        now = time.monotonic()
        if not self.retention_days or now < self._retention_due:
            return
        self._retention_due = now + RETENTION_INTERVAL_SECONDS
        try:
            await self.apply_retention()
        except Exception as exc:  # the store did not answer: the records wait for the next pass
            self._retention_due = now + RETENTION_RETRY_SECONDS
            log.warning("usage retention failed, tried again in %ds: %s",
                        int(RETENTION_RETRY_SECONDS), type(exc).__name__)

    async def _run(self) -> None:
        while True:
            await self._retention_if_due()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            try:
                await self._flush_records()
            except Exception as exc:  # kept, in memory and in the spool; the store may come back
                log.warning("usage write failed, %d records kept for retry: %s",
                            self.pending, type(exc).__name__)
            if time.monotonic() >= self._refusals_due:
                await self._write_refusals()

    async def close(self) -> None:
        if self._task is not None:
            # Never in the middle of a batch: a write cancelled there would leave its
            # records only in the spool (replayed at the next start, not in the database
            # when the process has stopped).
            async with self._lock:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.flush()
        finally:
            if self.spool is not None:
                self.spool.close()
