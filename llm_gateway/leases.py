"""Leases: room taken from a shared limit ahead of time and spent in this process, so that
a request far from its limits is decided without a round trip to the shared store
(Redis, Postgres, the workers' file). Pure: the wrappers that ask the store
(``limits.leased``, ``billing.ledger_leased``) feed it the store's answers and the time.

One rule for every kind of limit (a rate-limit window, a budget's counter, a token
bucket), all in whole units:

- **Only busy names far from their limit are leased.** A name is leased once this
  process has sent ``LEASE_AFTER`` of its requests to the store within one lease period,
  and only while what the limit has left covers ``FLOOR`` more requests like the one at
  hand. Near a limit nothing is leased: every request is decided in the store, one at a
  time, exactly as without leases; a limit that small is never leased at all.
- **A lease is small.** At most a ``SHARE``-th of what the limit has left (so the
  replicas between them never hold much of it), sized for twice what this process used
  in a period, and usable for one period (``LIMIT_LEASE_SECONDS``) on this process's
  monotonic clock, counted from when it was asked for: it ends here before the store
  could think it over.
- **What is not used goes back.** Before a lease runs out or ends, more is asked for and
  added to it (its time starts again); a lease whose time is up is booked in the store:
  what was spent from it, and the rest given back. Requests still under way when it is
  booked settle with the store themselves, as requests without a lease do.

So a limit is never passed: a lease is room the store granted atomically, as it grants a
single request. What leases cost is at the margin: while another replica holds unused
room, the store can refuse a request a moment (at most a period) before the limit is
really reached, and the remaining counts in headers are this process's view (exact again
near the limit, where nothing is leased). A process killed with a lease leaves its
unused room counted until the window ends (a lease is a period's worth: small).

``LeaseBook`` is the rule, pure (fed the time); ``LeaseKeeper`` runs a wrapper's
background calls and books what ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

# A name is leased after this many of its requests went to the store in one period.
LEASE_AFTER = 8
# Leased only while the limit has room for this many more requests like the current one.
FLOOR = 1000
# A lease takes at most this fraction (1/SHARE) of what the limit has left.
SHARE = 8
# The first lease of a name: this many requests' worth (later ones follow the use).
FIRST = 16
DEFAULT_LEASE_SECONDS = 1.0


def lease_size(amount: int, left: int, per_period: int) -> int:
    """Units to lease for requests of ``amount`` when the limit has ``left`` outside this
    process and it used ``per_period`` in a period: 0 near the limit."""
    amount = max(1, amount)
    if left < FLOOR * amount:
        return 0
    return min(max(FIRST * amount, 2 * per_period), left // SHARE)


@dataclass(slots=True, eq=False)
class Lease:
    """Room on one name that the store holds for this process. Renewals add to it, so one
    busy name has one lease, whatever it has left is never stranded in an older one."""

    name: str
    held: int  # units the store holds for this lease: free + in flight + spent
    left: int  # what the limit had left outside this lease at its last grant
    asked_at: float  # monotonic: when its last grant was asked for
    ends: float  # monotonic: usable until then
    tag: Any  # the store's own: the limit's parameters, the window it was granted in
    last_grant: int = 0
    free: int = 0  # neither spent nor reserved here
    in_flight: int = 0  # reserved here by requests not settled yet
    spent: int = 0  # settled here (or counted, for a rate limit), not yet booked
    booked: bool = False  # its end is booked: requests still under way settle in the store

    @property
    def remaining(self) -> int:
        """What the limit has left as this process sees it: outside the lease, and in it."""
        return max(0, self.left + self.free)

    def give_back(self) -> int:
        """What booking it returns to the store: all but what is spent and under way."""
        return self.held - self.in_flight - self.spent

    def take_spent(self) -> int:
        """What was spent, to book now (the store then holds only the rest)."""
        spent, self.spent = self.spent, 0
        self.held -= spent
        return spent


class LeaseBook:
    """The leases this process holds on one store's limits."""

    def __init__(self, seconds: float = DEFAULT_LEASE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._live: dict[str, Lease] = {}
        self._ended: list[Lease] = []
        self._asking: set[str] = set()
        # Per name, this period: units the store decided (the demand, before a lease) and
        # until when the store's refusal of a lease stands (not asked again before).
        self._seen: dict[str, int] = {}
        self._seen_since = clock()
        self._refused: dict[str, float] = {}
        self.decisions = 0  # requests decided from a lease (for /metrics)

    def __len__(self) -> int:
        return len(self._live)

    def live(self, name: str) -> Lease | None:
        return self._live.get(name)

    # ---- the request path ---------------------------------------------------------

    def take(self, wants: Sequence[tuple[str, int]]) -> tuple[Lease, ...] | None:
        """Reserve each ``(name, amount)`` from its live lease, all or nothing: the leases
        taken from, or None when one has no live lease with room (ask the store)."""
        now = self._clock()
        leases = []
        for name, amount in wants:
            lease = self._live.get(name)
            if lease is None or lease.ends <= now or lease.free < amount:
                return None
            leases.append(lease)
        for lease, (_, amount) in zip(leases, wants, strict=True):
            lease.free -= amount
            lease.in_flight += amount
        self.decisions += 1
        return tuple(leases)

    def count(self, lease: Lease, amount: int) -> None:
        """What was reserved is spent at once (a rate limit's request counts as it goes)."""
        self.settle(lease, amount, amount)

    def settle(self, lease: Lease, reserved: int, spent: int) -> bool:
        """A request's ``reserved`` from ``lease`` turned out to cost ``spent``: True when
        settled here; False when the lease was booked already (settle it in the store)."""
        if lease.booked:
            return False
        lease.in_flight -= reserved
        lease.spent += spent
        lease.free = lease.held - lease.in_flight - lease.spent
        return True

    # ---- what to ask the store for ----------------------------------------------------

    def wanted(self, name: str, amount: int, left: int) -> int:
        """The store decided a request of ``amount`` on ``name`` and has ``left`` after it:
        how much to lease now (0: none). A positive answer is being asked for: say
        ``granted`` or ``refused`` when the store answers."""
        now = self._clock()
        self._roll(now)
        seen = self._seen[name] = self._seen.get(name, 0) + max(1, amount)
        if (name in self._asking or self._refused.get(name, -1.0) > now
                or seen < LEASE_AFTER * max(1, amount)):
            return 0
        if (live := self._live.get(name)) is not None and not self._ending(live, now):
            return 0
        return self._ask(name, lease_size(amount, left, seen))

    def renewal(self, lease: Lease, amount: int) -> int:
        """After a request took ``amount`` from ``lease``: how much to add to it once its
        last grant is half used or its time half over (0: not yet, or near the limit)."""
        now = self._clock()
        if lease.name in self._asking or not self._ending(lease, now):
            return 0
        elapsed = max(now - lease.asked_at, self.seconds / 10)
        used = lease.last_grant - lease.free
        per_period = round(max(used, amount) * self.seconds / elapsed)
        return self._ask(lease.name, lease_size(amount, lease.left, per_period))

    def granted(self, name: str, amount: int, left: int, asked_at: float, tag: Any,
                ends: float | None = None) -> Lease:
        """The store granted ``amount`` on ``name`` (``left`` outside what this process
        holds): added to its live lease, whose time starts again, or a new one."""
        self._asking.discard(name)
        period_end = asked_at + self.seconds
        ends = period_end if ends is None else min(ends, period_end)
        lease = self._live.get(name)
        if lease is None or lease.ends <= self._clock():
            if lease is not None:
                self._ended.append(lease)
            lease = self._live[name] = Lease(name, 0, left, asked_at, ends, tag)
        lease.held += amount
        lease.free += amount
        lease.left, lease.asked_at, lease.ends, lease.last_grant = left, asked_at, ends, amount
        return lease

    def refused(self, name: str) -> None:
        """The store had no such room (or did not answer): no more lease on ``name`` for a
        period; its requests go to the store."""
        self._asking.discard(name)
        self._refused[name] = self._clock() + self.seconds

    # ---- what to book -------------------------------------------------------------

    def ended(self) -> list[Lease]:
        """The leases over (their time is up, or they were ended), each once, marked
        booked: give back ``give_back()`` and book ``spent`` in the store."""
        now = self._clock()
        self._roll(now)
        for name, lease in list(self._live.items()):
            if lease.ends <= now:
                del self._live[name]
                self._ended.append(lease)
        return self._drain()

    def end(self, names: Sequence[str]) -> list[Lease]:
        """End these leases now (their requests must see the store again)."""
        for name in names:
            if (lease := self._live.pop(name, None)) is not None:
                self._ended.append(lease)
        return self._drain()

    def end_all(self) -> list[Lease]:
        return self.end(list(self._live))

    # ---- inside ---------------------------------------------------------------------

    def _drain(self) -> list[Lease]:
        ended, self._ended = self._ended, []
        for lease in ended:
            lease.booked = True
        return ended

    def _ending(self, lease: Lease, now: float) -> bool:
        return lease.free * 2 < lease.last_grant or lease.ends - now < self.seconds / 2

    def _ask(self, name: str, size: int) -> int:
        if size > 0:
            self._asking.add(name)
        return size

    def _roll(self, now: float) -> None:
        """A new period: the demand is counted afresh (names seen once stay unleased)."""
        if now - self._seen_since >= self.seconds:
            self._seen.clear()
            self._seen_since = now
            self._refused = {name: until for name, until in self._refused.items()
                             if until > now}


class LeaseKeeper:
    """A wrapper's book and its background work: the calls that ask for leases, and a
    tick that books the leases whose time is up (``book_ended``, the wrapper's), a
    quarter period after they end at the latest."""

    def __init__(self, seconds: float, clock: Callable[[], float],
                 book_ended: Callable[[list[Lease]], Awaitable[None]]) -> None:
        self.book = LeaseBook(seconds, clock)
        self._book_ended = book_ended
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Off the request path; the work handles its own failures."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.book.seconds / 4)
            if ended := self.book.ended():
                await self._book_ended(ended)

    async def close(self) -> None:
        """Book every lease (after the calls under way), and stop."""
        if self._ticker is not None:
            self._ticker.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if ended := self.book.end_all():
            await self._book_ended(ended)
