"""Bulkheads: how many requests are open to each provider from this process, against its
``max_concurrency``. A full provider is skipped for the next target, never waited on."""

from __future__ import annotations


class Bulkhead:
    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def try_enter(self, provider: str, limit: int) -> bool:
        """Take a place (True), or say the provider is full (False). limit 0: no limit."""
        current = self._open.get(provider, 0)
        if limit and current >= limit:
            return False
        self._open[provider] = current + 1
        return True

    def leave(self, provider: str) -> None:
        self._open[provider] -= 1

    def in_flight(self, provider: str) -> int:
        return self._open.get(provider, 0)
