"""Request limits as token buckets (issue 32): a key's limit of N requests per W seconds
as a bucket of its burst (default N) refilled at N / W per second, on every backend.

The pure rule first (one refill for the limiter's buckets and the ledger's, admitted never
more than burst + rate x span, fed any request times); the window's edge, where a fixed
window admits 2N and the bucket N and its refill; then each backend (memory, the workers'
file, Redis, Postgres) exact under 200 concurrent takes, its guard, its leases and its
clock; then `serve`: four replicas admitting exactly the burst (test_replicas.py's form),
and four on leases booking every request (test_leases.py's form).

Marked slow_once: nothing here reads the second CI pass's shared settings (the backends are
named by the fixtures), and the replicas are processes.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gateway.billing.ledger import Draw, bucket_level
from llm_gateway.buckets import refill
from llm_gateway.config import ConfigError, RateLimitAlgorithm, load_settings
from llm_gateway.keys import KeyRecord
from llm_gateway.limits import (
    Guard,
    LimitDecision,
    MemoryRateLimiter,
    bucket_name,
    request_burst,
    take_from_bucket,
    window_start,
)
from llm_gateway.limits.leased import LeasedRateLimiter
from llm_gateway.limits.postgres import PostgresRateLimiter
from llm_gateway.limits.redis import RedisRateLimiter, bucket_key
from llm_gateway.limits.sqlite import SqliteRateLimiter, WorkersFile
from llm_gateway.redis_scripts import Script
from llm_gateway.stores import open_store
from llm_gateway.stores.postgres import PostgresStore
from tests.support import create_key, gateway_processes

pytestmark = pytest.mark.slow_once

# The longest window a key may have (31 days): a bucket that barely refills while a test
# runs, so what it admits is its burst to the request (refill: ~0.001 token a second).
SLOW_WINDOW = 31 * 86400


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- the rule --------------------------------------------------------------------------


def test_the_limiter_and_the_ledger_refill_by_one_rule() -> None:
    assert refill(2.0, 100.0, 103.0, 10.0, 0.5) == 3.5
    assert refill(9.0, 100.0, 110.0, 10.0, 0.5) == 10.0  # never above the capacity
    assert refill(4.0, 100.0, 90.0, 10.0, 0.5) == 4.0  # a clock stepped back: nothing
    draw = Draw("tpm:key:k", 600, 1)  # the ledger's tokens per minute: 10 a second
    assert bucket_level(draw, (100.0, 50.0), 60.0) == refill(100.0, 50.0, 60.0, 600, 10.0)
    assert bucket_level(draw, None, 60.0) == 600.0  # never written: full


@settings(max_examples=300, deadline=None)
@given(burst=st.integers(1, 20), limit=st.integers(1, 50), window=st.integers(1, 120),
       gaps=st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=150))
def test_over_any_span_a_bucket_admits_at_most_its_burst_and_its_refill(
    burst: int, limit: int, window: int, gaps: list[float],
) -> None:
    """Requests at any times: in every span between two of them no more are admitted than
    burst + rate x span; and each decision is the exact bucket's (computed apart, in
    fractions), but where the exact level is a hair from one token (rounding decides)."""
    rate = Fraction(limit, window)
    state: tuple[float, float] | None = None
    exact, exact_at = Fraction(burst), None
    now, admitted_at = 1_700_000_000.0, []
    for gap in gaps:
        now += gap
        state_after, _, granted = take_from_bucket(state, now, limit, window, burst, 1)
        if exact_at is not None:
            exact = min(Fraction(burst), exact + (Fraction(now) - exact_at) * rate)
        exact_at = Fraction(now)
        if abs(exact - 1) > Fraction(1, 10**6):
            assert granted == (exact >= 1), (exact, state)
        if granted:
            exact -= 1
            admitted_at.append(now)
            state = state_after
        assert state is None or 0 <= state[0] <= burst
    for i, start in enumerate(admitted_at):
        for j in range(i, len(admitted_at)):
            span = admitted_at[j] - start
            assert j - i + 1 <= burst + float(rate) * span + 1e-6, (i, j, span)


def test_headers_say_whole_tokens_the_time_to_full_and_to_the_next_token() -> None:
    clock = Clock(5000.0)
    limiter = MemoryRateLimiter(clock=clock)

    async def takes(count: int) -> list[LimitDecision]:
        return [await limiter.take("k", 60, 60, burst=10) for _ in range(count)]

    decisions = asyncio.run(takes(11))  # a burst of 10 at 1 a second
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    first = dict(decisions[0].headers())
    assert first == {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9",
                     "x-ratelimit-reset-requests": "1s"}  # full again in a second
    refused = dict(decisions[-1].headers())
    assert refused == {"x-ratelimit-limit-requests": "10",
                       "x-ratelimit-remaining-requests": "0",
                       "x-ratelimit-reset-requests": "10s", "retry-after": "1"}
    clock.now += 0.25  # a quarter token
    late = asyncio.run(takes(1))[0]
    assert not late.allowed and late.retry_in == pytest.approx(0.75)
    assert dict(late.headers())["x-ratelimit-reset-requests"] == "10s"  # 9.75 s, rounded up
    clock.now += 2.75  # three tokens: three more, and no fourth
    assert [d.allowed for d in asyncio.run(takes(4))] == [True, True, True, False]


@pytest.mark.parametrize("backend", ["memory", "workers-file"])
def test_across_a_window_edge_the_fixed_window_admits_twice_the_limit_the_bucket_does_not(
    backend: str, tmp_path: Path,
) -> None:
    """10 requests per 60 s: ten in the last half second of a window and ten in the first
    of the next. The fixed window admits all 20 within a second; the bucket 10 and what
    refilled in that second (a sixth of a token: none)."""
    limit, window = 10, 60
    edge = window_start(1_700_000_000.0, window) + window
    admitted = {}
    for burst in (None, limit):
        clock = Clock(edge - 0.5)
        limiter = (MemoryRateLimiter(clock=clock) if backend == "memory" else
                   SqliteRateLimiter(WorkersFile(tmp_path / f"{burst}.db"), clock=clock))

        async def both_sides(limiter: Any = limiter, clock: Clock = clock,
                             burst: int | None = burst) -> int:
            allowed = 0
            for i in range(2 * limit):  # 20 requests in a second, the edge in its middle
                clock.now = edge - 0.5 + i * 0.05
                allowed += (await limiter.take("k", limit, window, burst=burst)).allowed
            await limiter.close()
            return allowed

        admitted[burst] = asyncio.run(both_sides())
    span, rate = 0.95, limit / window
    assert admitted[None] == 2 * limit  # the fixed window: twice the limit in a second
    assert admitted[limit] == limit + math.floor(rate * span) == limit


def test_the_setting_and_a_keys_burst_choose_how_its_requests_count(tmp_path: Path) -> None:
    assert load_settings({}).rate_limit_algorithm is RateLimitAlgorithm.TOKEN_BUCKET
    chosen = load_settings({"RATE_LIMIT_ALGORITHM": "fixed-window"})
    assert chosen.rate_limit_algorithm is RateLimitAlgorithm.FIXED_WINDOW
    config = tmp_path / "gateway.yaml"
    config.write_text("rate_limit_algorithm: fixed-window\n")
    assert load_settings({}, str(config)).rate_limit_algorithm is RateLimitAlgorithm.FIXED_WINDOW
    with pytest.raises(ConfigError, match="expected token-bucket or fixed-window"):
        load_settings({"RATE_LIMIT_ALGORITHM": "leaky"})
    key = KeyRecord("id", "s", "n", "p", b"", 0.0, rate_limit_requests=60)
    assert request_burst(RateLimitAlgorithm.TOKEN_BUCKET, key) == 60  # burst: the limit
    key.rate_limit_burst = 5
    assert request_burst(RateLimitAlgorithm.TOKEN_BUCKET, key) == 5
    assert request_burst(RateLimitAlgorithm.FIXED_WINDOW, key) is None


# ---- each backend ----------------------------------------------------------------------


@asynccontextmanager
async def opened(backend: str, tmp_path: Path, request: pytest.FixtureRequest,
                 ) -> AsyncIterator[Any]:
    """A backend's limiter on the services the fixtures name (a namespace of its own)."""
    if backend == "memory":
        yield MemoryRateLimiter()
    elif backend == "workers-file":
        limiter = SqliteRateLimiter(WorkersFile(tmp_path / "workers.db"))
        yield limiter
        await limiter.close()
    elif backend == "redis":
        redis_limiter = RedisRateLimiter(request.getfixturevalue("redis_url"),
                                         namespace=f"tb-{uuid.uuid4().hex[:8]}")
        yield redis_limiter
        await redis_limiter.close()
    else:
        store = open_store(request.getfixturevalue("postgres_url"))
        assert isinstance(store, PostgresStore)
        await store.migrate()
        yield PostgresRateLimiter(store)
        await store.close()


