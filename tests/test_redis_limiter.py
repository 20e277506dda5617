"""The Redis limiter: exact, on the server's clock, cluster-ready keys, NOSCRIPT, and the
failure policy when Redis goes away and comes back (a private redis-server for those)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from llm_gateway.config import FailurePolicy, Settings
from llm_gateway.limits import LimitDecision, LimiterUnavailable
from llm_gateway.limits.failover import FailoverRateLimiter
from llm_gateway.limits.redis import FIXED_WINDOW_SHA, RedisRateLimiter, window_key
from llm_gateway.stores import open_store
from llm_gateway.wiring import open_limiter
from tests.support import private_redis


async def takes(limiter: RedisRateLimiter | FailoverRateLimiter, key_id: str, count: int,
                limit: int = 100, window: int = 3600) -> list[LimitDecision]:
    return await asyncio.gather(*(limiter.take(key_id, limit, window) for _ in range(count)))


def test_exact_under_concurrency(redis_url: str) -> None:
    key_id = str(uuid.uuid4())

    async def burst() -> list[LimitDecision]:
        limiter = RedisRateLimiter(redis_url)
        try:
            return await takes(limiter, key_id, 400)
        finally:
            await limiter.close()

    decisions = asyncio.run(burst())
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == 100
    assert sorted(d.remaining for d in allowed) == list(range(100))
    refused = [d for d in decisions if not d.allowed]
    assert len(refused) == 300
    assert all(d.remaining == 0 and 1 <= int(dict(d.headers())["retry-after"]) <= 3600
               for d in refused)
    client = redis.Redis.from_url(redis_url)
    key = window_key(key_id, 100, 3600)
    assert int(client.hget(key, "count")) == 100  # type: ignore[arg-type]
    assert 0 < client.pttl(key) <= 3601_000  # collected once the window is over
    client.delete(key)


def test_reset_comes_from_the_redis_clock(redis_url: str) -> None:
    key_id = str(uuid.uuid4())

    async def two() -> list[LimitDecision]:
        limiter = RedisRateLimiter(redis_url)
        try:
            return [await limiter.take(key_id, 1, 7), await limiter.take(key_id, 1, 7)]
        finally:
            await limiter.close()

    first, second = asyncio.run(two())
    seconds, micros = redis.Redis.from_url(redis_url).time()
    server_now = seconds + micros / 1e6
    assert first.allowed and not second.allowed
    drift = (second.reset_after - (7 - server_now % 7)) % 7  # the TIME call came later
    assert min(drift, 7 - drift) < 0.25


def test_keys_of_one_gateway_key_share_a_cluster_slot() -> None:
    key_id = str(uuid.uuid4())
    keys = [window_key(key_id, 10, 60), window_key(key_id, 1000, 3600)]
    assert all(f"{{{key_id}}}" in key for key in keys)
    assert key_slot(keys[0].encode()) == key_slot(keys[1].encode()) == key_slot(key_id.encode())


def test_script_is_loaded_once_and_again_after_noscript(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        async def run() -> RedisRateLimiter:
            limiter = RedisRateLimiter(server.url)
            operator = redis.asyncio.Redis.from_url(server.url)
            try:
                key_id = str(uuid.uuid4())
                for _ in range(3):
                    assert (await limiter.take(key_id, 10, 60)).allowed
                assert limiter.script_loads == 1
                await operator.script_flush()  # as a restart or failover would
                assert (await operator.script_exists(FIXED_WINDOW_SHA)) == [False]
                decision = await limiter.take(key_id, 10, 60)
                assert decision.allowed and decision.remaining == 6  # the count survived
                assert limiter.script_loads == 2
                return limiter
            finally:
                await limiter.close()
                await operator.aclose()

        asyncio.run(run())


def test_fail_open_counts_in_process_and_recovers_without_restart(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        async def run() -> None:
            limiter = FailoverRateLimiter(RedisRateLimiter(server.url), FailurePolicy.FAIL_OPEN,
                                          retry_interval=0.2)
            key_id = str(uuid.uuid4())
            try:
                assert (await limiter.take(key_id, 5, 3600)).remaining == 4
                server.stop()
                started = time.monotonic()
                down = await takes(limiter, key_id, 7, limit=5)
                # In-process counting from zero: this replica alone allows up to the limit.
                assert [d.allowed for d in down] == [True] * 5 + [False] * 2
                assert time.monotonic() - started < 3  # one attempt, not one per request
                assert limiter.outage.is_down and limiter.outage.substitutions == 7
                assert not await limiter.check()
                server.start()  # same port, empty: no keys, no scripts
                assert await limiter.check()
                assert not limiter.outage.is_down
                back = await limiter.take(key_id, 5, 3600)
                assert back.allowed and back.remaining == 4  # Redis counts again
                assert limiter.outage.substitutions == 7
            finally:
                await limiter.close()

        asyncio.run(run())


def test_fail_closed_raises_until_redis_is_back(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        async def run() -> None:
            limiter = FailoverRateLimiter(RedisRateLimiter(server.url),
                                          FailurePolicy.FAIL_CLOSED, retry_interval=0.1)
            key_id = str(uuid.uuid4())
            try:
                assert (await limiter.take(key_id, 5, 3600)).allowed
                server.stop()
                for _ in range(3):
                    with pytest.raises(LimiterUnavailable):
                        await limiter.take(key_id, 5, 3600)
                server.start()
                await asyncio.sleep(0.15)  # the retry interval: the next call tries Redis
                assert (await limiter.take(key_id, 5, 3600)).allowed
                assert not limiter.outage.is_down and limiter.outage.substitutions == 0
            finally:
                await limiter.close()

        asyncio.run(run())


def test_settings_choose_redis_when_redis_url_is_set(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}",
                        redis_url="redis://127.0.0.1:1/0",
                        rate_limit_failure_policy=FailurePolicy.FAIL_CLOSED)
    limiter = open_limiter(settings, open_store(settings.database_url))
    assert isinstance(limiter, FailoverRateLimiter) and limiter.backend == "redis"
    assert limiter.policy is FailurePolicy.FAIL_CLOSED
