"""The ledger: counters that budgets reserve against, and token buckets, kept where every
replica sees them (Redis, Postgres) or in process (the embedded default).

A counter holds what was ``spent`` and what is ``reserved`` by requests in flight, in
whole units (1e-10 USD, or tokens). ``reserve`` is all-or-nothing over several counters
and buckets: if any would pass its limit, nothing is taken and the first that would is
named. ``settle`` turns a reservation into what was really spent. Both are atomic in the
backend (a Lua script; a Postgres function called in one statement; the event loop), so
concurrent requests on any number of replicas never spend past a limit by more than
what they reserved, and with reservations that cover the output cap, not at all.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Hold:
    """``amount`` on the counter ``name`` whose limit is ``limit``; the counter may be
    forgotten after ``expires_at`` (its window is over)."""

    name: str
    limit: int
    amount: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Draw:
    """``amount`` from the token bucket ``name``: ``capacity`` tokens, refilled at
    ``capacity`` per 60 s."""

    name: str
    capacity: int
    amount: int


@dataclass(frozen=True, slots=True)
class LedgerAnswer:
    granted: bool
    refused_by: str | None = None  # the first counter or bucket that said no
    # What was left on each counter and bucket before this request (granted or not).
    left: dict[str, int] | None = None


class Ledger(Protocol):
    backend: str

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer: ...
    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int]) -> None:
        """Release each hold and book what was spent on its counter; give back (or take
        more from) each bucket the difference between its draw and what was used."""
        ...

    async def close(self) -> None: ...


class MemoryLedger:
    """One process's ledger: exact within the process (the event loop runs one call at a
    time), and what a single `serve` needs."""

    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counters: dict[str, list[int | float]] = {}  # name -> [spent, reserved, expiry]
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (level, at)

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer:
        now = self._clock()
        self._forget_expired(now)
        left: dict[str, int] = {}
        refused = None
        for hold in holds:
            spent, reserved, _ = self._counters.get(hold.name, [0, 0, hold.expires_at])
            left[hold.name] = int(hold.limit - spent - reserved)
            if refused is None and spent + reserved + hold.amount > hold.limit:
                refused = hold.name
        levels = {draw.name: self._level(draw, now) for draw in draws}
        for draw in draws:
            left[draw.name] = math.floor(levels[draw.name])
            if refused is None and levels[draw.name] < draw.amount:
                refused = draw.name
        if refused is not None:
            return LedgerAnswer(False, refused, left)
        for hold in holds:
            counter = self._counters.setdefault(hold.name, [0, 0, hold.expires_at])
            counter[1] += hold.amount
        for draw in draws:
            self._buckets[draw.name] = (levels[draw.name] - draw.amount, now)
        return LedgerAnswer(True, None, left)

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int]) -> None:
        now = self._clock()
        for hold, amount in zip(holds, spent, strict=True):
            counter = self._counters.setdefault(hold.name, [0, 0, hold.expires_at])
            counter[0] += amount
            counter[1] = max(0, counter[1] - hold.amount)
        for draw, amount in zip(draws, used, strict=True):
            level = self._level(draw, now)
            self._buckets[draw.name] = (min(draw.capacity, level + draw.amount - amount), now)

    def _level(self, draw: Draw, now: float) -> float:
        level, at = self._buckets.get(draw.name, (float(draw.capacity), now))
        return min(float(draw.capacity), level + (now - at) * draw.capacity / 60.0)

    def _forget_expired(self, now: float) -> None:
        if len(self._counters) > 10_000:
            self._counters = {k: v for k, v in self._counters.items() if v[2] > now}

    async def close(self) -> None:
        return None
