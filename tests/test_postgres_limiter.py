"""The Postgres fixed-window limiter: exact under concurrency, on the database's clock."""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg

from llm_gateway.config import FailurePolicy, Settings
from llm_gateway.limits import LimitDecision
from llm_gateway.limits.failover import FailoverRateLimiter
from llm_gateway.limits.postgres import PostgresRateLimiter
from llm_gateway.stores import open_store
from llm_gateway.stores.postgres import PostgresStore
from llm_gateway.wiring import open_limiter


def run_with_limiter[T](url: str, work) -> T:  # type: ignore[no-untyped-def]
    async def run() -> T:
        store = open_store(url)
        assert isinstance(store, PostgresStore)
        await store.migrate()
        try:
            return await work(PostgresRateLimiter(store))
        finally:
            await store.close()

    return asyncio.run(run())


def test_exact_under_concurrency(postgres_url: str) -> None:
    key_id = str(uuid.uuid4())

    async def burst(limiter: PostgresRateLimiter) -> list[LimitDecision]:
        return await asyncio.gather(*(limiter.take(key_id, 100, 3600) for _ in range(400)))

    decisions = run_with_limiter(postgres_url, burst)
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == 100 and len(decisions) - len(allowed) == 300
    assert sorted(d.remaining for d in allowed) == list(range(100))
    refused = [d for d in decisions if not d.allowed]
    assert all(d.remaining == 0 and 0 < d.reset_after <= 3600 for d in refused)
    assert all(dict(d.headers())["retry-after"] for d in refused)
    with psycopg.connect(postgres_url) as conn:
        [(count,)] = conn.execute("SELECT request_count FROM rate_limit_windows "
                                  "WHERE bucket = %s", (f"{key_id}:100/3600",)).fetchall()
    assert count == 100  # refused requests used up nothing


def test_window_is_epoch_aligned_on_the_database_clock(postgres_url: str) -> None:
    key_id = str(uuid.uuid4())

    async def work(limiter: PostgresRateLimiter) -> tuple[LimitDecision, LimitDecision, float]:
        first = await limiter.take(key_id, 1, 2)
        second = await limiter.take(key_id, 1, 2)
        async with limiter._store.connection() as conn:
            cursor = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            row = await cursor.fetchone()
        assert row is not None
        return first, second, row[0]

    first, second, database_now = run_with_limiter(postgres_url, work)
    assert first.allowed and not second.allowed
    # reset_after counts to the end of the database clock's 2 s window.
    drift = (second.reset_after - (2 - database_now % 2)) % 2  # the clock read came later
    assert min(drift, 2 - drift) < 0.25
    time.sleep(second.reset_after + 0.05)

    async def next_window(limiter: PostgresRateLimiter) -> LimitDecision:
        return await limiter.take(key_id, 1, 2)

    assert run_with_limiter(postgres_url, next_window).allowed


def test_settings_choose_postgres_when_there_is_no_redis(postgres_url: str) -> None:
    store = open_store(postgres_url)
    limiter = open_limiter(Settings(database_url=postgres_url), store)
    assert isinstance(limiter, FailoverRateLimiter) and limiter.backend == "postgres"
    assert limiter.policy is FailurePolicy.FAIL_OPEN