async def stored_tokens(limiter: Any, key_id: str, limit: int, window: int,
                        burst: int) -> float:
    """What the backend holds for the bucket (its tokens as last written)."""
    name = bucket_name(key_id, limit, window, burst)
    if isinstance(limiter, MemoryRateLimiter):
        return limiter._buckets._buckets[name][0]
    if isinstance(limiter, SqliteRateLimiter):
        db = limiter._file.acquire()
        try:
            return float(db.execute("SELECT tokens FROM rate_limit_buckets WHERE bucket = ?",
                                    (name,)).fetchone()[0])
        finally:
            limiter._file.release()
    if isinstance(limiter, RedisRateLimiter):
        value = await limiter.scripts.run(READ_TOKENS, [bucket_key(
            key_id, limit, window, burst, limiter.namespace)], [])
        return float(value)
    async with limiter._store.connection() as conn:
        cursor = await conn.execute("SELECT tokens FROM rate_limit_buckets WHERE bucket = %s",
                                    (name,))
        row = await cursor.fetchone()
    return float(row[0])


BACKENDS = ["memory", "workers-file", "redis", "postgres"]
READ_TOKENS = Script("return redis.call('HGET', KEYS[1], 'tokens')")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_200_concurrent_takes_admit_exactly_the_burst(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    key_id, limit, burst = str(uuid.uuid4()), 100, 100
    async with opened(backend, tmp_path, request) as limiter:
        decisions = await asyncio.gather(*(limiter.take(key_id, limit, SLOW_WINDOW,
                                                        burst=burst) for _ in range(200)))
        left = await stored_tokens(limiter, key_id, limit, SLOW_WINDOW, burst)
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == burst
    assert sorted(d.remaining for d in allowed) == list(range(burst))  # a token each
    assert 0 <= left < 0.01  # refused takes took nothing: the burst, and a hair of refill
    for refused in (d for d in decisions if not d.allowed):
        headers = dict(refused.headers())
        assert headers["x-ratelimit-remaining-requests"] == "0"
        # The next token in W / N seconds (26 784 s), the bucket full in W: the level the
        # refusal saw is the bucket's own, not one read before concurrent takes.
        assert SLOW_WINDOW / limit - 60 < int(headers["retry-after"]) <= SLOW_WINDOW / limit + 1
        assert 0 < refused.reset_after <= SLOW_WINDOW


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_full_guard_refuses_and_the_bucket_keeps_its_tokens(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    key_id = str(uuid.uuid4())
    guard = Guard(f"{key_id}!failed", 2, 3600)
    async with opened(backend, tmp_path, request) as limiter:
        assert (await limiter.take(key_id, 10, 60, guard=guard, burst=10)).allowed
        for _ in range(2):  # two failures fill the guard (a fixed window, counted apart)
            await limiter.take(guard.key_id, guard.limit, guard.window_seconds)
        refused = await limiter.take(key_id, 10, 60, guard=guard, burst=10)
        lease = await limiter.lease(key_id, 10, 60, 5, guard, 10)
        left = await stored_tokens(limiter, key_id, 10, 60, 10)
    assert refused.guarded and not refused.allowed and 0 < refused.reset_after <= 3600
    assert lease.amount == 0
    assert 9 <= left < 9.1  # the one request before: the refusals took nothing


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_lease_takes_tokens_at_once_and_what_it_gives_back_refills_to_the_burst(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    key_id, limit, burst = str(uuid.uuid4()), 100, 100
    async with opened(backend, tmp_path, request) as limiter:
        first = await limiter.lease(key_id, limit, SLOW_WINDOW, 30, None, burst)
        too_much = await limiter.lease(key_id, limit, SLOW_WINDOW, 71, None, burst)
        rest = await limiter.lease(key_id, limit, SLOW_WINDOW, 70, None, burst)
        refused = await limiter.take(key_id, limit, SLOW_WINDOW, burst=burst)
        await limiter.give_back(key_id, limit, SLOW_WINDOW, 30, first.window, burst)
        after_back = await stored_tokens(limiter, key_id, limit, SLOW_WINDOW, burst)
        await limiter.give_back(key_id, limit, SLOW_WINDOW, 90, rest.window, burst)
        full = await stored_tokens(limiter, key_id, limit, SLOW_WINDOW, burst)
    assert (first.amount, first.count) == (30, 30) and first.reset_after == math.inf
    assert too_much.amount == 0  # all of it, or nothing
    assert (rest.amount, rest.count) == (70, 100) and not refused.allowed
    assert 30 <= after_back < 30.01
    assert full == burst  # given back, never past the burst


@pytest.mark.parametrize("backend", ["redis", "postgres"])
async def test_a_shared_bucket_refills_on_its_servers_clock(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    """10 a second, a burst of 5: the five at once, then nothing, then what a third of a
    second refilled (3, or one more if the first five took a tenth of a second)."""
    key_id = str(uuid.uuid4())
    async with opened(backend, tmp_path, request) as limiter:
        started = time.monotonic()
        first = await asyncio.gather(*(limiter.take(key_id, 10, 1, burst=5) for _ in range(6)))
        await asyncio.sleep(0.35)
        later = 0
        while later < 10 and (await limiter.take(key_id, 10, 1, burst=5)).allowed:
            later += 1
        elapsed = time.monotonic() - started
    assert [d.allowed for d in first].count(True) == 5
    refused = next(d for d in first if not d.allowed)
    assert refused.retry_in is not None and 0 < refused.retry_in <= 0.1
    # At least the refill of the sleep; at most the burst and the refill of it all.
    assert later >= 3 and 5 + later <= 5 + 10 * elapsed, (later, elapsed)


# ---- leases --------------------------------------------------------------------------


def test_leased_replicas_on_one_bucket_stay_within_it_and_give_back_every_unused_token() -> None:
    """Three replicas' leased limiters over one in-process bucket (a burst of 5 000 at 20
    a second), 9 000 requests between them with time passing: leased far from the limit,
    decided by the bucket near it; admitted never more than the burst and its refill;
    closed, the bucket holds exactly the burst less what was admitted, plus its refill."""
    start, rate, burst = 1_700_000_000.0, 20, 5000

    async def run() -> tuple[int, int, tuple[float, float, float]]:
        wall, monotonic = Clock(start), Clock(100.0)
        backend = MemoryRateLimiter(clock=wall)
        replicas = [LeasedRateLimiter(backend, 1.0, clock=monotonic) for _ in range(3)]
        admitted = 0
        for round_ in range(60):
            for index in range(150):
                replica = replicas[(round_ + index) % 3]
                admitted += (await replica.take("busy", rate, 1, burst=burst)).allowed
            await asyncio.sleep(0)  # the lease requests run
            wall.now += 0.1
            monotonic.now += 0.1
        decided = sum(replica.book.decisions for replica in replicas)
        for replica in replicas:
            await replica._keeper.close()  # every lease booked, the backend kept
        return admitted, decided, backend._buckets._buckets[bucket_name("busy", rate, 1, burst)]

    admitted, decided, (tokens, at, _) = asyncio.run(run())
    assert decided > 2000  # leases decided most requests far from the limit
    assert burst < admitted <= burst + rate * (at - start)  # refilled, never past it
    # Every lease given back: the bucket is down by what was admitted, up by its refill
    # since the first request (under the burst all along: none of it overflowed).
    assert tokens == pytest.approx(burst - admitted + rate * (at - start), abs=1e-6)


# ---- serve -----------------------------------------------------------------------------

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}


async def burst_of(urls: list[str], key: str, count: int, parallel: int) -> list[httpx.Response]:
    """``count`` requests, ``parallel`` at a time, spread round-robin over the replicas."""
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        gate = asyncio.Semaphore(parallel)

        async def one(index: int) -> httpx.Response:
            async with gate:
                return await client.post(urls[index % len(urls)] + "/v1/chat/completions",
                                         json=CHAT, headers={"authorization": f"Bearer {key}"})

        return await asyncio.gather(*(one(i) for i in range(count)))


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_four_replicas_admit_exactly_the_burst(
    backend: str, fake_url: str, postgres_url: str, request: pytest.FixtureRequest,
) -> None:
    """test_replicas.py's scale-out form with the bucket (its default): 400 requests at
    once over four replicas sharing the limiter admit exactly the burst, whatever window
    edge they cross, each with its own remaining count, and refuse the rest with the time
    to the next token."""
    redis_url = request.getfixturevalue("redis_url") if backend == "redis" else ""
    _, key = create_key(postgres_url, name=f"bucket-{backend}", rate_limit_requests=100,
                        rate_limit_window_seconds=SLOW_WINDOW)
    env = {"DATABASE_URL": postgres_url, "REDIS_URL": redis_url,
           "REDIS_NAMESPACE": f"tb-{uuid.uuid4().hex[:8]}", "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url, "ADMIN_BIND_ADDR": "off", "ACCESS_LOG": "off"}
    with gateway_processes(env, 4) as replicas:
        for replica in replicas:
            checks = httpx.get(replica.url + "/readyz").json()["checks"]
            assert checks["rate_limiter"] == {"backend": backend, "state": "ok"}
        responses = asyncio.run(burst_of([r.url for r in replicas], key, 400, 400))
    statuses = collections.Counter(r.status_code for r in responses)
    assert statuses == {200: 100, 429: 300}, statuses
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"])
                       for r in responses if r.status_code == 200)
    assert remaining == list(range(100))
    for response in (r for r in responses if r.status_code == 429):
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert response.headers["x-ratelimit-limit-requests"] == "100"
        assert 1 <= int(response.headers["retry-after"]) <= SLOW_WINDOW // 100
        assert response.json()["error"]["code"] == "rate_limit_exceeded"


def test_four_replicas_on_leases_stay_within_the_bucket_and_redis_holds_what_was_admitted(
    tmp_path: Path, fake_url: str, postgres_url: str, redis_url: str,
) -> None:
    """test_leases.py's four-replica form with the bucket: a busy key with a burst of
    3 000, 4 000 requests over four replicas on leases; admitted no more than the burst
    and its refill; stopped, Redis holds the burst less exactly what was admitted (plus
    the refill since), and the rest of the bucket is there to the request. (A bucket has
    no window to cross: no roomy window needed.)"""
    limit = 3000
    record, key = create_key(postgres_url, rate_limit_requests=limit,
                             rate_limit_window_seconds=SLOW_WINDOW)
    namespace = f"tb-leases-{uuid.uuid4().hex[:8]}"
    env = {"DATABASE_URL": postgres_url, "REDIS_URL": redis_url, "REDIS_NAMESPACE": namespace,
           "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "ADMIN_BIND_ADDR": "off", "ACCESS_LOG": "off",
           "USAGE_SPOOL_DIR": str(tmp_path / "spool")}
    rate = limit / SLOW_WINDOW
    client = redis.Redis.from_url(redis_url)
    bucket = bucket_key(record.id, limit, SLOW_WINDOW, limit, namespace)
    decided = substituted = 0.0
    with gateway_processes(env, 4) as replicas:
        started = time.time()
        statuses = [r.status_code for r in asyncio.run(
            burst_of([r.url for r in replicas], key, 4000, 32))]
        for replica in replicas:
            for line in httpx.get(replica.url + "/metrics").text.splitlines():
                if line.startswith("llm_gateway_lease_decisions_total{"):
                    decided += float(line.rsplit(" ", 1)[1])
                if line.startswith("llm_gateway_backend_substitutions_total{"):
                    substituted += float(line.rsplit(" ", 1)[1])
    stopped = time.time()  # every replica gave its leases back when it stopped
    admitted = statuses.count(200)
    print(f"4 replicas: {admitted} of 4000 admitted against a burst of {limit}, "
          f"{decided:.0f} from leases")
    assert substituted == 0  # Redis answered throughout: the bucket is the shared one
    assert set(statuses) <= {200, 429}
    assert admitted <= limit + rate * (stopped - started)
    assert decided > 1000  # leases did most of the deciding
    tokens, at = (float(v) for v in client.hmget(bucket, "tokens", "at"))
    assert tokens == pytest.approx(limit - admitted + rate * (at - started), abs=0.05)
    with gateway_processes(env, 1) as replicas:
        least = math.floor(tokens + rate * (time.time() - at))  # refilled since written
        more = asyncio.run(burst_of([replicas[0].url], key, least + 50, 32))
        most = math.floor(tokens + rate * (time.time() - at))
    # The rest of the bucket, and no more (a token may refill meanwhile: 1 in ~900 s).
    assert least <= [r.status_code for r in more].count(200) <= most
    client.delete(bucket)


async def test_postgres_keeps_a_bucket_as_one_row(
    postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    """Migration 14: the bucket's row (tokens, refilled_at on the database's clock)."""
    key_id = str(uuid.uuid4())
    async with opened("postgres", tmp_path, request) as limiter:
        await limiter.take(key_id, 10, 60, burst=4)
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT tokens, refilled_at, extract(epoch FROM clock_timestamp())"
                           " FROM rate_limit_buckets WHERE bucket = %s",
                           (bucket_name(key_id, 10, 60, 4),)).fetchone()
    assert row is not None and row[0] == 3.0 and 0 <= float(row[2]) - row[1] < 5
