"""Rate limiting: the pure fixed-window arithmetic and the in-process limiter.

Windows are aligned to the Unix epoch (``floor(now / window) * window``) so that every
replica, and every backend, puts a request in the same window given the same clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LimitDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_after: float  # seconds until the current window ends

    def headers(self) -> list[tuple[str, str]]:
        """OpenAI's rate-limit headers, sent on every response."""
        headers = [
            ("x-ratelimit-limit-requests", str(self.limit)),
            ("x-ratelimit-remaining-requests", str(self.remaining)),
            ("x-ratelimit-reset-requests", format_reset(self.reset_after)),
        ]
        if not self.allowed:
            headers.append(("retry-after", str(max(1, math.ceil(self.reset_after)))))
        return headers


def format_reset(seconds: float) -> str:
    """OpenAI's duration style: '1m30s', '12s', '250ms'."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def window_start(now: float, window_seconds: int) -> float:
    return math.floor(now / window_seconds) * window_seconds


def decide(count_after: int, limit: int, now: float, window_seconds: int) -> LimitDecision:
    """The decision once this request has been counted as number ``count_after``."""
    reset_after = window_start(now, window_seconds) + window_seconds - now
    allowed = count_after <= limit
    return LimitDecision(allowed, limit, max(0, limit - count_after), reset_after)


class RateLimiter(Protocol):
    async def take(self, key_id: str, limit: int, window_seconds: int) -> LimitDecision: ...
    async def close(self) -> None: ...


class FixedWindowCounter:
    """In-process fixed windows. Pure: the caller supplies the time."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[float, int]] = {}

    def take(self, key: str, limit: int, window_seconds: int, now: float) -> LimitDecision:
        start = window_start(now, window_seconds)
        current_start, count = self._windows.get(key, (start, 0))
        if current_start != start:
            count = 0
            if len(self._windows) > 10_000:  # forget windows that have ended
                self._windows = {k: v for k, v in self._windows.items() if v[0] >= start}
        if count < limit:
            count += 1  # a refused request does not use up the window
            self._windows[key] = (start, count)
            return decide(count, limit, now, window_seconds)
        self._windows[key] = (start, count)
        return decide(count + 1, limit, now, window_seconds)


class MemoryRateLimiter:
    """One process's limits. Exact within the process: the event loop serialises take()."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counter = FixedWindowCounter()

    async def take(self, key_id: str, limit: int, window_seconds: int) -> LimitDecision:
        # A key's limits can change (keys rotate, operators edit them): count per setting.
        bucket = f"{key_id}:{limit}/{window_seconds}"
        return self._counter.take(bucket, limit, window_seconds, self._clock())

    async def close(self) -> None:
        return None
