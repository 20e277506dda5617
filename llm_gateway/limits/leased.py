"""A shared limiter (Redis, the workers' file) whose busy keys far from their limit count
from leases (llm_gateway.leases): their requests are decided in this process, without
a round trip; every other request, and every one near a limit, is the backend's.

A key's guard (its budget of failed upstream requests) is read in the backend when a
lease is granted and at each request the backend decides. So that a key whose requests
start failing is held to it at once, counting a failure against a guard ends the leases
it guards: the key's next request is the backend's again. A guard's own window is never
leased (the backend must see every failure to read it). Failures on other replicas are
seen by this one at its next lease, within a lease period.

A lease on a token bucket is tokens taken from it at once; what a lease did not use goes
back into the bucket (up to its burst). A bucket has no window to end with: its leases
last their period. So its requests admitted over any span stay within the bucket's
burst plus its refill, leases or not: a lease takes its tokens before they are spent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from llm_gateway.buckets import seconds_until
from llm_gateway.leases import DEFAULT_LEASE_SECONDS, Lease, LeaseKeeper
from llm_gateway.limits import Guard, LeasingLimiter, LimitDecision, bucket_name, bucket_rate

log = logging.getLogger("llm_gateway.limits")


@dataclass(frozen=True, slots=True)
class _Window:
    """What a rate-limit lease was granted on: the limit, its guard, and its window (the
    backend's start, and its end on this process's monotonic clock); a bucket's burst
    (then no start, and no end)."""

    key_id: str
    limit: int
    window_seconds: int
    guard: Guard | None
    start: float
    end: float
    burst: int | None = None


class LeasedRateLimiter:
    """``shared`` with leases of ``seconds``; a ``SharedRateLimiter`` itself (the failure
    policy wraps it: the backend's failures reach it from the requests it decides)."""

    def __init__(self, shared: LeasingLimiter, seconds: float = DEFAULT_LEASE_SECONDS, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.shared = shared
        self.backend = shared.backend
        self._keeper = LeaseKeeper(seconds, clock, self._give_back)
        self.book = self._keeper.book
        self._clock = clock
        # The windows guards read, and per guard the names of the leases it guards.
        self._guards: dict[str, set[str]] = {}

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        if cost <= 0:  # a look: room held here is room in the window; else the backend's
            name = bucket_name(key_id, limit, window_seconds, burst)
            lease = self.book.live(name) if guard is None else None
            if lease is not None and lease.free > 0 and lease.ends > self._clock():
                return self._decided(lease)
            return await self.shared.take(key_id, limit, window_seconds, cost, guard, burst)
        if (guarded := self._guards.get(key_id)) is not None:
            # A failure counted against a guard: what it guards is decided by the backend.
            if guarded:
                self._book(self.book.end(list(guarded)))
                guarded.clear()
            return await self.shared.take(key_id, limit, window_seconds, cost, guard, burst)
        name = bucket_name(key_id, limit, window_seconds, burst)
        if guard is not None:
            name = f"{name}|{guard.key_id}:{guard.limit}/{guard.window_seconds}"
            if guard.key_id not in self._guards:
                if len(self._guards) > 100_000:
                    self._guards = {k: v for k, v in self._guards.items() if v}
                self._guards[guard.key_id] = set()
        leases = self.book.take(((name, cost),))
        if leases is not None:
            lease = leases[0]
            self.book.count(lease, cost)
            if size := self.book.renewal(lease, cost):
                self._lease(_Window(key_id, limit, window_seconds, guard, 0.0, 0.0, burst),
                            name, size)
            return self._decided(lease)
        decision = await self.shared.take(key_id, limit, window_seconds, cost, guard, burst)
        if decision.allowed and (size := self.book.wanted(name, cost, decision.remaining)):
            self._lease(_Window(key_id, limit, window_seconds, guard, 0.0, 0.0, burst),
                        name, size)
        return decision

    def _decided(self, lease: Lease) -> LimitDecision:
        """A request decided from ``lease``, as this process sees its limit: a window's
        reset is its end; a bucket's, when its burst would be whole again."""
        window: _Window = lease.tag
        if window.burst is None:
            return LimitDecision(True, window.limit, lease.remaining,
                                 max(0.0, window.end - self._clock()), leased=True)
        rate = bucket_rate(window.limit, window.window_seconds)
        return LimitDecision(True, window.limit, min(lease.remaining, window.burst),
                             seconds_until(lease.remaining, window.burst, rate), leased=True,
                             capacity=window.burst)

    def _lease(self, limit: _Window, name: str, size: int) -> None:
        """Ask for a lease of ``size`` on ``limit`` (its start and end: the grant's)."""
        self._keeper.spawn(self._ask(limit, name, size))

    async def _ask(self, limit: _Window, name: str, size: int) -> None:
        asked = self._clock()
        try:
            granted = await self.shared.lease(limit.key_id, limit.limit, limit.window_seconds,
                                              size, limit.guard, limit.burst)
        except Exception as exc:  # the backend's trouble shows on the requests it decides
            log.debug("a lease on %s was not granted: %s", self.backend, type(exc).__name__)
            self.book.refused(name)
            return
        if not granted.amount:
            self.book.refused(name)
            return
        end = asked + granted.reset_after  # a bucket's: never (its lease's period bounds it)
        if (live := self.book.live(name)) is not None and live.tag.start != granted.window:
            self._book(self.book.end([name]))  # granted in the next window: a lease of its own
        capacity = limit.limit if limit.burst is None else limit.burst
        self.book.granted(name, granted.amount, capacity - granted.count, asked,
                          replace(limit, start=granted.window, end=end), ends=end)
        if limit.guard is not None:
            self._guards.setdefault(limit.guard.key_id, set()).add(name)

    def _book(self, ended: list[Lease]) -> None:
        if ended:
            self._keeper.spawn(self._give_back(ended))

    async def _give_back(self, ended: list[Lease]) -> None:
        """The unused room of each lease back into its window, while that still runs (a
        failure leaves it counted: a limit only stricter, for the rest of that window)."""
        now = self._clock()
        for lease in ended:
            window: _Window = lease.tag
            if (amount := lease.give_back()) > 0 and window.end > now:
                try:
                    await self.shared.give_back(window.key_id, window.limit,
                                                window.window_seconds, amount, window.start,
                                                window.burst)
                except Exception as exc:
                    log.debug("a lease was not given back to %s: %s", self.backend,
                              type(exc).__name__)

    async def ping(self) -> None:
        await self.shared.ping()

    async def close(self) -> None:
        """Give back every lease's unused room, then close the backend."""
        await self._keeper.close()
        await self.shared.close()
