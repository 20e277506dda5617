"""Rate limiting: the pure fixed-window arithmetic, the in-process limiter, and the
failure policy that wraps a shared one.

Windows are aligned to the Unix epoch (``floor(now / window) * window``) so that every
replica, and every backend, puts a request in the same window given the same clock.
Every backend (memory, Redis, Postgres) implements the same fixed window, so a key's
"N requests per window" means the same thing whichever backend counts it, including
the in-process fallback while a shared backend is down. The shared backends read the
time from their server, never from a replica's own clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llm_gateway.outage import Outage


@dataclass(frozen=True, slots=True)
class Guard:
    """A second window, looked at and never counted, in the same atomic call: when it is
    full the request is refused and counts nothing. The engine's use: a key's budget of
    failed upstream requests, checked on every request at no extra round trip."""

    key_id: str
    limit: int
    window_seconds: int


@dataclass(frozen=True, slots=True)
class LimitDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_after: float  # seconds until the current window ends (the guard's, if guarded)
    guarded: bool = False  # refused because the guard's window is full
    leased: bool = False  # decided in this process from a lease, not by the backend

    def headers(self) -> list[tuple[str, str]]:
        """OpenAI's rate-limit headers, sent on every response."""
        headers = [
            ("x-ratelimit-limit-requests", str(self.limit)),
            ("x-ratelimit-remaining-requests", str(self.remaining)),
            ("x-ratelimit-reset-requests", format_reset(self.reset_after)),
        ]
        if not self.allowed:
            headers.append(("retry-after", str(self.retry_after())))
        return headers

    def retry_after(self) -> int:
        """Whole seconds until the window ends (at least 1), for Retry-After."""
        return max(1, math.ceil(self.reset_after))


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


def count_in_window(count: int, limit: int, cost: int, now: float,
                    window_seconds: int) -> tuple[int, LimitDecision]:
    """One more request of ``cost`` against a window that has counted ``count``: the
    window's count after it (a refused request does not use up the window) and the
    decision. The rule every counting backend in this process (memory, SQLite) applies."""
    if count < limit:
        count += cost
        return count, decide(max(count, 1), limit, now, window_seconds)
    return count, decide(count + 1, limit, now, window_seconds)


def guarded(guard: Guard, reset_after: float) -> LimitDecision:
    return LimitDecision(False, guard.limit, 0, reset_after, guarded=True)


@dataclass(frozen=True, slots=True)
class Granted:
    """A backend's answer to a lease (llm_gateway.leases): ``amount`` counted in the
    window at once (0: no such room, or the guard is full), the window's count after it
    (when granted), the time to its end, and its start on the backend's clock (what
    ``give_back`` names)."""

    amount: int
    count: int
    reset_after: float
    window: float


def lease_in_window(count: int, limit: int, amount: int) -> int:
    """A lease of ``amount`` against a window that has counted ``count``: all of it while
    it fits under the limit, else nothing (a request may be admitted past the limit's last
    unit, a lease never). The rule every leasing backend applies."""
    return amount if count + amount <= limit else 0


def bucket_name(key_id: str, limit: int, window_seconds: int) -> str:
    """A key's limits can change (keys rotate, operators edit them): count per setting."""
    return f"{key_id}:{limit}/{window_seconds}"


class RateLimiter(Protocol):
    backend: str
    # The backend's health as this process sees it; None for a limiter with nothing
    # shared to lose (in process).
    outage: Outage | None

    async def take(self, key_id: str, limit: int, window_seconds: int,
                   cost: int = 1, guard: Guard | None = None) -> LimitDecision:
        """Count ``cost`` against the window and decide. ``cost=0`` only looks: allowed
        while the window is not full. A refused request counts nothing."""
        ...

    async def check(self) -> bool:
        """Ask the backend now (for /readyz); True when it answers."""
        ...
    async def close(self) -> None: ...


class LeasingLimiter(Protocol):
    """A shared limiter that grants leases: room counted ahead of time, spent in the
    process that holds it, the rest given back (``limits.leased`` uses them)."""

    backend: str

    async def take(self, key_id: str, limit: int, window_seconds: int,
                   cost: int = 1, guard: Guard | None = None) -> LimitDecision: ...

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None) -> Granted:
        """Count ``amount`` now if it fits under the limit (and the guard has room)."""
        ...

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float) -> None:
        """Uncount ``amount`` of a lease, if its window (``Granted.window``) still runs."""
        ...

    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class LimiterUnavailable(Exception):
    """A shared limiter's backend did not answer; the failure policy decides what next."""

    def __init__(self, backend: str, cause: BaseException | None = None) -> None:
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{backend} did not answer{detail}")
        self.backend = backend


class SharedRateLimiter(RateLimiter, Protocol):
    """A limiter whose state lives in a backend every replica shares."""

    backend: str

    async def ping(self) -> None: ...


class FixedWindowCounter:
    """In-process fixed windows. Pure: the caller supplies the time."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[float, int]] = {}

    def take(self, key: str, limit: int, window_seconds: int, now: float,
             cost: int = 1) -> LimitDecision:
        start = window_start(now, window_seconds)
        current_start, count = self._windows.get(key, (start, 0))
        if current_start != start:
            count = 0
            if len(self._windows) > 10_000:  # forget windows that have ended
                self._windows = {k: v for k, v in self._windows.items() if v[0] >= start}
        count, decision = count_in_window(count, limit, cost, now, window_seconds)
        self._windows[key] = (start, count)
        return decision

    def lease(self, key: str, limit: int, window_seconds: int, now: float,
              amount: int) -> Granted:
        start = window_start(now, window_seconds)
        current_start, count = self._windows.get(key, (start, 0))
        count = count if current_start == start else 0
        granted = lease_in_window(count, limit, amount)
        if granted:
            self._windows[key] = (start, count + granted)
        return Granted(granted, count + granted, start + window_seconds - now, start)

    def give_back(self, key: str, amount: int, window: float) -> None:
        current = self._windows.get(key)
        if current is not None and current[0] == window:
            self._windows[key] = (window, max(0, current[1] - amount))


class MemoryRateLimiter:
    """One process's limits. Exact within the process: the event loop serialises take()."""

    backend = "memory"
    outage = None

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counter = FixedWindowCounter()

    async def take(self, key_id: str, limit: int, window_seconds: int,
                   cost: int = 1, guard: Guard | None = None) -> LimitDecision:
        now = self._clock()
        if guard is not None and (full := self._guard_full(guard, now)) is not None:
            return full
        bucket = bucket_name(key_id, limit, window_seconds)
        return self._counter.take(bucket, limit, window_seconds, now, cost)

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None) -> Granted:
        now = self._clock()
        if guard is not None and (full := self._guard_full(guard, now)) is not None:
            return Granted(0, 0, full.reset_after, window_start(now, window_seconds))
        return self._counter.lease(bucket_name(key_id, limit, window_seconds), limit,
                                   window_seconds, now, amount)

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float) -> None:
        self._counter.give_back(bucket_name(key_id, limit, window_seconds), amount, window)

    async def ping(self) -> None:
        return None

    def _guard_full(self, guard: Guard, now: float) -> LimitDecision | None:
        looked = self._counter.take(
            bucket_name(guard.key_id, guard.limit, guard.window_seconds), guard.limit,
            guard.window_seconds, now, cost=0)
        return None if looked.allowed else guarded(guard, looked.reset_after)

    async def check(self) -> bool:
        return True

    async def close(self) -> None:
        return None
