"""Leases (llm_gateway.leases): busy keys far from their limits decided in process, never
past a limit, and every unit booked back in the shared store.

The pure rule first, fed the time; then the limiter and the ledger wrappers over a store
several "replicas" share (the in-process backends, then Redis and the workers' file,
then Postgres's ledger); then `serve` on a Redis of its own, where what Redis holds after
the gateway stops is held to the usage records.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gateway.adapters.asgi import create_app
from llm_gateway.billing.ledger import Draw, Hold, Ledger, LedgerAnswer, MemoryLedger
from llm_gateway.billing.ledger_leased import LeasedLedger
from llm_gateway.billing.ledger_postgres import PostgresLedger
from llm_gateway.billing.ledger_redis import RedisLedger
from llm_gateway.billing.model import BudgetScope
from llm_gateway.billing.quotas import usd_units
from llm_gateway.config import FailurePolicy, RateLimitAlgorithm
from llm_gateway.leases import FIRST, FLOOR, LEASE_AFTER, SHARE, LeaseBook, lease_size
from llm_gateway.limits import (
    Granted,
    Guard,
    LimitDecision,
    LimiterUnavailable,
    MemoryRateLimiter,
    bucket_name,
    window_start,
)
from llm_gateway.limits.failover import FailoverRateLimiter
from llm_gateway.limits.leased import LeasedRateLimiter
from llm_gateway.limits.postgres import PostgresRateLimiter
from llm_gateway.limits.redis import RedisRateLimiter, window_key
from llm_gateway.limits.sqlite import SqliteRateLimiter, WorkersFile
from llm_gateway.stores import open_store
from llm_gateway.stores.postgres import PostgresStore
from llm_gateway.wiring import build_gateway
from tests.billing_support import set_budget, set_price
from tests.conftest import make_settings
from tests.support import (
    create_key,
    gateway_processes,
    private_redis,
    roomy_window,
    serve_in_thread,
    usage_records,
)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- the rule ------------------------------------------------------------------------


def test_a_lease_is_a_share_of_what_is_left_and_none_near_the_limit() -> None:
    assert lease_size(1, FLOOR - 1, 0) == 0  # near the limit: every request to the store
    assert lease_size(1, 10**9, 0) == FIRST  # a first lease: a few requests' worth
    assert lease_size(1, 10**9, 5000) == 10_000  # then twice the use of a period
    assert lease_size(1, 80_000, 100_000) == 80_000 // SHARE  # never more than a share
    assert lease_size(40, 40 * FLOOR - 1, 0) == 0  # the floor counts requests like this one


def test_only_a_name_busy_in_this_process_is_leased() -> None:
    clock = Clock()
    book = LeaseBook(1.0, clock)
    for _ in range(LEASE_AFTER - 1):
        assert book.wanted("key", 1, 10**6) == 0
    clock.now += 1.0  # a new period: the count starts again (one request a second: never)
    for _ in range(LEASE_AFTER - 1):
        assert book.wanted("key", 1, 10**6) == 0
    assert book.wanted("key", 1, 10**6) == 2 * LEASE_AFTER  # busy now: twice its demand
    assert book.wanted("key", 1, 10**6) == 0  # being asked for: not twice


def test_a_lease_serves_all_or_nothing_until_it_is_used_up_or_its_time_is_up() -> None:
    clock = Clock()
    book = LeaseBook(1.0, clock)
    usd = book.granted("usd", 100, 10**6, clock.now, "tag")
    book.granted("tok", 10, 10**6, clock.now, "tag")
    assert book.take([("usd", 60), ("tok", 20)]) is None  # one has no room: nothing taken
    assert usd.free == 100
    taken = book.take([("usd", 60), ("tok", 5)])
    assert taken is not None and usd.free == 40 and usd.in_flight == 60
    assert book.take([("usd", 50)]) is None  # used up
    book.settle(usd, 60, 15)  # spent less than reserved: the rest is free again
    assert (usd.free, usd.in_flight, usd.spent) == (85, 0, 15)
    assert book.take([("nothing leased", 1)]) is None
    clock.now += 1.0
    assert book.take([("usd", 1)]) is None  # its time is up
    ended = book.ended()
    assert {lease.name for lease in ended} == {"usd", "tok"}
    assert usd.give_back() == 85 and usd.booked


def test_a_lease_half_used_asks_for_more_which_is_added_to_it() -> None:
    clock = Clock()
    book = LeaseBook(1.0, clock)
    lease = book.granted("key", 100, 10**6, clock.now, "tag")
    for _ in range(50):
        assert book.take([("key", 1)]) == (lease,)
        book.count(lease, 1)
        assert book.renewal(lease, 1) == 0
    clock.now += 0.1
    assert book.take([("key", 1)]) == (lease,)
    book.count(lease, 1)
    # 51 used in a tenth of a period: 510 a period, twice over.
    assert book.renewal(lease, 1) == 1020
    assert book.renewal(lease, 1) == 0  # asked for once
    clock.now += 0.5
    assert book.granted("key", 1020, 10**6, clock.now, "tag") is lease  # one lease
    assert (lease.held, lease.free, lease.spent) == (1120, 1069, 51)
    assert lease.ends == clock.now + 1.0  # its time starts again
    assert book.ended() == []
    clock.now += 1.0
    assert book.ended() == [lease] and lease.give_back() == 1069


def test_a_reservation_settled_after_its_lease_was_booked_settles_in_the_store() -> None:
    clock = Clock()
    book = LeaseBook(1.0, clock)
    lease = book.granted("usd", 100, 10**6, clock.now, "tag")
    assert book.take([("usd", 30)]) == (lease,)
    clock.now += 2
    assert book.ended() == [lease]
    assert lease.give_back() == 70  # the 30 under way stay held in the store
    assert not book.settle(lease, 30, 12)  # so this one is settled there


def test_a_name_the_store_refused_is_not_asked_again_within_the_period() -> None:
    clock = Clock()
    book = LeaseBook(1.0, clock)
    for _ in range(LEASE_AFTER - 1):
        book.wanted("key", 1, 10**6)
    assert book.wanted("key", 1, 10**6) > 0
    book.refused("key")
    assert book.wanted("key", 1, 10**6) == 0
    clock.now += 1.0
    for _ in range(LEASE_AFTER - 1):
        book.wanted("key", 1, 10**6)
    assert book.wanted("key", 1, 10**6) > 0


# ---- the limiter ------------------------------------------------------------------------


class CountingLimiter:
    """A backend that counts what it was asked (and forwards to a shared one)."""

    def __init__(self, backend: Any) -> None:
        self.inner = backend
        self.backend = getattr(backend, "backend", "memory")
        self.takes = 0
        self.leases = 0

    async def take(self, *args: Any, **kwargs: Any) -> LimitDecision:
        self.takes += 1
        return await self.inner.take(*args, **kwargs)  # type: ignore[no-any-return]

    async def lease(self, *args: Any, **kwargs: Any) -> Granted:
        self.leases += 1
        return await self.inner.lease(*args, **kwargs)  # type: ignore[no-any-return]

    async def give_back(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.give_back(*args, **kwargs)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        return None


async def window_count(store: MemoryRateLimiter, key: str, limit: int, window: int) -> int:
    """What the shared window counts now (its own state: a look answers "room or not")."""
    start, count = store._counter._windows.get(bucket_name(key, limit, window), (0.0, 0))
    return count if start == window_start(store._clock(), window) else 0


async def drive(limiters: list[LeasedRateLimiter], key: str, limit: int, window: int,
                requests: int, guard: Guard | None = None) -> int:
    """``requests`` per replica, ten at a time each; the number admitted."""
    admitted = 0

    async def replica(limiter: LeasedRateLimiter) -> None:
        nonlocal admitted
        for _ in range(requests // 10):
            decisions = await asyncio.gather(*(limiter.take(key, limit, window, guard=guard)
                                               for _ in range(10)))
            admitted += sum(d.allowed for d in decisions)
            await asyncio.sleep(0)  # the leases' own calls get their turn

    await asyncio.gather(*(replica(limiter) for limiter in limiters))
    return admitted


async def test_replicas_on_leases_never_pass_the_limit_and_give_back_what_they_left() -> None:
    store = MemoryRateLimiter()
    backends = [CountingLimiter(store) for _ in range(4)]
    replicas = [LeasedRateLimiter(backend, 1.0) for backend in backends]  # type: ignore[arg-type]
    limit, window = 50_000, 3600
    admitted = await drive(replicas, "busy", limit, window, 2000)
    assert admitted == 8000
    asked = sum(b.takes + b.leases for b in backends)
    assert asked < 800, asked  # nearly every request was decided in its replica
    counted = await window_count(store, "busy", limit, window)
    assert admitted <= counted <= limit  # what was admitted, and leases not used yet
    for replica in replicas:
        await replica.close()
    assert await window_count(store, "busy", limit, window) == admitted  # all given back


async def test_at_the_limit_replicas_on_leases_admit_it_and_no_more() -> None:
    store = MemoryRateLimiter()
    replicas = [LeasedRateLimiter(store, 1.0) for _ in range(4)]  # type: ignore[arg-type]
    limit, window = 6000, 3600
    admitted = await drive(replicas, "spender", limit, window, 2500)
    assert admitted <= limit
    for replica in replicas:
        await replica.close()
    assert await window_count(store, "spender", limit, window) == admitted
    # Whatever leases held when the burst ended came back: the rest of the limit is there,
    # request by request, exactly.
    fresh = LeasedRateLimiter(store, 1.0)  # type: ignore[arg-type]
    more = 0
    while (await fresh.take("spender", limit, window)).allowed:
        more += 1
    assert admitted + more == limit


async def test_a_look_at_a_leased_window_is_answered_from_the_lease() -> None:
    store = CountingLimiter(MemoryRateLimiter())
    limiter = LeasedRateLimiter(store, 1.0)  # type: ignore[arg-type]
    await drive([limiter], "tokens:provider", 10**9, 60, 100)
    asked = store.takes
    look = await limiter.take("tokens:provider", 10**9, 60, cost=0)
    assert look.allowed and look.leased and store.takes == asked  # no call to the store
    await limiter.close()


async def test_counting_a_failure_ends_the_leases_of_the_key_it_guards() -> None:
    store = MemoryRateLimiter()
    limiter = LeasedRateLimiter(CountingLimiter(store), 1.0)  # type: ignore[arg-type]
    guard = Guard("key!upstream-4xx", 2, 60)
    await drive([limiter], "key", 10**6, 60, 200, guard)
    assert len(limiter.book) == 1  # leased
    for _ in range(2):  # the key's failed-request budget used up (on any replica)
        await limiter.take("key!upstream-4xx", 2, 60)
    assert len(limiter.book) == 0
    decision = await limiter.take("key", 10**6, 60, guard=guard)
    assert decision.guarded and not decision.leased  # the store's answer, the guard seen
    await limiter.close()


class FlakyLimiter(CountingLimiter):
    """A backend that stops answering when told to."""

    down = False

    async def take(self, *args: Any, **kwargs: Any) -> LimitDecision:
        if self.down:
            raise LimiterUnavailable("redis", ConnectionError("gone"))
        return await super().take(*args, **kwargs)

    async def lease(self, *args: Any, **kwargs: Any) -> Granted:
        if self.down:
            raise LimiterUnavailable("redis", ConnectionError("gone"))
        return await super().lease(*args, **kwargs)

    async def give_back(self, *args: Any, **kwargs: Any) -> None:
        if self.down:
            raise LimiterUnavailable("redis", ConnectionError("gone"))
        await super().give_back(*args, **kwargs)


async def test_a_backend_going_away_leaves_leases_to_end_and_the_policy_to_answer() -> None:
    monotonic = Clock(10.0)
    backend = FlakyLimiter(MemoryRateLimiter())
    leased = LeasedRateLimiter(backend, 1.0, clock=monotonic)  # type: ignore[arg-type]
    limiter = FailoverRateLimiter(leased, FailurePolicy.FAIL_CLOSED, clock=monotonic)
    await drive([leased], "key", 10**6, 3600, 100)
    assert len(leased.book) == 1
    backend.down = True
    # Room the backend granted is still room: the lease answers, and says nothing of the
    # backend (fail-closed does not refuse what was granted, nor calls it back up).
    decision = await limiter.take("key", 10**6, 3600)
    assert decision.allowed and decision.leased and not limiter.outage.is_down
    monotonic.now += 1.0  # the lease is over; the next request is the backend's
    with pytest.raises(LimiterUnavailable):
        await limiter.take("key", 10**6, 3600)
    assert limiter.outage.is_down
    await leased.close()  # its lease given back to nobody: logged, not raised


async def test_a_lease_ends_with_its_window() -> None:
    wall = Clock(3600 * 1000 + 3590.0)  # ten seconds before an hour's window ends
    monotonic = Clock(50.0)
    store = MemoryRateLimiter(clock=wall)
    limiter = LeasedRateLimiter(store, 30.0, clock=monotonic)  # type: ignore[arg-type]
    await drive([limiter], "key", 10**6, 3600, 100)
    assert len(limiter.book) == 1
    lease = next(iter(limiter.book._live.values()))
    assert lease.ends == pytest.approx(lease.asked_at + 10.0)  # the window's end, not 30 s
    wall.now += 10.0
    monotonic.now += 10.0
    decision = await limiter.take("key", 10**6, 3600)
    assert not decision.leased  # the next window is the store's first
    await limiter.close()


# ---- the limiter's backends ---------------------------------------------------------------


@asynccontextmanager
async def leasing_backend(kind: str, tmp_path: Path,
                          request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if kind == "memory":
        yield MemoryRateLimiter()
    elif kind == "sqlite":
        limiter = SqliteRateLimiter(WorkersFile(tmp_path / "workers.db"))
        yield limiter
        await limiter.close()
    elif kind == "redis":
        limiter = RedisRateLimiter(request.getfixturevalue("redis_url"),
                                   namespace=f"leases-{time.monotonic_ns()}")
        yield limiter
        await limiter.close()
    else:
        store = open_store(request.getfixturevalue("postgres_url"))
        assert isinstance(store, PostgresStore)
        await store.migrate()
        yield PostgresRateLimiter(store)
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
async def test_a_backend_leases_and_gives_back_as_the_memory_limiter_does(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    key = f"key-{time.monotonic_ns()}"
    guard = Guard(f"{key}!upstream-4xx", 1, 3600)

    async def steps(limiter: Any) -> list[tuple[int, ...]]:
        answers: list[tuple[int, ...]] = []
        for amount in (40, 50, 11, 10):  # the third does not fit under 100
            granted = await limiter.lease(key, 100, 3600, amount, guard)
            answers.append((granted.amount, granted.count if granted.amount else -1))
        await limiter.give_back(key, 100, 3600, 30, granted.window)
        await limiter.give_back(key, 100, 3600, 5, granted.window - 3600)  # an old window
        decision = await limiter.take(key, 100, 3600)
        answers.append((decision.allowed, decision.remaining))
        granted = await limiter.lease(key, 100, 3600, 2, guard)  # a lease as small as 2
        answers.append((granted.amount, granted.count))
        await limiter.take(guard.key_id, 1, 3600)  # the guard full: no lease
        granted = await limiter.lease(key, 100, 3600, 1, guard)
        answers.append((granted.amount,))
        return answers

    async with leasing_backend(kind, tmp_path, request) as backend:
        assert await steps(MemoryRateLimiter()) == await steps(backend)


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
async def test_replicas_on_a_shared_backend_with_leases_book_every_request(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    key, limit, window = f"busy-{time.monotonic_ns()}", 10**6, 3600
    async with leasing_backend(kind, tmp_path, request) as backend:
        # Four replicas' limiters on the backend's state: connections of their own.
        if kind == "sqlite":
            shared = [SqliteRateLimiter(WorkersFile(tmp_path / "workers.db")) for _ in range(4)]
        elif kind == "redis":
            shared = [RedisRateLimiter(request.getfixturevalue("redis_url"),
                                       namespace=backend.namespace) for _ in range(4)]
        else:
            shared = [backend] * 4
        counting = [CountingLimiter(limiter) for limiter in shared]
        replicas = [LeasedRateLimiter(c, 1.0) for c in counting]  # type: ignore[arg-type]
        admitted = await drive(replicas, key, limit, window, 1000)
        assert admitted == 4000
        assert sum(c.takes + c.leases for c in counting) < 600
        for replica in replicas:
            await replica.close()
        if kind != "postgres":
            for limiter in shared:
                await limiter.close()
        # The backend counted every admitted request, once: the rest of the limit is there
        # to the unit, and no more.
        assert (await backend.lease(key, limit, window, limit - admitted)).amount > 0
        assert (await backend.lease(key, limit, window, 1)).amount == 0


# ---- the ledger -----------------------------------------------------------------------


class CountingLedger:
    def __init__(self, shared: Ledger) -> None:
        self.shared = shared
        self.backend = shared.backend
        self.reserves = 0

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer:
        self.reserves += 1
        return await self.shared.reserve(holds, draws)

    async def settle(self, *args: Any, **kwargs: Any) -> None:
        await self.shared.settle(*args, **kwargs)

    async def close(self) -> None:
        return None


async def spend(ledgers: list[LeasedLedger], holds: list[Hold], draws: list[Draw],
                requests: int, rng: random.Random) -> tuple[int, int]:
    """``requests`` per replica, eight under way at a time each, each spending between a
    fifth of its reservation and a little more than it: (granted, units spent)."""
    granted = spent = 0

    async def one(ledger: LeasedLedger) -> None:
        nonlocal granted, spent
        answer = await ledger.reserve(holds, draws)
        if not answer.granted:
            return
        granted += 1
        await asyncio.sleep(0)
        cost = [int(h.amount * rng.uniform(0.2, 1.1)) for h in holds]
        used = [int(d.amount * rng.uniform(0.2, 1.1)) for d in draws]
        spent += cost[0]
        await ledger.settle(holds, cost, draws, used, answer.ticket)

    async def replica(ledger: LeasedLedger) -> None:
        for _ in range(requests // 8):
            await asyncio.gather(*(one(ledger) for _ in range(8)))

    await asyncio.gather(*(replica(ledger) for ledger in ledgers))
    return granted, spent


async def test_replicas_reserving_from_leases_book_exactly_what_was_spent() -> None:
    frozen = Clock(time.time())  # a bucket that does not refill: its level tells all
    store = MemoryLedger(clock=frozen)
    backends = [CountingLedger(store) for _ in range(4)]
    ledgers = [LeasedLedger(backend, 1.0) for backend in backends]  # type: ignore[arg-type]
    day = Hold("usd:key:k:d1", 10**12, 5000, frozen.now + 3600)
    tpm = Draw("tpm:key:k", 10**9, 300)
    granted, spent = await spend(ledgers, [day], [tpm], 800, random.Random(7))
    assert granted == 3200
    assert sum(b.reserves for b in backends) < 500
    for ledger in ledgers:
        await ledger.close()
    assert store.counter(day.name) == (spent, 0)  # every unit spent booked, none held
    level = store.bucket(tpm.name)
    assert level is not None and tpm.capacity - level[0] > 0


async def test_the_bucket_gets_back_what_leases_did_not_use() -> None:
    frozen = Clock(time.time())
    store = MemoryLedger(clock=frozen)
    ledger = LeasedLedger(store, 1.0)
    tpm = Draw("tpm:key:k", 10**9, 1000)
    used_total = 0
    for _ in range(200):
        answer = await ledger.reserve([], [tpm])
        await ledger.settle([], [], [tpm], [400], answer.ticket)
        used_total += 400
    await ledger.close()
    level = store.bucket(tpm.name)
    assert level is not None and level[0] == tpm.capacity - used_total


async def test_a_budget_lowered_while_leased_is_the_stores_to_decide_at_once() -> None:
    store = MemoryLedger()
    ledger = LeasedLedger(store, 1.0)
    day = Hold("usd:key:k:d1", 10**9, 1000, time.time() + 3600)
    for _ in range(40):
        answer = await ledger.reserve([day], [])
        await ledger.settle([day], [1000], [], [], answer.ticket)
        await asyncio.sleep(0)
    assert len(ledger.book) == 1  # leased
    lowered = Hold(day.name, 20_000, 1000, day.expires_at)  # less than is spent already
    answer = await ledger.reserve([lowered], [])
    assert not answer.granted and answer.ticket is None
    await ledger.close()


async def test_a_budget_near_its_end_is_reserved_request_by_request() -> None:
    store = CountingLedger(MemoryLedger())
    ledger = LeasedLedger(store, 1.0)  # type: ignore[arg-type]
    day = Hold("usd:key:small:d1", 50 * 1000, 1000, time.time() + 3600)  # fits 50
    answers = []
    for _ in range(60):
        answer = await ledger.reserve([day], [])
        answers.append(answer.granted)
        if answer.granted:
            await ledger.settle([day], [1000], [], [], answer.ticket)
    assert answers == [True] * 50 + [False] * 10
    assert store.reserves == 60 and len(ledger.book) == 0  # the store saw every one
    await ledger.close()


@pytest.mark.parametrize("backend", ["redis", "postgres"])
async def test_replicas_on_a_shared_ledger_with_leases_book_exactly_what_was_spent(
    backend: str, request: pytest.FixtureRequest,
) -> None:
    owner = f"key:{time.monotonic_ns()}"
    day = Hold(f"usd:{owner}:d1", 10**12, 5000, time.time() + 3600)
    store: PostgresStore | None = None
    if backend == "redis":
        namespace = f"ledger-leases-{time.monotonic_ns()}"
        shared: list[Ledger] = [RedisLedger(request.getfixturevalue("redis_url"),
                                            namespace=namespace) for _ in range(4)]
        reader: Ledger = RedisLedger(request.getfixturevalue("redis_url"),
                                     namespace=namespace)
    else:
        opened = open_store(request.getfixturevalue("postgres_url"))
        assert isinstance(opened, PostgresStore)
        store = opened
        await store.migrate()
        shared = [PostgresLedger(store) for _ in range(4)]
        reader = PostgresLedger(store)
    try:
        ledgers = [LeasedLedger(ledger, 1.0) for ledger in shared]
        granted, spent = await spend(ledgers, [day], [], 400, random.Random(11))
        assert granted == 1600
        for ledger in ledgers:
            await ledger.close()
        # What is left is what was not spent: a reservation of it all is granted exactly.
        left = await reader.reserve([Hold(day.name, day.limit, day.limit - spent,
                                          day.expires_at)], [])
        assert left.granted and left.left == {day.name: day.limit - spent}
        assert not (await reader.reserve([Hold(day.name, day.limit, 1, day.expires_at)],
                                         [])).granted
        await reader.close()
    finally:
        if store is not None:
            await store.close()


# ---- serve -------------------------------------------------------------------------


def redis_calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_serve_on_leases_asks_redis_for_few_requests_and_books_every_one(
    tmp_path: Path, fake_url: str,
) -> None:
    requests = 400
    with private_redis(tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        # The fixed window's count is what is held to the requests below (the bucket's
        # form: tests/test_token_bucket.py).
        settings = make_settings(tmp_path, fake_url, redis_url=server.url,
                                 redis_namespace="leases",
                                 rate_limit_algorithm=RateLimitAlgorithm.FIXED_WINDOW)
        record, key = create_key(settings.database_url, rate_limit_requests=10**6,
                                 rate_limit_window_seconds=3600)
        set_price(settings.database_url, "venice", "llama-3.3-70b", "0.70", "2.80")
        set_budget(settings.database_url, BudgetScope.KEY, record.id,
                   daily_usd=Decimal("1000"), tokens_per_minute=10**9)
        gateway = build_gateway(settings, key_cache_seconds=0)
        before = redis_calls(client, "evalsha")
        with serve_in_thread(create_app(settings, gateway=gateway)) as url, \
                httpx.Client(base_url=url, timeout=30) as http:
            for _ in range(requests):
                answer = http.post("/v1/chat/completions", headers={
                    "authorization": f"Bearer {key}"}, json={
                    "model": "llama-3.3-70b", "max_tokens": 100,
                    "messages": [{"role": "user", "content": "Hello"}]})
                assert answer.status_code == 200, answer.text
            during = redis_calls(client, "evalsha") - before
            metrics = http.get("/metrics").text
        for component in ("rate_limiter", "budget_ledger"):
            decided = next(
                float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith("llm_gateway_lease_decisions_total{")
                and f'component="{component}"' in line and 'backend="redis"' in line)
            assert decided > requests * 0.8, (component, decided)
        # Stopped: every lease booked. The window counted each request once; the day's
        # budget holds what the usage records cost, and nothing reserved.
        window = client.hgetall(window_key(record.id, 10**6, 3600, "leases"))
        assert int(window[b"count"]) == requests
        records = usage_records(settings.database_url)
        assert len(records) == requests and all(r.cost_usd for r in records)
        day = next(name for name in client.scan_iter("leases:{budgets}:usd:*:d*"))
        counter = client.hgetall(day)
        assert int(counter[b"spent"]) == sum(usd_units(r.cost_usd or 0) for r in records)
        assert int(counter.get(b"reserved", 0)) == 0
        # Two scripts a request without leases; with them, a few for the first requests
        # and about two for each lease.
        print(f"{during} script calls to Redis for {requests} requests")
        assert during < requests / 4, during


def test_four_replicas_on_leases_book_every_request_and_every_cent(
    tmp_path: Path, fake_url: str, postgres_url: str, redis_url: str,
) -> None:
    """Four `serve` processes sharing Postgres and Redis, a busy key with a rate limit of
    3 000 (a fixed window: the bucket's form is in tests/test_token_bucket.py) and a daily
    budget: 4 000 requests at once over them admit no more than the limit; stopped, Redis
    holds exactly what was admitted and spent; the rest of the limit is there to the
    request."""
    # A window that ended during the burst would admit up to the limit again (a CI run
    # once crossed the hour with 3 600 and admitted 4 000).
    limit, window = 3000, roomy_window(margin=600)
    set_price(postgres_url, "venice", "llama-3.3-70b", "0.70", "2.80")
    record, key = create_key(postgres_url, rate_limit_requests=limit,
                             rate_limit_window_seconds=window)
    set_budget(postgres_url, BudgetScope.KEY, record.id, daily_usd=Decimal("1000"))
    namespace = f"leases-{time.monotonic_ns()}"
    env = {"DATABASE_URL": postgres_url, "REDIS_URL": redis_url, "REDIS_NAMESPACE": namespace,
           "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "ADMIN_BIND_ADDR": "off", "ACCESS_LOG": "off", "RATE_LIMIT_ALGORITHM": "fixed-window",
           "USAGE_SPOOL_DIR": str(tmp_path / "spool")}
    body = {"model": "llama-3.3-70b", "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hello"}]}

    async def burst(urls: list[str], count: int) -> list[int]:
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            gate = asyncio.Semaphore(32)

            async def one(index: int) -> int:
                async with gate:
                    answer = await client.post(
                        urls[index % len(urls)] + "/v1/chat/completions", json=body,
                        headers={"authorization": f"Bearer {key}"})
                    return answer.status_code

            return await asyncio.gather(*(one(i) for i in range(count)))

    decided = substituted = 0.0
    with gateway_processes(env, 4) as replicas:
        statuses = asyncio.run(burst([r.url for r in replicas], 4000))
        for replica in replicas:
            metrics = httpx.get(replica.url + "/metrics").text.splitlines()
            decided += metric_sum(metrics, "llm_gateway_lease_decisions_total{")
            substituted += metric_sum(metrics, "llm_gateway_backend_substitutions_total{")
    admitted = statuses.count(200)
    print(f"4 replicas: {admitted} of 4000 admitted against {limit}, {decided:.0f} from leases,"
          f" {substituted:.0f} without a backend")
    assert substituted == 0  # Redis answered throughout: the limit is the shared one
    assert set(statuses) <= {200, 429} and admitted <= limit
    assert decided > 1000  # leases did most of the deciding
    client = redis.Redis.from_url(redis_url)
    counted = client.hget(window_key(record.id, limit, window, namespace), "count")
    assert int(counted or 0) == admitted  # every lease given back, every request counted
    records = [r for r in usage_records(postgres_url) if r.status == 200]
    assert len(records) == admitted
    day = next(iter(client.scan_iter(f"{namespace}:{{budgets}}:usd:key:*")))
    counter = client.hgetall(day)
    assert int(counter[b"spent"]) == sum(usd_units(r.cost_usd or 0) for r in records)
    assert int(counter.get(b"reserved", 0)) == 0
    with gateway_processes(env, 1) as replicas:
        more = asyncio.run(burst([replicas[0].url], limit - admitted + 50))
    assert more.count(200) == limit - admitted  # the rest of the limit, and no more


def metric_sum(lines: list[str], prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


# ---- any order of events -----------------------------------------------------------------

# An event for one of three replicas: a request reserving (amount in tens of units) and
# maybe settling at once (spent as a share of it: up to 150 %: an estimate can be short),
# a burst of such requests,
# a request under way settling, time passing (in hundredths of a lease period: some leases
# end, most are used), the tick.
_RESERVE = st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(1, 40),
                    st.none() | st.integers(0, 150))
EVENTS = st.lists(st.one_of(
    _RESERVE, _RESERVE, _RESERVE,
    # a busy spell on one replica: enough requests in a period to be leased
    st.tuples(st.just("burst"), st.integers(0, 2), st.integers(8, 40), st.integers(1, 40),
              st.integers(0, 150)),
    st.tuples(st.just("settle"), st.integers(0, 2), st.integers(0, 50), st.integers(0, 150)),
    st.tuples(st.just("time"), st.integers(1, 60)),
    st.tuples(st.just("tick"), st.integers(0, 2)),
), min_size=30, max_size=200)


LEASED: list[int] = []  # per example, the requests reserved from leases (to look at)


@settings(max_examples=150, deadline=None)
@given(events=EVENTS, limit_units=st.integers(2000, 100_000) | st.integers(10**6, 10**8))
def test_whatever_happens_a_budget_on_leases_is_never_passed_and_books_every_unit(
    events: list[tuple[Any, ...]], limit_units: int,
) -> None:
    """Three replicas' leased ledgers over one counter and one bucket, fed any order of
    reservations, settlements (some spending more than reserved), time and ticks: what the
    store holds never passes the limit by more than what was spent past reservations, and
    once every request is settled and every ledger closed, the store holds exactly what
    was spent."""

    async def run() -> None:
        wall, monotonic = Clock(time.time()), Clock(100.0)
        store = MemoryLedger(clock=wall)
        ledgers = [LeasedLedger(store, 1.0, clock=monotonic) for _ in range(3)]
        under_way: list[tuple[LeasedLedger, Hold, Draw, object]] = []
        spent = used = over = 0

        def settle_args(hold: Hold, draw: Draw, share: int) -> tuple[int, int]:
            return hold.amount * share // 100, draw.amount * share // 100

        expanded = []
        for event in events:
            if event[0] == "burst":
                _, which, count, tens, share = event
                expanded += [("reserve", which, tens, share)] * count
            else:
                expanded.append(event)
        for event in expanded:
            if event[0] == "reserve":
                _, which, tens, share = event
                hold = Hold("usd:key:k:d1", limit_units, tens * 10, wall.now + 86400)
                draw = Draw("tpm:key:k", 10**12, tens * 10)
                answer = await ledgers[which].reserve([hold], [draw])
                if not answer.granted:
                    continue
                if share is None:
                    under_way.append((ledgers[which], hold, draw, answer.ticket))
                    continue
                cost, tokens = settle_args(hold, draw, share)
                spent, used, over = spent + cost, used + tokens, over + max(0, cost - hold.amount)
                await ledgers[which].settle([hold], [cost], [draw], [tokens], answer.ticket)
            elif event[0] == "settle" and under_way:
                _, _, index, share = event
                ledger, hold, draw, ticket = under_way.pop(index % len(under_way))
                cost, tokens = settle_args(hold, draw, share)
                spent, used, over = spent + cost, used + tokens, over + max(0, cost - hold.amount)
                await ledger.settle([hold], [cost], [draw], [tokens], ticket)
            elif event[0] == "time":
                monotonic.now += event[1] / 100
            elif event[0] == "tick":
                ledger = ledgers[event[1]]
                await ledger._book(ledger.book.ended())  # what the keeper's tick does
            booked, reserved = store.counter("usd:key:k:d1")
            assert booked + reserved <= limit_units + over
            await asyncio.sleep(0)  # the leases' own calls
        for ledger, hold, draw, ticket in under_way:
            await ledger.settle([hold], [hold.amount], [draw], [draw.amount], ticket)
            spent += hold.amount
            used += draw.amount
        LEASED.append(sum(ledger.book.decisions for ledger in ledgers))
        for ledger in ledgers:
            await ledger.close()
        assert store.counter("usd:key:k:d1") == (spent, 0)
        level = store.bucket("tpm:key:k")
        assert level is None or level[0] == 10**12 - used

    asyncio.run(run())


TAKES = st.lists(st.one_of(
    st.tuples(st.just("take"), st.integers(0, 2), st.integers(1, 60)),  # a burst of requests
    st.tuples(st.just("time"), st.integers(1, 60)),  # hundredths of a lease period
    st.tuples(st.just("tick"), st.integers(0, 2)),
), min_size=5, max_size=60)


@settings(max_examples=150, deadline=None)
@given(events=TAKES, limit=st.integers(1, 3000) | st.integers(5000, 10**6))
def test_whatever_happens_a_rate_limit_on_leases_counts_each_request_once(
    events: list[tuple[Any, ...]], limit: int,
) -> None:
    """Three replicas' leased limiters over one window, fed requests, time and ticks: the
    window never counts past the limit; closed, it counts exactly what was admitted."""

    async def run() -> None:
        monotonic = Clock(100.0)
        store = MemoryRateLimiter(clock=Clock(3600 * 500))  # a window just begun
        limiters = [LeasedRateLimiter(store, 1.0, clock=monotonic)  # type: ignore[arg-type]
                    for _ in range(3)]
        admitted = 0
        for event in events:
            if event[0] == "take":
                for _ in range(event[2]):
                    admitted += (await limiters[event[1]].take("key", limit, 3600)).allowed
            elif event[0] == "time":
                monotonic.now += event[1] / 100
            else:
                limiter = limiters[event[1]]
                await limiter._give_back(limiter.book.ended())  # what the keeper's tick does
            await asyncio.sleep(0)
            assert await window_count(store, "key", limit, 3600) <= limit
        for limiter in limiters:
            await limiter.close()
        assert admitted <= limit
        assert await window_count(store, "key", limit, 3600) == admitted

    asyncio.run(run())
