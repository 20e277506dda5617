"""Rate limiting: the pure arithmetic of its two kinds of limit, and the in-process limiter.

A limit of N requests per W seconds is counted one of two ways, named per call:

- **A fixed window** (no ``burst``): windows aligned to the Unix epoch
  (``floor(now / window) * window``), so that every replica, and every backend, puts a
  request in the same window given the same clock; N admitted per window. A key may send
  N at the end of one window and N more at the start of the next: 2N within a moment.
- **A token bucket** (``burst`` given): ``burst`` tokens, refilled continuously at N / W
  per second (llm_gateway.buckets), full at first; a request takes its cost when the
  bucket holds it. Over any span of S seconds at most ``burst + N * S / W`` are admitted,
  whichever window edges it crosses.

The engine counts a key's (or a JWT subject's) requests the way ``RATE_LIMIT_ALGORITHM``
says (``request_burst``); a key's budget of failed upstream requests (its ``Guard``) and
a provider's windows are fixed windows. Every backend (memory, Redis, Postgres, the
workers' file) implements both the same way, so "N requests per window" means the same
thing whichever backend counts it, including the in-process fallback while a shared
backend is down. The shared backends read the time from their server, never from a
replica's own clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llm_gateway.buckets import refill, seconds_until
from llm_gateway.config import RateLimitAlgorithm
from llm_gateway.keys import KeyRecord
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
    # Seconds until the limit is back to its initial state (OpenAI's meaning of
    # x-ratelimit-reset-requests): a window's end (the guard's, if guarded), a bucket full.
    reset_after: float
    guarded: bool = False  # refused because the guard's window is full
    leased: bool = False  # decided in this process from a lease, not by the backend
    # A bucket's: when a refused request would fit (None: at the reset), and its burst
    # (what is permitted from full; None: the limit, as a window's).
    retry_in: float | None = None
    capacity: int | None = None

    def headers(self) -> list[tuple[str, str]]:
        """OpenAI's rate-limit headers, sent on every response."""
        headers = [
            ("x-ratelimit-limit-requests", str(self.capacity or self.limit)),
            ("x-ratelimit-remaining-requests", str(self.remaining)),
            ("x-ratelimit-reset-requests", format_reset(self.reset_after)),
        ]
        if not self.allowed:
            headers.append(("retry-after", str(self.retry_after())))
        return headers

    def retry_after(self) -> int:
        """Whole seconds (at least 1) until a refused request would be admitted: the
        window's end, the bucket's next token; for Retry-After."""
        wait = self.reset_after if self.retry_in is None else self.retry_in
        return max(1, math.ceil(wait))


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


def request_burst(algorithm: RateLimitAlgorithm, key: KeyRecord) -> int | None:
    """How a key's (or subject's) request limit is counted under ``algorithm``: its
    bucket's capacity (the key's burst, else its limit), or None for the fixed window."""
    if algorithm is RateLimitAlgorithm.FIXED_WINDOW:
        return None
    return key.rate_limit_burst or key.rate_limit_requests


def bucket_rate(limit: int, window_seconds: int) -> float:
    """A bucket's refill: ``limit`` tokens per ``window_seconds`` (every backend divides
    the same two integers, so all refill alike)."""
    return limit / window_seconds


def take_from_bucket(state: tuple[float, float] | None, now: float, limit: int,
                     window_seconds: int, burst: int, cost: int,
                     need: int | None = None) -> tuple[tuple[float, float] | None, float, bool]:
    """One call on a bucket last written as ``state`` (tokens, at; None: never, or gone:
    full): ``cost`` taken when it holds ``need`` (by default the cost, and one token for
    a look, ``cost`` 0, which takes nothing); a negative ``cost`` (need 0) gives back.
    Returns the state to write (None: unchanged), the level after, and whether granted.
    The rule the Redis script and the Postgres statement spell too."""
    level = float(burst) if state is None else refill(
        state[0], state[1], now, burst, bucket_rate(limit, window_seconds))
    need = max(1, cost) if need is None else need
    if level < need:
        return None, level, False
    if cost == 0:
        return None, level, True
    level = min(float(burst), level - cost)
    return (level, now if state is None else max(state[1], now)), level, True


def bucket_decision(limit: int, window_seconds: int, burst: int, level: float,
                    allowed: bool, need: int = 1) -> LimitDecision:
    """The decision of a bucket left at ``level`` by a request that needed ``need``:
    remaining are its whole tokens, reset is until it is full, a refusal retries once
    it holds ``need``. (A refused request's level is below what it needed; a backend
    that read it apart from the refusal may see more, never shown.)"""
    rate = bucket_rate(limit, window_seconds)
    remaining = math.floor(level) if allowed else min(math.floor(level), need - 1)
    return LimitDecision(allowed, limit, max(0, remaining), seconds_until(level, burst, rate),
                         retry_in=None if allowed else seconds_until(level, need, rate),
                         capacity=burst)


