"""Reservations with an owner (llm_gateway.billing.ledger): settled exactly once, and
released by a sweep once their process is not heard of any more, on every backend.

Each backend is used as several processes share it (one memory ledger; a ledger per
process over one workers' file, one Redis namespace, one Postgres schema). Time passes by
a clock where the ledger reads ours (memory, SQLite); Redis and Postgres judge silence on
their own clocks, so there the orphan age is a second and the test waits it out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

from llm_gateway.billing import ledger as ledger_module
from llm_gateway.billing import ledger_postgres, ledger_redis
from llm_gateway.billing.ledger import (
    ORPHAN_SECONDS,
    Draw,
    Hold,
    Ledger,
    LedgerAnswer,
    MemoryLedger,
    Owner,
)
from llm_gateway.billing.ledger_leased import LeasedLedger
from llm_gateway.billing.ledger_postgres import PostgresLedger
from llm_gateway.billing.ledger_redis import RedisLedger
from llm_gateway.billing.ledger_sqlite import SqliteLedger
from llm_gateway.billing.model import Budget, BudgetScope
from llm_gateway.billing.prices import PriceBook
from llm_gateway.billing.quotas import BudgetBook, QuotaDecision, Quotas
from llm_gateway.limits.sqlite import WorkersFile
from llm_gateway.stores import open_store
from llm_gateway.stores.postgres import PostgresStore

BACKENDS = ["memory", "sqlite", "redis", "postgres"]
REMOTE_ORPHAN_SECONDS = 1.0  # Redis's and Postgres's clocks: waited out, so short


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Shared:
    """One backend as several processes see it: a ledger each, what a counter holds, and
    a way to let more than the orphan age pass."""

    backend: str
    ledgers: list[Ledger]
    counter: Callable[[str], Awaitable[tuple[int, int]]]  # (spent, reserved)
    silence: Callable[[], Awaitable[None]]


@asynccontextmanager
async def shared(backend: str, request: pytest.FixtureRequest, tmp_path: Path,
                 processes: int = 2) -> AsyncIterator[Shared]:
    clock = Clock(time.time())

    async def advance() -> None:
        clock.now += ORPHAN_SECONDS + 1

    async def wait() -> None:
        await asyncio.sleep(REMOTE_ORPHAN_SECONDS + 0.2)

    if backend == "memory":
        store = MemoryLedger(clock)

        async def memory_counter(name: str) -> tuple[int, int]:
            return store.counter(name)

        yield Shared(backend, [store] * processes, memory_counter, advance)
    elif backend == "sqlite":
        files = [WorkersFile(tmp_path / "workers.db") for _ in range(processes + 1)]
        ledgers: list[Ledger] = [SqliteLedger(file, clock) for file in files[1:]]

        async def sqlite_counter(name: str) -> tuple[int, int]:
            with files[0].transaction() as db:
                row = db.execute("SELECT spent, reserved FROM quota_counters WHERE name = ?",
                                 (name,)).fetchone()
            return (row[0], row[1]) if row is not None else (0, 0)

        try:
            yield Shared(backend, ledgers, sqlite_counter, advance)
        finally:
            for ledger in ledgers:
                await ledger.close()
            files[0].close()
    elif backend == "redis":
        url = request.getfixturevalue("redis_url")
        namespace = f"owners-{uuid.uuid4().hex}"
        ledgers = [RedisLedger(url, namespace=namespace, orphan_seconds=REMOTE_ORPHAN_SECONDS)
                   for _ in range(processes)]
        reader = redis.Redis.from_url(url)

        async def redis_counter(name: str) -> tuple[int, int]:
            spent, reserved = reader.hmget(f"{namespace}:{{budgets}}:{name}", "spent",
                                           "reserved")
            return int(spent or 0), int(reserved or 0)

        try:
            yield Shared(backend, ledgers, redis_counter, wait)
        finally:
            for ledger in ledgers:
                await ledger.close()
            for key in reader.scan_iter(f"{namespace}:*"):
                reader.delete(key)
            reader.close()
    else:
        opened = open_store(request.getfixturevalue("postgres_url"))
        assert isinstance(opened, PostgresStore)
        pg: PostgresStore = opened
        try:
            await pg.migrate()
            ledgers = [PostgresLedger(pg, orphan_seconds=REMOTE_ORPHAN_SECONDS)
                       for _ in range(processes)]

            async def postgres_counter(name: str) -> tuple[int, int]:
                async with pg.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT spent, reserved FROM quota_counters WHERE name = %s", (name,))
                    row = await cursor.fetchone()
                return (int(row[0]), int(row[1])) if row is not None else (0, 0)

            yield Shared(backend, ledgers, postgres_counter, wait)
        finally:
            await pg.close()


def day_hold(amount: int, limit: int = 10**6) -> Hold:
    return Hold(f"tok:key:{uuid.uuid4().hex}:d1", limit, amount, time.time() + 3600)


async def reserve(ledger: Ledger, holds: list[Hold], owner: Owner | None,
                  draws: list[Draw] | None = None) -> LedgerAnswer:
    answer = await ledger.reserve(holds, draws or [], owner=owner)
    assert answer.granted
    return answer


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_reservation_with_an_owner_settled_twice_is_booked_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    day = day_hold(50)
    tpm = Draw(f"tpm:key:{uuid.uuid4().hex}", 10**6, 50)
    owner = Owner(uuid.uuid4().hex, "request-1")
    async with shared(backend, request, tmp_path) as ledgers:
        ledger = ledgers.ledgers[0]
        await reserve(ledger, [day], owner, [tpm])
        await reserve(ledger, [day], Owner(owner.process, "request-2"))
        assert await ledgers.counter(day.name) == (0, 100)
        for _ in range(2):  # the second one (a replay, say) books nothing
            await ledger.settle([day], [30], [tpm], [40], owner=owner)
            assert await ledgers.counter(day.name) == (30, 50)
        await ledger.settle([day], [20], [], [], owner=Owner(owner.process, "request-2"))
        assert await ledgers.counter(day.name) == (50, 0)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_silent_process_is_swept_and_its_late_settlements_book_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    day = day_hold(40)
    dead, alive = uuid.uuid4().hex, uuid.uuid4().hex
    async with shared(backend, request, tmp_path) as ledgers:
        killed, sweeper = ledgers.ledgers
        for name in ("r1", "r2"):
            await reserve(killed, [day], Owner(dead, name))
        await reserve(sweeper, [day], Owner(alive, "a1"))
        await sweeper.heartbeat(alive)
        assert await sweeper.sweep() == 0  # heard of just now: alive
        assert await ledgers.counter(day.name) == (0, 120)

        await ledgers.silence()  # the killed process says nothing any more; the other does
        await sweeper.heartbeat(alive)
        assert await sweeper.sweep() == 2
        assert await ledgers.counter(day.name) == (0, 40)  # the live one's still held
        assert await sweeper.sweep() == 0  # released once

        # A replay of the dead process's requests books each spend once (the tombstone).
        for _ in range(2):
            await sweeper.settle([day], [25], [], [], owner=Owner(dead, "r1"))
            assert await ledgers.counter(day.name) == (25, 40)
        await sweeper.settle([day], [5], [], [], owner=Owner(dead, "r2"))
        await sweeper.settle([day], [10], [], [], owner=Owner(alive, "a1"))
        assert await ledgers.counter(day.name) == (40, 0)

        # Swept while it was in fact alive (cut off that long), it just works on.
        await reserve(killed, [day], Owner(dead, "r3"))
        await killed.heartbeat(dead)
        assert await sweeper.sweep() == 0
        await killed.settle([day], [1], [], [], owner=Owner(dead, "r3"))
        assert await ledgers.counter(day.name) == (41, 0)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sweeps_running_at_once_release_each_reservation_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    day, month = day_hold(3), day_hold(5)
    dead = [uuid.uuid4().hex for _ in range(3)]
    alive = uuid.uuid4().hex
    async with shared(backend, request, tmp_path, processes=4) as ledgers:
        first = ledgers.ledgers[0]
        await asyncio.gather(*(reserve(ledgers.ledgers[i % 4], [day, month], Owner(p, str(i)))
                               for p in dead for i in range(20)))
        await reserve(first, [day, month], Owner(alive, "live"))
        assert await ledgers.counter(day.name) == (0, 61 * 3)
        await ledgers.silence()
        await first.heartbeat(alive)
        if backend == "sqlite":  # each worker in a thread of its own, as in processes
            sweeps = [asyncio.to_thread(asyncio.run, ledger.sweep())  # type: ignore[arg-type]
                      for ledger in ledgers.ledgers]
        else:
            sweeps = [ledger.sweep() for ledger in ledgers.ledgers]
        released = await asyncio.gather(*sweeps)
        released.append(await first.sweep())  # anything a skipped process still held
        assert sum(released) == 60
        # Never released twice: what the live process holds is held still, to the unit.
        assert await ledgers.counter(day.name) == (0, 3)
        assert await ledgers.counter(month.name) == (0, 5)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_sweep_is_bounded_and_the_next_goes_on(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in (ledger_module, ledger_redis, ledger_postgres):
        monkeypatch.setattr(module, "SWEEP_ROWS", 5)
    day = day_hold(1)
    dead = uuid.uuid4().hex
    async with shared(backend, request, tmp_path) as ledgers:
        killed, sweeper = ledgers.ledgers
        for i in range(12):
            await reserve(killed, [day], Owner(dead, str(i)))
        await ledgers.silence()
        assert [await sweeper.sweep() for _ in range(4)] == [5, 5, 2, 0]
        assert await ledgers.counter(day.name) == (0, 0)
        for i in range(12):
            await sweeper.settle([day], [1], [], [], owner=Owner(dead, str(i)))
        assert await ledgers.counter(day.name) == (12, 0)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_without_an_owner_a_reservation_is_the_counters_only(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """As before owners: no row, so nothing for a sweep to release, and every settlement
    books (leases rely on both)."""
    day = day_hold(10)
    async with shared(backend, request, tmp_path) as ledgers:
        ledger = ledgers.ledgers[0]
        await reserve(ledger, [day], None)
        await reserve(ledger, [day], None)
        await ledgers.silence()
        assert await ledgers.ledgers[1].sweep() == 0
        assert await ledgers.counter(day.name) == (0, 20)
        await ledger.settle([day], [4], [], [])
        await ledger.settle([day], [4], [], [])
        assert await ledgers.counter(day.name) == (8, 0)


# ---- the leased ledger and the quotas ----------------------------------------------------


class RecordingLedger:
    """A shared ledger that notes the owner of every call."""

    def __init__(self, shared: MemoryLedger) -> None:
        self.shared = shared
        self.backend = shared.backend
        self.reserved: list[Owner | None] = []
        self.settled: list[Owner | None] = []
        self.housekeeping: list[str] = []

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        self.reserved.append(owner)
        return await self.shared.reserve(holds, draws, owner)

    async def settle(self, *args: Any, owner: Owner | None = None, **kwargs: Any) -> None:
        self.settled.append(owner)
        await self.shared.settle(*args, owner=owner, **kwargs)

    async def heartbeat(self, process: str) -> None:
        self.housekeeping.append(f"heartbeat {process}")
        await self.shared.heartbeat(process)

    async def sweep(self) -> int:
        self.housekeeping.append("sweep")
        return await self.shared.sweep()

    async def close(self) -> None:
        return None


async def test_the_leased_ledger_passes_owners_of_requests_the_backend_decides() -> None:
    clock = Clock(time.time())
    store = MemoryLedger(clock)
    backend = RecordingLedger(store)
    leased = LeasedLedger(backend, 1.0)  # type: ignore[arg-type]
    day = Hold("usd:key:busy:d1", 10**12, 1000, clock.now + 3600)
    process = uuid.uuid4().hex
    first = Owner(process, "first")
    answer = await leased.reserve([day], [], first)
    assert answer.ticket is None and backend.reserved == [first]  # the backend decided
    assert store.take_held(first) == [day]  # a held row
    store.add_held(first, [day])
    await leased.settle([day], [400], [], [], answer.ticket, owner=first)
    assert backend.settled == [first] and store.counter(day.name) == (400, 0)
    from_leases = 0
    for i in range(60):  # busy: leases are asked for, and then requests decided from them
        answer = await leased.reserve([day], [], Owner(process, str(i)))
        from_leases += answer.ticket is not None
        await leased.settle([day], [400], [], [], answer.ticket, owner=Owner(process, str(i)))
        await asyncio.sleep(0)
    assert from_leases > 0
    decided = [owner for owner in backend.reserved if owner is not None]
    assert len(decided) == 61 - from_leases  # every request the backend decided, named
    assert None in backend.reserved  # the leases themselves: no owner, no row
    await leased.heartbeat(process)
    assert await leased.sweep() == 0
    assert backend.housekeeping == [f"heartbeat {process}", "sweep"]
    await leased.close()
    assert store.counter(day.name) == (61 * 400, 0)
    assert store.take_held_of(process, 100) == []  # every row settled


class OneBudget:
    def __init__(self, budget: Budget) -> None:
        self._budget = budget

    async def budget(self, scope: BudgetScope, scope_id: str) -> Budget | None:
        return self._budget if scope is BudgetScope.KEY else None


class BrokenLedger(MemoryLedger):
    async def heartbeat(self, process: str) -> None:
        raise ConnectionError("the ledger is down")


async def test_quotas_reserve_under_an_owner_and_keep_the_process_alive() -> None:
    clock = Clock(time.time())
    ledger = MemoryLedger(clock)
    quotas = Quotas(ledger, BudgetBook(OneBudget(Budget(BudgetScope.KEY, "k", daily_tokens=1000))),
                    PriceBook(), clock)
    limits = await quotas.limits_for("k", "s")
    assert limits is not None
    owner = Owner(uuid.uuid4().hex, "request")
    decision = await quotas.reserve(limits, prompt_tokens=10, requested_cap=20, default_cap=None,
                                    targets=[], owner=owner)
    assert isinstance(decision, QuotaDecision) and decision.reservation is not None
    reservation = decision.reservation
    assert reservation.owner == owner
    (hold,) = reservation.holds
    assert ledger.counter(hold.name) == (0, 30)
    await quotas.keep_alive(owner.process)
    clock.now += ORPHAN_SECONDS / 2
    await quotas.keep_alive(owner.process)  # heard of again: not swept
    clock.now += ORPHAN_SECONDS / 2 + 1
    await quotas.keep_alive("another process")
    assert ledger.counter(hold.name) == (0, 30)
    clock.now += ORPHAN_SECONDS + 1
    await quotas.keep_alive("another process")  # the owner's process is gone: released
    assert ledger.counter(hold.name) == (0, 0)
    await quotas.settle_orphan(reservation, 25, None)  # a replay after the crash
    await quotas.settle(reservation, 25, Decimal(0))  # and once more: nothing
    assert ledger.counter(hold.name) == (25, 0)
    with pytest.raises(ValueError):
        await quotas.settle_orphan(dataclasses.replace(reservation, owner=None), 25, None)
    broken = Quotas(BrokenLedger(), quotas.budgets, PriceBook(), clock)
    await broken.keep_alive(owner.process)  # housekeeping never raises
