"""The ledger: counters that budgets reserve against, and token buckets, kept where every
replica sees them (Redis, Postgres) or in process (the embedded default).

A counter holds what was ``spent`` and what is ``reserved`` by requests in flight, in
whole units (1e-10 USD, or tokens). ``reserve`` is all-or-nothing over several counters
and buckets: if any would pass its limit, nothing is taken and the first that would is
named. ``settle`` turns a reservation into what was really spent. Both are atomic in the
backend (a Lua script; a Postgres function called in one statement; the event loop), so
concurrent requests on any number of replicas never spend past a limit by more than
what they reserved, and with reservations that cover the output cap, not at all. The
in-process and SQLite ledgers apply one rule (``reserve_in``, ``settle_in``,
``sweep_in``) to their own state.

A reservation may name its ``Owner``: the process that made it (a tag drawn at random per
process, new after a fork) and the request it is for. Then the ledger also keeps a *held
row* for it (the holds' names and amounts; a bucket needs none, it refills by itself), and
its settlement is exactly once: a held row is released and its spend booked; a row the
sweep released (a *tombstone*) has its spend booked only; neither means it was settled
already, and nothing is booked (a replay after a crash may settle a request whose
settlement had in fact happened before the kill). Draws are settled either way.

A process says it lives with ``heartbeat`` every few seconds (a granted reservation with
an owner registers it too: a row never exists for a process the sweep does not know).
``sweep``, run by every process now and then, takes the processes not heard of for
``ORPHAN_SECONDS`` (on the backend's clock where it has one), releases what their rows
hold (never below 0), turns the rows into tombstones (kept ``TOMBSTONE_SECONDS``, longer
than any window, so a late settlement still books its spend once), and forgets the
process. So the reservations of a killed gateway are released half a minute after its
death instead of at the end of their day or month. A sweep does a bounded amount of work
(``SWEEP_PROCESSES`` processes, ``SWEEP_ROWS`` rows) and is atomic, so every replica may
run it at once; a process swept while alive (cut off from the backend that long) just
works on: its next heartbeat registers it again, and its old reservations settle through
their tombstones. Without an owner a reservation is only the counters' aggregates, as
leases are.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llm_gateway.buckets import refill

# A process not heard of for this long is dead: its reservations are released.
ORPHAN_SECONDS = 30.0
# A tombstone outlives the longest window (a month): a settlement later than that books
# into a counter that has expired anyway.
TOMBSTONE_SECONDS = 40 * 86400.0
# What one sweep does at most: a dead process with more rows is finished by the next ones.
SWEEP_PROCESSES = 4
SWEEP_ROWS = 2000


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a reservation: a process instance (random per process, new after fork) and
    one of its requests."""

    process: str
    request: str


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

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        """All or nothing; granted with an ``owner``, a held row is kept for it too."""
        ...

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None, owner: Owner | None = None,
                     ) -> None:
        """Release each hold and book what was spent on its counter; give back (or take
        more from) each bucket the difference between its draw and what was used.
        ``ticket``: the reservation's answer's. With an ``owner``: exactly once (what its
        held row holds is released; a swept one's spend booked only; else nothing)."""
        ...

    async def heartbeat(self, process: str) -> None:
        """``process`` lives (every few seconds): its reservations are not swept."""
        ...

    async def sweep(self) -> int:
        """Release the reservations of processes not heard of for ``ORPHAN_SECONDS``; how
        many reservations (bounded per call)."""
        ...

    async def spent(self, names: list[str]) -> dict[str, int]:
        """What each counter has spent (0: never written), in one read: for budget alerts,
        off the request path."""
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

    def add_held(self, owner: Owner, holds: list[Hold]) -> None:
        """Add ``holds`` to the owner's held row (made now if it has none)."""
        ...

    def take_held(self, owner: Owner) -> list[Hold] | None:
        """The owner's held row, deleted; None: it has none."""
        ...

    def take_swept(self, owner: Owner) -> bool:
        """Whether the owner's reservation was swept (a tombstone), the tombstone deleted."""
        ...

    def heard(self, process: str, at: float) -> None:
        """``process`` was heard of at ``at``."""
        ...

    def silent(self, before: float, most: int) -> list[str]:
        """At most ``most`` processes last heard of before ``before``, longest silent first."""
        ...

    def take_held_of(self, process: str, most: int) -> list[tuple[str, list[Hold]]]:
        """At most ``most`` of the process's held rows, as (request, holds), deleted."""
        ...

    def add_swept(self, process: str, requests: list[str], at: float) -> None:
        """Tombstones of these requests of ``process``, made at ``at``."""
        ...

    def forget(self, process: str) -> None:
        """``process`` is dead, and holds no row any more."""
        ...

    def drop_swept(self, before: float, most: int) -> None:
        """At most ``most`` tombstones made before ``before``, deleted."""
        ...


def bucket_level(draw: Draw, state: tuple[float, float] | None, now: float) -> float:
    """A bucket's level now: refilled at ``capacity`` per 60 s since it was written."""
    level, at = state if state is not None else (float(draw.capacity), now)
    return refill(level, at, now, float(draw.capacity), draw.capacity / 60.0)


def reserve_in(state: LedgerState, holds: list[Hold], draws: list[Draw],
               now: float, owner: Owner | None = None) -> LedgerAnswer:
    """``Ledger.reserve``'s rule, on any state: all or nothing, the first limit that would
    be passed named; granted with an owner, its process heard of and its holds in its row."""
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
    if owner is not None:
        state.heard(owner.process, now)
        if holds:
            state.add_held(owner, holds)
    return LedgerAnswer(True, None, left)


