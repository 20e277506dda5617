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

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llm_gateway.config import FailurePolicy, Settings
from llm_gateway.outage import Outage

if TYPE_CHECKING:
    from llm_gateway.stores import Store


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


def bucket_name(key_id: str, limit: int, window_seconds: int) -> str:
    """A key's limits can change (keys rotate, operators edit them): count per setting."""
    return f"{key_id}:{limit}/{window_seconds}"


class RateLimiter(Protocol):
    async def take(self, key_id: str, limit: int, window_seconds: int) -> LimitDecision: ...
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
        bucket = bucket_name(key_id, limit, window_seconds)
        return self._counter.take(bucket, limit, window_seconds, self._clock())

    async def close(self) -> None:
        return None


# While a backend is down, one request per interval tries it again (the rest do not
# wait on it), so a replica notices the backend's return within about this long.
RETRY_INTERVAL_SECONDS = 1.0


class FailoverRateLimiter:
    """A shared limiter under the operator's failure policy.

    fail-open: while the backend is down, an in-process limiter answers (each replica
    then allows up to the limit on its own). fail-closed: ``LimiterUnavailable``, which
    the engine answers with 503. Either way the backend is tried again, one request per
    ``retry_interval``, and used again as soon as it answers: no restart needed.
    """

    def __init__(
        self,
        shared: SharedRateLimiter,
        policy: FailurePolicy,
        *,
        fallback: RateLimiter | None = None,
        retry_interval: float = RETRY_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.policy = policy
        self.fallback = fallback or MemoryRateLimiter()
        self._retry_interval = retry_interval
        self._clock = clock
        self._next_try = 0.0
        substitute = (
            "counting in process until it is back" if policy is FailurePolicy.FAIL_OPEN
            else "refusing requests with 503 until it is back"
        )
        self.outage = Outage("rate_limiter", shared.backend, substitute=substitute, clock=clock)

    @property
    def backend(self) -> str:
        return self.shared.backend

    async def take(self, key_id: str, limit: int, window_seconds: int) -> LimitDecision:
        now = self._clock()
        if not self.outage.is_down or now >= self._next_try:
            # Claim the retry before awaiting: concurrent requests must not pile onto a
            # backend that is down (each would wait out its timeout).
            self._next_try = now + self._retry_interval
            try:
                decision = await self.shared.take(key_id, limit, window_seconds)
            except LimiterUnavailable as exc:
                self.outage.failed(exc.__cause__ or exc)
            else:
                self.outage.recovered()
                return decision
        if self.policy is FailurePolicy.FAIL_CLOSED:
            raise LimiterUnavailable(self.backend)
        self.outage.substituted()
        return await self.fallback.take(key_id, limit, window_seconds)

    async def check(self) -> bool:
        """Ask the backend directly (for /readyz); True when it answers."""
        try:
            await asyncio.wait_for(self.shared.ping(), timeout=2.0)
        except Exception as exc:  # any failure to answer a ping is "not available"
            self.outage.failed(exc)
            return False
        self.outage.recovered()
        self._next_try = 0.0
        return True

    async def close(self) -> None:
        await self.shared.close()
        await self.fallback.close()


def open_limiter(settings: Settings, store: Store) -> RateLimiter:
    """The limiter the settings name: Redis when REDIS_URL is set, else the Postgres
    fixed window when the store is Postgres, else in-process counting."""
    if settings.redis_url:
        from llm_gateway.limits_redis import RedisRateLimiter

        return FailoverRateLimiter(
            RedisRateLimiter(settings.redis_url), settings.rate_limit_failure_policy
        )
    if settings.database_url.startswith(("postgresql:", "postgres:")):
        from llm_gateway.limits_postgres import PostgresRateLimiter
        from llm_gateway.stores.postgres import PostgresStore

        if isinstance(store, PostgresStore):
            return FailoverRateLimiter(
                PostgresRateLimiter(store), settings.rate_limit_failure_policy
            )
    return MemoryRateLimiter()
