"""A million usage rows on Postgres: day partitions and indexes keep a report over a
time range fast. Seeded with one generate_series statement."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, date, datetime, timedelta

import psycopg

from llm_gateway.billing.reports import usage_report
from llm_gateway.stores.postgres import PostgresStore

ROWS = 1_000_000
DAYS = 30


def test_a_report_over_a_million_rows_answers_within_a_second(postgres_url: str) -> None:
    first = date(2026, 10, 1)

    async def seed_and_report() -> tuple[float, list[dict[str, object]], float]:
        store = PostgresStore(postgres_url)
        try:
            await store.migrate()
            await store.ensure_usage_partitions(first + timedelta(days=n) for n in range(DAYS))
            async with store.connection() as conn:
                await conn.execute("SET statement_timeout = 0")  # seeding takes a while
                await conn.execute(
                    """
                    INSERT INTO usage_records (request_id, started_at, ended_at, key_id,
                        subject_id, adapter, endpoint, model, provider, stream, status,
                        prompt_tokens, completion_tokens, total_tokens, cost_usd, duration_ms)
                    SELECT 'req_' || n, %(start)s + (n * %(step)s) * interval '1 second',
                        %(start)s + (n * %(step)s + 0.5) * interval '1 second',
                        'key-' || (n %% 1000), 'team-' || (n %% 20), 'asgi',
                        'chat.completions', 'model-' || (n %% 5), 'p', false,
                        CASE WHEN n %% 50 = 0 THEN 500 ELSE 200 END, 10, 20, 30,
                        0.0001, 50 + (n %% 100)
                    FROM generate_series(0, %(rows)s - 1) AS n
                    """,
                    {"start": datetime(first.year, first.month, first.day, tzinfo=UTC),
                     "step": DAYS * 86400 / ROWS, "rows": ROWS},
                )
                await conn.execute("ANALYZE usage_records")
                await conn.execute("RESET statement_timeout")
            since = datetime(2026, 10, 20, tzinfo=UTC).timestamp()
            started = time.perf_counter()
            day = await usage_report(store, ["model"], since, since + 86400)
            one_day = time.perf_counter() - started
            started = time.perf_counter()
            await usage_report(store, ["model"], None, None)
            whole = time.perf_counter() - started
            return one_day, day, whole
        finally:
            await store.close()

    one_day, report, whole = asyncio.run(seed_and_report())
    print(f"\nreport over one day of {ROWS} rows: {one_day * 1000:.0f} ms; "
          f"over all of them: {whole * 1000:.0f} ms")
    assert sum(row["requests"] for row in report) == ROWS // DAYS + 1 or \
        abs(sum(row["requests"] for row in report) - ROWS // DAYS) <= 1
    assert {row["model"] for row in report} == {f"model-{n}" for n in range(5)}
    assert one_day < 1.0, f"{one_day:.2f} s"


def test_partitions_are_made_ahead_and_dropped_whole(postgres_url: str) -> None:
    async def work() -> tuple[list[date], list[str], list[date]]:
        store = PostgresStore(postgres_url)
        try:
            await store.migrate()
            today = datetime.now(UTC).date()
            await store.ensure_usage_partitions(today + timedelta(days=n) for n in range(-3, 3))
            made = await store.usage_partitions()
            dropped = await store.drop_usage_partitions_before(today - timedelta(days=1))
            return made, dropped, await store.usage_partitions()
        finally:
            await store.close()

    made, dropped, left = asyncio.run(work())
    assert len(dropped) == 2 and len(left) == len(made) - 2
    assert psycopg  # the driver the store runs on
