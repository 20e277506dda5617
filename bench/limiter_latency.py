"""The latency a rate limiter adds to each request: memory, Redis and Postgres, one run.

    .venv/bin/python bench/limiter_latency.py [--requests 2000] [--concurrency 1]
        [--redis-url redis://127.0.0.1:6379/0]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/test]

Each backend takes ``--requests`` decisions for fresh keys (after a warm-up that loads
the Lua script and fills the connection pools), one at a time by default, and reports
the time per ``take()``: what admission waits for. Postgres runs in a database created
for the run and dropped after it; Redis keys live under a namespace of their own and are
deleted. A backend that is not reachable is reported as such, not skipped silently.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_gateway.limits import MemoryRateLimiter, RateLimiter

Cleanup = Callable[[], Awaitable[None]]
Opener = Callable[[], Awaitable[tuple[RateLimiter, Cleanup]]]


async def measure(limiter: RateLimiter, requests: int, concurrency: int) -> list[float]:
    """Seconds per take(), for ``requests`` takes by ``concurrency`` callers at once."""
    key_ids = [str(uuid.uuid4()) for _ in range(8)]
    for key_id in key_ids:  # warm-up: scripts loaded, connections open, plans prepared
        for _ in range(10):
            await limiter.take(key_id, 1_000_000, 60)
    timings: list[float] = []

    async def caller(count: int) -> None:
        for i in range(count):
            started = time.perf_counter()
            await limiter.take(key_ids[i % len(key_ids)], 1_000_000, 60)
            timings.append(time.perf_counter() - started)

    await asyncio.gather(*(caller(requests // concurrency) for _ in range(concurrency)))
    return timings


def summary(name: str, timings: list[float], wall: float) -> str:
    ordered = sorted(timings)
    p50 = ordered[len(ordered) // 2] * 1e6
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6
    mean = statistics.fmean(timings) * 1e6
    return (f"{name:<10} {mean:>10.1f} {p50:>10.1f} {p99:>10.1f} "
            f"{len(timings) / wall:>12.0f}")


async def run_backend(
    name: str, open_limiter: Opener, requests: int, concurrency: int
) -> str:
    try:
        limiter, cleanup = await open_limiter()
    except Exception as exc:  # report why a backend is missing, keep measuring the rest
        return f"{name:<10} unavailable: {type(exc).__name__}: {exc}"
    try:
        started = time.perf_counter()
        timings = await measure(limiter, requests, concurrency)
        return summary(name, timings, time.perf_counter() - started)
    finally:
        await cleanup()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()

    async def memory() -> tuple[RateLimiter, Cleanup]:
        limiter = MemoryRateLimiter()
        return limiter, limiter.close

    async def redis_backend() -> tuple[RateLimiter, Cleanup]:
        from llm_gateway.limits.redis import RedisRateLimiter

        namespace = f"llmg-bench-{secrets.token_hex(4)}"
        from redis.asyncio import Redis

        limiter = RedisRateLimiter(args.redis_url, namespace=namespace)
        await limiter.ping()
        operator = Redis.from_url(args.redis_url)  # the cleanup's own client

        async def cleanup() -> None:
            keys = [key async for key in operator.scan_iter(f"{namespace}:*")]
            if keys:
                await operator.delete(*keys)
            await operator.aclose()
            await limiter.close()

        return limiter, cleanup

    async def postgres_backend() -> tuple[RateLimiter, Cleanup]:
        import psycopg

        from llm_gateway.limits.postgres import PostgresRateLimiter
        from llm_gateway.stores.postgres import PostgresStore

        database = f"llmg_bench_{secrets.token_hex(4)}"
        parts = urlsplit(args.postgres_url)
        url = urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))
        async with await psycopg.AsyncConnection.connect(args.postgres_url,
                                                         autocommit=True) as conn:
            await conn.execute(f"CREATE DATABASE {database}")  # type: ignore[arg-type]
        store = PostgresStore(url)
        await store.migrate()

        async def cleanup() -> None:
            await store.close()
            async with await psycopg.AsyncConnection.connect(args.postgres_url,
                                                             autocommit=True) as conn:
                await conn.execute(f"DROP DATABASE {database} WITH (FORCE)")  # type: ignore[arg-type]

        return PostgresRateLimiter(store), cleanup

    print(f"limiter latency per request: {args.requests} requests, "
          f"concurrency {args.concurrency} (microseconds)")
    print(f"{'backend':<10} {'mean':>10} {'p50':>10} {'p99':>10} {'takes/s':>12}")
    for name, opener in (("memory", memory), ("redis", redis_backend),
                         ("postgres", postgres_backend)):
        print(await run_backend(name, opener, args.requests, args.concurrency), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
