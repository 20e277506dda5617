"""A record sink for tests and tools: every finished request's usage record, as it
finishes (``gateway.add_record_sink(sink)``), before the writer has made it durable."""

from __future__ import annotations

import threading
import time

from llm_gateway.billing.metering import UsageRecord


class RecordedUsage:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self._changed = threading.Condition()

    def __call__(self, record: UsageRecord, exchange: object) -> None:
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[UsageRecord]:
        """The records once at least ``count`` have finished (from any thread); raises
        AssertionError when they do not within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.records) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{len(self.records)} usage records finished, expected {count}"
                    )
                self._changed.wait(remaining)
            return list(self.records)
