"""A shared ledger (Redis, Postgres, the workers' file) whose busy counters and buckets far
from their limit are reserved from leases (llm_gateway.leases): a request whose every
counter and bucket has a lease with room is reserved and settled in this process, with
no round trip; any other request is the backend's, all or nothing as ever.

A lease is an ordinary reservation on one counter or bucket, asked for in the
background; booking it is an ordinary settlement (what was spent from it, the rest
released). So leases need nothing of a backend beyond ``Ledger``, and every backend's
atomic rule still guards every unit: a budget is never passed.

A request the backend decides passes its owner on to it (its reservation is a held row
there, released by a sweep if this process dies). A request decided from a lease has no
row of its own, and a lease is reserved without an owner: if this process is killed, what
its leases hold stays counted until their windows end, which is little (a lease is a
share of what is left, and what was spent from it is booked as it is granted more). A
replayed settlement of a request decided from a lease (its ticket is lost with the
process) thus finds no row in the backend and books nothing: the lease's room still
covers what it spent.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from llm_gateway.billing.ledger import Draw, Hold, Ledger, LedgerAnswer, Owner
from llm_gateway.leases import DEFAULT_LEASE_SECONDS, Lease, LeaseKeeper

log = logging.getLogger("llm_gateway.billing")


class LeasedLedger:
    """``shared`` with leases of ``seconds``; a ``Ledger`` itself."""

    def __init__(self, shared: Ledger, seconds: float = DEFAULT_LEASE_SECONDS, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.shared = shared
        self.backend = shared.backend
        self._keeper = LeaseKeeper(seconds, clock, self._book)
        self.book = self._keeper.book
        self._clock = clock

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        if not holds and not draws:  # a probe (/readyz): the backend's answer
            return await self.shared.reserve(holds, draws)
        limits: list[Hold | Draw] = [*holds, *draws]
        wants = [(_lease_name(limit), limit.amount) for limit in limits]
        leases = self.book.take(wants)
        if leases is not None:
            for lease, limit in zip(leases, limits, strict=True):
                if size := self.book.renewal(lease, limit.amount):
                    self._keeper.spawn(self._ask(limit, size))
            left = {limit.name: lease.remaining + limit.amount
                    for lease, limit in zip(leases, limits, strict=True)}
            return LedgerAnswer(True, None, left, ticket=leases)
        # Without an owner, asked exactly as before (a wrapper that knows no owners works).
        answer = await (self.shared.reserve(holds, draws) if owner is None
                        else self.shared.reserve(holds, draws, owner))
        if answer.granted and answer.left:
            for limit, (name, _) in zip(limits, wants, strict=True):
                left = answer.left.get(limit.name, 0) - limit.amount
                if size := self.book.wanted(name, limit.amount, left):
                    self._keeper.spawn(self._ask(limit, size))
        return answer

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None, owner: Owner | None = None,
                     ) -> None:
        if not isinstance(ticket, tuple):  # the backend's, under its owner if it has one
            await self.shared.settle(holds, spent, draws, used, owner=owner)
            return
        # Settled in its lease, unless that was booked already: then in the backend,
        # which holds the reservation among the lease's (booking left it there).
        back: tuple[list[Hold], list[int], list[Draw], list[int]] = ([], [], [], [])
        for lease, hold, amount in zip(ticket[:len(holds)], holds, spent, strict=True):
            if not self.book.settle(lease, hold.amount, amount):
                back[0].append(hold)
                back[1].append(amount)
        for lease, draw, amount in zip(ticket[len(holds):], draws, used, strict=True):
            if not self.book.settle(lease, draw.amount, amount):
                back[2].append(draw)
                back[3].append(amount)
        if back[0] or back[2]:
            await self.shared.settle(*back)

    async def _ask(self, limit: Hold | Draw, size: int) -> None:
        """A lease on ``limit``'s counter or bucket: a reservation of ``size`` of it."""
        asked = self._clock()
        lease_of = dataclasses.replace(limit, amount=size)
        holds, _, draws, _ = _settlement([(lease_of, 0)])
        try:
            answer = await self.shared.reserve(holds, draws)
        except Exception as exc:  # the backend's trouble shows on the requests it decides
            log.debug("a lease on %s was not granted: %s", self.backend, type(exc).__name__)
            self.book.refused(_lease_name(limit))
            return
        if not answer.granted:
            self.book.refused(_lease_name(limit))
            return
        left = (answer.left or {}).get(limit.name, size) - size
        lease = self.book.granted(_lease_name(limit), size, left, asked, lease_of)
        if (spent := lease.take_spent()) and isinstance(lease_of, Hold):
            # What a lease added to has spent so far is booked now: the store then holds
            # no more of it than its free room and what is under way (if this process is
            # killed, no more than that stays held until the window ends). A bucket
            # keeps no such difference: what was drawn is gone either way.
            await self._book_spent(lease_of, spent)

    async def _book(self, ended: list[Lease]) -> None:
        """One settlement for every lease that ended: what each spent, and its room
        released but for requests still under way. Not tried again when it fails (it may
        have been applied): the room then stays held until its window ends, which covers
        what was spent from it, so a budget is never undercounted."""
        booking = _settlement([
            (dataclasses.replace(lease.tag, amount=lease.held - lease.in_flight), lease.spent)
            for lease in ended if lease.held - lease.in_flight > 0 or lease.spent > 0])
        if not (booking[0] or booking[2]):
            return
        try:
            await self.shared.settle(*booking)
        except Exception as exc:
            log.warning("leases on %s were not booked (their room stays held until their "
                        "windows end): %s", self.backend, type(exc).__name__)

    async def _book_spent(self, hold: Hold, spent: int) -> None:
        try:
            await self.shared.settle([dataclasses.replace(hold, amount=spent)], [spent], [], [])
        except Exception as exc:  # held as reserved instead: never undercounted
            log.warning("a lease's spending was not booked on %s: %s", self.backend,
                        type(exc).__name__)

    async def heartbeat(self, process: str) -> None:
        await self.shared.heartbeat(process)

    async def sweep(self) -> int:
        return await self.shared.sweep()

    async def spent(self, names: list[str]) -> dict[str, int]:
        """The backend's figures: what leases spent is booked there within a lease period
        or two (when each is renewed or ends), so this lags by at most that."""
        return await self.shared.spent(names)

    async def close(self) -> None:
        """Book every lease, then close the backend."""
        await self._keeper.close()
        await self.shared.close()


def _settlement(limits: list[tuple[Hold | Draw, int]],
                ) -> tuple[list[Hold], list[int], list[Draw], list[int]]:
    """(counter, amount) and (bucket, amount) pairs as ``Ledger.settle`` takes them: the
    holds and what each spent, the draws and what each used."""
    holds: list[Hold] = []
    spent: list[int] = []
    draws: list[Draw] = []
    used: list[int] = []
    for limit, amount in limits:
        if isinstance(limit, Hold):
            holds.append(limit)
            spent.append(amount)
        else:
            draws.append(limit)
            used.append(amount)
    return holds, spent, draws, used


def _lease_name(limit: Hold | Draw) -> str:
    """A lease is on a counter or bucket at one limit: a budget changed meanwhile (its
    limit lowered) is the backend's to decide again, not an old lease's to spend."""
    return f"{limit.name}@{limit.limit if isinstance(limit, Hold) else limit.capacity}"