def settle_in(state: LedgerState, holds: list[Hold], spent: list[int], draws: list[Draw],
              used: list[int], now: float, owner: Owner | None = None) -> None:
    """``Ledger.settle``'s rule, on any state: with an owner, exactly once (its held row
    released and the spend booked; swept: the spend booked only; neither: settled
    already, nothing booked)."""
    released, booked = holds, True
    if owner is not None:
        row = state.take_held(owner)
        if row is not None:
            released = row
        else:
            released, booked = [], state.take_swept(owner)
    release: dict[str, int] = {}
    for hold in released:
        release[hold.name] = release.get(hold.name, 0) + hold.amount
    if booked:
        for hold, amount in zip(holds, spent, strict=True):
            before, reserved = state.counter(hold.name)
            state.set_counter(hold.name, before + amount,
                              max(0, reserved - release.pop(hold.name, 0)), hold.expires_at)
    _release(state, [hold for hold in released if hold.name in release])
    for draw, amount in zip(draws, used, strict=True):
        level = bucket_level(draw, state.bucket(draw.name), now)
        state.set_bucket(draw.name, min(draw.capacity, level + draw.amount - amount), now)


def sweep_in(state: LedgerState, now: float, orphan_seconds: float = ORPHAN_SECONDS) -> int:
    """``Ledger.sweep``'s rule, on any state: the rows of processes silent for
    ``orphan_seconds`` released and turned into tombstones, the processes forgotten once
    they hold none; bounded; how many rows."""
    released = 0
    for process in state.silent(now - orphan_seconds, SWEEP_PROCESSES):
        most = SWEEP_ROWS - released
        rows = state.take_held_of(process, most)
        for _, holds in rows:
            _release(state, holds)
        state.add_swept(process, [request for request, _ in rows], now)
        released += len(rows)
        if len(rows) < most:  # none left: else the next sweep goes on with it
            state.forget(process)
        if released >= SWEEP_ROWS:
            break
    state.drop_swept(now - TOMBSTONE_SECONDS, SWEEP_ROWS)
    return released


def _release(state: LedgerState, holds: list[Hold]) -> None:
    """What ``holds`` reserved, released (never below 0); a counter that holds nothing (its
    window over and forgotten, say) is left alone."""
    for hold in holds:
        spent, reserved = state.counter(hold.name)
        if reserved:
            state.set_counter(hold.name, spent, max(0, reserved - hold.amount),
                              hold.expires_at)


class MemoryLedger:
    """One process's ledger: exact within the process (the event loop runs one call at a
    time), and what a single `serve` needs."""

    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.time, *,
                 orphan_seconds: float = ORPHAN_SECONDS) -> None:
        self._clock = clock
        self._orphan_seconds = orphan_seconds
        self._counters: dict[str, tuple[int, int, float]] = {}  # name -> spent, reserved, expiry
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (level, at)
        # Owners (this process's own, unless the ledger is shared in a test): process ->
        # request -> holds; (process, request) -> when swept; process -> last heard of.
        self._held: dict[str, dict[str, list[Hold]]] = {}
        self._swept: dict[tuple[str, str], float] = {}
        self._heard: dict[str, float] = {}

    def counter(self, name: str) -> tuple[int, int]:
        spent, reserved, _ = self._counters.get(name, (0, 0, 0.0))
        return spent, reserved

    def bucket(self, name: str) -> tuple[float, float] | None:
        return self._buckets.get(name)

    def set_counter(self, name: str, spent: int, reserved: int, expires_at: float) -> None:
        self._counters[name] = (spent, reserved, expires_at)

    def set_bucket(self, name: str, level: float, at: float) -> None:
        self._buckets[name] = (level, at)

    def add_held(self, owner: Owner, holds: list[Hold]) -> None:
        rows = self._held.setdefault(owner.process, {})
        rows[owner.request] = [*rows.get(owner.request, ()), *holds]

    def take_held(self, owner: Owner) -> list[Hold] | None:
        return self._held.get(owner.process, {}).pop(owner.request, None)

    def take_swept(self, owner: Owner) -> bool:
        return self._swept.pop((owner.process, owner.request), None) is not None

    def heard(self, process: str, at: float) -> None:
        self._heard[process] = at

    def silent(self, before: float, most: int) -> list[str]:
        return sorted((p for p, at in self._heard.items() if at < before),
                      key=self._heard.__getitem__)[:most]

    def take_held_of(self, process: str, most: int) -> list[tuple[str, list[Hold]]]:
        rows = self._held.get(process, {})
        return [(request, rows.pop(request)) for request in list(rows)[:most]]

    def add_swept(self, process: str, requests: list[str], at: float) -> None:
        self._swept.update(((process, request), at) for request in requests)

    def forget(self, process: str) -> None:
        self._heard.pop(process, None)
        self._held.pop(process, None)

    def drop_swept(self, before: float, most: int) -> None:
        for old in [owner for owner, at in self._swept.items() if at < before][:most]:
            del self._swept[old]

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        now = self._clock()
        if len(self._counters) > 10_000:  # forget counters whose window is over
            self._counters = {k: v for k, v in self._counters.items() if v[2] > now}
        return reserve_in(self, holds, draws, now, owner)

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None, owner: Owner | None = None,
                     ) -> None:
        settle_in(self, holds, spent, draws, used, self._clock(), owner)

    async def heartbeat(self, process: str) -> None:
        self.heard(process, self._clock())

    async def sweep(self) -> int:
        """The shared rule, though only a ledger shared in process (tests) has others'
        processes: this one dies with its process, reservations and all."""
        return sweep_in(self, self._clock(), self._orphan_seconds)

    async def spent(self, names: list[str]) -> dict[str, int]:
        return {name: self.counter(name)[0] for name in names}

    async def close(self) -> None:
        return None