@dataclass(frozen=True, slots=True)
class Granted:
    """A backend's answer to a lease (llm_gateway.leases): ``amount`` counted in the
    window at once (0: no such room, or the guard is full), the window's count after it
    (when granted), the time to its end, and its start on the backend's clock (what
    ``give_back`` names). A bucket's: its tokens taken at once, what its burst has in use
    (``burst`` less its whole tokens left), no end (a bucket has no window; the lease's
    own period bounds it) and no start (0)."""

    amount: int
    count: int
    reset_after: float
    window: float


def bucket_granted(granted: bool, amount: int, level: float, burst: int) -> Granted:
    return Granted(amount if granted else 0, burst - math.floor(level), math.inf, 0.0)


def lease_in_window(count: int, limit: int, amount: int) -> int:
    """A lease of ``amount`` against a window that has counted ``count``: all of it while
    it fits under the limit, else nothing (a request may be admitted past the limit's last
    unit, a lease never). The rule every leasing backend applies."""
    return amount if count + amount <= limit else 0


def bucket_name(key_id: str, limit: int, window_seconds: int, burst: int | None = None) -> str:
    """A key's limits can change (keys rotate, operators edit them): count per setting
    (a token bucket's, with its burst, apart from a window's)."""
    suffix = "" if burst is None else f"~{burst}"
    return f"{key_id}:{limit}/{window_seconds}{suffix}"


class RateLimiter(Protocol):
    backend: str
    # The backend's health as this process sees it; None for a limiter with nothing
    # shared to lose (in process).
    outage: Outage | None

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        """Count ``cost`` against the window (with a ``burst``: take it from the bucket)
        and decide. ``cost=0`` only looks: allowed while the window is not full (the
        bucket holds a token). A refused request counts nothing."""
        ...

    async def check(self) -> bool:
        """Ask the backend now (for /readyz); True when it answers."""
        ...
    async def close(self) -> None: ...


class LeasingLimiter(Protocol):
    """A shared limiter that grants leases: room counted ahead of time, spent in the
    process that holds it, the rest given back (``limits.leased`` uses them)."""

    backend: str

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision: ...

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None, burst: int | None = None) -> Granted:
        """Count ``amount`` now if it fits under the limit (and the guard has room); with
        a ``burst``, take it from the bucket if it holds that many."""
        ...

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float, burst: int | None = None) -> None:
        """Uncount ``amount`` of a lease, if its window (``Granted.window``) still runs;
        a bucket's go back into it (up to its burst)."""
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


class TokenBuckets:
    """In-process token buckets (``take_from_bucket``). Pure: the caller supplies the time."""

    def __init__(self) -> None:
        # name -> (tokens, at, when it is full again: then it may be forgotten)
        self._buckets: dict[str, tuple[float, float, float]] = {}

    def take(self, name: str, limit: int, window_seconds: int, burst: int, now: float,
             cost: int, need: int | None = None) -> tuple[float, bool]:
        """``take_from_bucket`` on the bucket ``name``: its level after, and whether granted."""
        held = self._buckets.get(name)
        state, level, granted = take_from_bucket(
            None if held is None else held[:2], now, limit, window_seconds, burst, cost, need)
        if state is not None:
            if len(self._buckets) > 10_000:  # forget buckets full again (as if never used)
                self._buckets = {k: v for k, v in self._buckets.items() if v[2] > now}
            full_at = state[1] + seconds_until(state[0], burst, bucket_rate(limit, window_seconds))
            self._buckets[name] = (*state, full_at)
        return level, granted


class MemoryRateLimiter:
    """One process's limits. Exact within the process: the event loop serialises take()."""

    backend = "memory"
    outage = None

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counter = FixedWindowCounter()
        self._buckets = TokenBuckets()

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        now = self._clock()
        if guard is not None and (full := self._guard_full(guard, now)) is not None:
            return full
        name = bucket_name(key_id, limit, window_seconds, burst)
        if burst is None:
            return self._counter.take(name, limit, window_seconds, now, cost)
        level, granted = self._buckets.take(name, limit, window_seconds, burst, now, cost)
        return bucket_decision(limit, window_seconds, burst, level, granted, max(1, cost))

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None, burst: int | None = None) -> Granted:
        now = self._clock()
        if guard is not None and (full := self._guard_full(guard, now)) is not None:
            start = window_start(now, window_seconds) if burst is None else 0.0
            return Granted(0, 0, full.reset_after, start)
        name = bucket_name(key_id, limit, window_seconds, burst)
        if burst is None:
            return self._counter.lease(name, limit, window_seconds, now, amount)
        level, granted = self._buckets.take(name, limit, window_seconds, burst, now, amount)
        return bucket_granted(granted, amount, level, burst)

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float, burst: int | None = None) -> None:
        name = bucket_name(key_id, limit, window_seconds, burst)
        if burst is None:
            self._counter.give_back(name, amount, window)
        else:
            self._buckets.take(name, limit, window_seconds, burst, self._clock(), -amount, 0)

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
