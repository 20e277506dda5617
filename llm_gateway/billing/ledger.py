"""The ledger: counters that budgets reserve against, and token buckets, kept where every
replica sees them (Redis, Postgres) or in process (the embedded default).

A counter holds what was ``spent`` and what is ``reserved`` by requests in flight, in
whole units (1e-10 USD, or tokens). ``reserve`` is all-or-nothing over several counters
and buckets: if any would pass its limit, nothing is taken and the first that would is
named. ``settle`` turns a reservation into what was really spent. Both are atomic in the
backend (a Lua script; a Postgres function called in one statement; the event loop), so
concurrent requests on any number of replicas never spend past a limit by more than
what they reserved, and with reservations that cover the output cap, not at all. The
in-process and SQLite ledgers apply one rule (``reserve_in``, ``settle_in``) to their
own state.
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
    # Whoever granted it from room held in this process (a lease) knows it by this; the
    # settlement hands it back. None: granted by the backend.
    ticket: object = None


class Ledger(Protocol):
    backend: str

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer: ...
    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None) -> None:
        """Release each hold and book what was spent on its counter; give back (or take
        more from) each bucket the difference between its draw and what was used.
        ``ticket``: the reservation's answer's."""
        ...

    async def close(self) -> None: ...


class LedgerState(Protocol):
    """Where a ledger's counters and buckets are read and written, inside whatever makes
    one reservation atomic (the event loop; a transaction)."""

    def counter(self, name: str) -> tuple[int, int]:
        """(spent, reserved); (0, 0) for a counter never written."""
        ...

    def bucket(self, name: str) -> tuple[float, float] | None:
        """(level, at) as last written; None: never written (full)."""
        ...

    def set_counter(self, name: str, spent: int, reserved: int, expires_at: float) -> None: ...
    def set_bucket(self, name: str, level: float, at: float) -> None: ...


def bucket_level(draw: Draw, state: tuple[float, float] | None, now: float) -> float:
    """A bucket's level now: refilled at ``capacity`` per 60 s since it was written."""
    level, at = state if state is not None else (float(draw.capacity), now)
    return min(float(draw.capacity), level + (now - at) * draw.capacity / 60.0)


def reserve_in(state: LedgerState, holds: list[Hold], draws: list[Draw],
               now: float) -> LedgerAnswer:
    """``Ledger.reserve``'s rule, on any state: all or nothing, the first limit that would
    be passed named."""
    left: dict[str, int] = {}
    refused = None
    for hold in holds:
        spent, reserved = state.counter(hold.name)
        left[hold.name] = int(hold.limit - spent - reserved)
        if refused is None and spent + reserved + hold.amount > hold.limit:
            refused = hold.name
    levels = {draw.name: bucket_level(draw, state.bucket(draw.name), now) for draw in draws}
    for draw in draws:
        left[draw.name] = math.floor(levels[draw.name])
        if refused is None and levels[draw.name] < draw.amount:
            refused = draw.name
    if refused is not None:
        return LedgerAnswer(False, refused, left)
    for hold in holds:
        spent, reserved = state.counter(hold.name)
        state.set_counter(hold.name, spent, reserved + hold.amount, hold.expires_at)
    for draw in draws:
        state.set_bucket(draw.name, levels[draw.name] - draw.amount, now)
    return LedgerAnswer(True, None, left)


def settle_in(state: LedgerState, holds: list[Hold], spent: list[int], draws: list[Draw],
              used: list[int], now: float) -> None:
    """``Ledger.settle``'s rule, on any state."""
    for hold, amount in zip(holds, spent, strict=True):
        before, reserved = state.counter(hold.name)
        state.set_counter(hold.name, before + amount, max(0, reserved - hold.amount),
                          hold.expires_at)
    for draw, amount in zip(draws, used, strict=True):
        level = bucket_level(draw, state.bucket(draw.name), now)
        state.set_bucket(draw.name, min(draw.capacity, level + draw.amount - amount), now)


class MemoryLedger:
    """One process's ledger: exact within the process (the event loop runs one call at a
    time), and what a single `serve` needs."""

    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counters: dict[str, tuple[int, int, float]] = {}  # name -> spent, reserved, expiry
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (level, at)

    def counter(self, name: str) -> tuple[int, int]:
        spent, reserved, _ = self._counters.get(name, (0, 0, 0.0))
        return spent, reserved

    def bucket(self, name: str) -> tuple[float, float] | None:
        return self._buckets.get(name)

    def set_counter(self, name: str, spent: int, reserved: int, expires_at: float) -> None:
        self._counters[name] = (spent, reserved, expires_at)

    def set_bucket(self, name: str, level: float, at: float) -> None:
        self._buckets[name] = (level, at)

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer:
        now = self._clock()
        if len(self._counters) > 10_000:  # forget counters whose window is over
            self._counters = {k: v for k, v in self._counters.items() if v[2] > now}
        return reserve_in(self, holds, draws, now)

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None) -> None:
        settle_in(self, holds, spent, draws, used, self._clock())

    async def close(self) -> None:
        return None
