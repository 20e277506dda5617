"""A shared limiter under the operator's failure policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from llm_gateway.config import FailurePolicy
from llm_gateway.limits import (
    Guard,
    LimitDecision,
    LimiterUnavailable,
    MemoryRateLimiter,
    RateLimiter,
    SharedRateLimiter,
)
from llm_gateway.outage import Outage

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
        self.outage = Outage("rate_limiter", shared.backend, policy=policy,
                             substitute=substitute, clock=clock)

    @property
    def backend(self) -> str:
        return self.shared.backend

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        now = self._clock()
        if not self.outage.is_down or now >= self._next_try:
            # Claim the retry before awaiting: concurrent requests must not pile onto a
            # backend that is down (each would wait out its timeout).
            self._next_try = now + self._retry_interval
            try:
                decision = await self.shared.take(key_id, limit, window_seconds, cost, guard,
                                                  burst)
            except LimiterUnavailable as exc:
                self.outage.failed(exc.__cause__ or exc)
            else:
                if not decision.leased:  # a lease says nothing of the backend now
                    self.outage.recovered()
                return decision
        if self.policy is FailurePolicy.FAIL_CLOSED:
            raise LimiterUnavailable(self.backend)
        self.outage.substituted()
        return await self.fallback.take(key_id, limit, window_seconds, cost, guard, burst)

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
