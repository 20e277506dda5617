"""The Postgres store against a real server: migrations, keys, usage, and what the schema
refuses. Each test has a schema of its own in a database created for the session."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal

import httpx
import psycopg
import pytest

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.config import RateLimitAlgorithm
from llm_gateway.keys import KeyRecord, key_prefix, new_key_record
from llm_gateway.stores import StoreUnavailable, open_store
from llm_gateway.stores.migrations import MIGRATIONS
from llm_gateway.stores.postgres import PostgresStore
from tests.support import BIN, closed_port, send_keys_as_prompts


def with_store[T](url: str, work: Callable[[PostgresStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = open_store(url)
        assert isinstance(store, PostgresStore)
        try:
            await store.migrate()
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def test_migrations_apply_once_and_use_timestamptz(postgres_url: str) -> None:
    async def migrate_twice(store: PostgresStore) -> list[int]:
        return await store.migrate()  # with_store migrated once already

    assert with_store(postgres_url, migrate_twice) == []
    with psycopg.connect(postgres_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations "
                                               "ORDER BY version")]
        assert versions == [m.version for m in MIGRATIONS]
        types = dict(conn.execute(
            "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ).fetchall())
    for column in ("gateway_keys.created_at", "gateway_keys.revoked_at",
                   "gateway_keys.last_used_at", "usage_records.started_at",
                   "rate_limit_windows.window_start"):
        assert types[column] == "timestamp with time zone", column
    result = subprocess.run([str(BIN / "llm-gateway"), "migrate"], capture_output=True,
                            text=True, env={**os.environ, "DATABASE_URL": postgres_url},
                            timeout=30)
    assert result.returncode == 0 and "up to date" in result.stdout, result.stderr


def test_replicas_migrating_at_once_apply_each_migration_once(postgres_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": postgres_url}
    processes = [subprocess.Popen([str(BIN / "llm-gateway"), "migrate"], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(4)]
    outputs = [p.communicate(timeout=60) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], outputs
    applied = [out for out, _ in outputs if "applied migrations" in out]
    assert len(applied) == 1, outputs  # one process migrated; the others found it done


def test_keys_round_trip_with_unix_second_times(postgres_url: str) -> None:
    now = time.time()
    record, key = new_key_record(name="svc", subject_id="team-a", now=now,
                                 rate_limit_requests=7, rate_limit_window_seconds=30,
                                 allowed_models=("a", "b"), expires_at=now + 3600)

    def same(found: KeyRecord | None) -> bool:
        """Every field equal; times to timestamptz's microsecond."""
        assert found is not None
        times = ("created_at", "expires_at", "revoked_at", "last_used_at")
        for name in times:
            assert getattr(found, name) == pytest.approx(getattr(record, name), abs=1e-6)
        return dataclasses.replace(found, **{n: getattr(record, n) for n in times}) == record

    async def work(store: PostgresStore) -> None:
        await store.insert_key(record)
        assert same(await store.key_by_prefix(key_prefix(key)))
        assert same(await store.find_key(record.id))
        assert same(await store.find_key(record.prefix))
        assert await store.find_key("llmg_nothere") is None
        assert await store.find_key(str(uuid.uuid4())) is None
        assert [k.id for k in await store.list_keys()] == [record.id]
        assert await store.revoke_key(record.id, now + 1) is True
        assert await store.revoke_key(record.id, now + 2) is False  # already revoked
        revoked = await store.key_by_prefix(record.prefix)
        assert revoked is not None and revoked.refusal(now + 3) == "revoked"
        assert revoked.revoked_at == pytest.approx(now + 1, abs=1e-5)
        assert not revoked.is_active

    with_store(postgres_url, work)


def test_prefix_lookup_is_an_index_scan(postgres_url: str) -> None:
    async def work(store: PostgresStore) -> None:
        for i in range(50):
            await store.insert_key(new_key_record(name=f"k{i}", subject_id=None,
                                                  now=time.time())[0])

    with_store(postgres_url, work)
    with psycopg.connect(postgres_url) as conn:
        conn.execute("ANALYZE gateway_keys")
        conn.execute("SET enable_seqscan = off")  # a tiny table would be scanned anyway
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT * FROM gateway_keys WHERE prefix = 'llmg_abcdefg'"))
    assert "Index Scan using gateway_keys_prefix_key" in plan, plan


def test_last_used_at_is_one_batched_statement_and_never_goes_back(postgres_url: str) -> None:
    records = [new_key_record(name=f"k{i}", subject_id=None, now=time.time())[0]
               for i in range(3)]

    async def work(store: PostgresStore) -> list[float | None]:
        for record in records:
            await store.insert_key(record)
        await store.touch_keys({records[0].id: 2000.0, records[1].id: 3000.0})
        await store.touch_keys({records[0].id: 1000.0})  # an older touch arrives late
        return [(await store.find_key(r.id)).last_used_at for r in records]  # type: ignore[union-attr]

    assert with_store(postgres_url, work) == [2000.0, 3000.0, None]


def test_usage_records_round_trip_and_duplicates_are_ignored(postgres_url: str) -> None:
    record = new_key_record(name="k", subject_id=None, now=time.time())[0]
    usage = [
        UsageRecord(request_id=f"req_{i}", key_id=record.id, subject_id="k", adapter="asgi",
                    endpoint="chat.completions", model="m", provider="venice", stream=bool(i),
                    status=200, started_at=1_700_000_000.25 + i, duration_ms=12.5,
                    prompt_tokens=3, completion_tokens=4, total_tokens=7,
                    cost_usd=Decimal("0.001"), provider_cost_diem=None,
                    response_id="chatcmpl-1", finish_reasons=["stop"],
                    ttfb_ms=1.5, first_chunk_ms=None, max_gap_ms=None, attempts=2)
        for i in range(2)
    ]

    async def work(store: PostgresStore) -> list[UsageRecord]:
        await store.insert_key(record)
        await store.write_usage(usage)
        await store.write_usage(usage[:1])  # a retried batch writes nothing twice
        return await store.usage_records()

    assert with_store(postgres_url, work) == usage


@pytest.mark.parametrize(("column", "value"), [
    ("prefix", "short"),
    ("key_hash", b"\x00" * 31),
    ("rate_limit_requests", 0),
    ("rate_limit_window_seconds", -5),
    ("revoked_at", "2024-01-01T00:00:00Z"),  # revoked while still active
    ("subject_id", ""),
])
def test_schema_refuses_what_must_never_be(postgres_url: str, column: str, value: object) -> None:
    with_store(postgres_url, lambda store: asyncio.sleep(0))  # migrate
    record, _ = new_key_record(name="n", subject_id=None, now=time.time())
    row = {"id": record.id, "subject_id": "s", "name": "n", "prefix": record.prefix,
           "key_hash": record.key_hash, "is_active": True, "created_at": "now", column: value}
    with psycopg.connect(postgres_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"INSERT INTO gateway_keys ({', '.join(row)}) "  # type: ignore[arg-type]
                     f"VALUES ({', '.join(['%s'] * len(row))})", tuple(row.values()))


def test_cli_manages_keys_in_postgres(postgres_url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "llm-gateway"), *args], capture_output=True,
                              text=True, env={**os.environ, "DATABASE_URL": postgres_url},
                              timeout=30)

    created = json.loads(cli("keys", "create", "--name", "svc", "--rate-limit", "5/10",
                             "--models", "a", "--json").stdout)
    [listed] = json.loads(cli("keys", "list", "--json").stdout)
    assert listed["id"] == created["id"] and listed["allowed_models"] == ["a"]
    assert (listed["rate_limit_requests"], listed["rate_limit_window_seconds"]) == (5, 10)
    assert abs(listed["created_at"] - time.time()) < 60
    assert cli("keys", "revoke", created["prefix"]).returncode == 0
    [revoked] = json.loads(cli("keys", "list", "--json").stdout)
    assert revoked["revoked_at"] is not None and revoked["is_active"] is False
    assert cli("keys", "revoke", "llmg_nothere").returncode == 1


def test_postgres_never_holds_a_key_in_plain_text(start_gateway, postgres_url, fake) -> None:  # type: ignore[no-untyped-def]
    gw = start_gateway(database_url=postgres_url)
    keys = [gw.key(name=f"k{i}") for i in range(3)]
    send_keys_as_prompts(gw, keys)
    assert len(gw.records()) == 3
    # Every row of every table of the gateway, as text (bytea as hex), like a dump.
    with psycopg.connect(postgres_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        assert {"gateway_keys", "usage_records", "rate_limit_windows"} <= set(tables)
        dump = "\n".join(
            row[0] for table in tables
            for row in conn.execute(f"SELECT t::text FROM {table} t")  # type: ignore[arg-type]
        )
    for key in keys:
        assert key not in dump and key[12:] not in dump
        assert key.encode().hex() not in dump and key[12:].encode().hex() not in dump
        assert key_prefix(key) in dump  # the prefix is stored, for lookups
    assert "sk-fake-upstream" not in dump


def test_unreachable_database_raises_store_unavailable() -> None:
    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{closed_port()}/nothing")

    async def lookup() -> None:
        try:
            await store.key_by_prefix("llmg_abcdefg")
        finally:
            await store.close()

    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        asyncio.run(lookup())
    assert time.monotonic() - started < 10  # the pool's timeout, not a hang


def test_gateway_survives_the_database_dropping_every_connection(  # type: ignore[no-untyped-def]
    start_gateway, postgres_url, fake
) -> None:
    """What a Postgres restart or failover looks like from a replica: every pooled
    connection dies at once. Key lookups retry on a fresh connection; the limiter
    answers from process memory for the request that found out (fail-open), then is
    back on Postgres: no restart."""
    # The Postgres limiter, on fixed windows (its window's row is read below).
    gw = start_gateway(database_url=postgres_url, redis_url=None,
                       rate_limit_algorithm=RateLimitAlgorithm.FIXED_WINDOW)
    key = gw.key(rate_limit_requests=50, rate_limit_window_seconds=3600)
    headers = {"authorization": f"Bearer {key}"}

    def chat() -> httpx.Response:
        return httpx.post(gw.url + "/v1/chat/completions", headers=headers, timeout=10,
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}]})

    assert chat().status_code == 200
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        dropped = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert dropped is not None and dropped[0] >= 1
    statuses = [chat().status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    readiness = httpx.get(gw.url + "/readyz").json()
    assert readiness["status"] == "ready"
    assert readiness["checks"]["rate_limiter"] == {"backend": "postgres", "state": "ok"}
    # Postgres counted every request but those the in-process fallback answered.
    limiter = gw.gateway.limiter
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT request_count FROM rate_limit_windows").fetchone()
    assert row is not None and row[0] + limiter.outage.substitutions == 4


def test_the_postgres_ledger_releases_holds_and_books_spend(postgres_url: str) -> None:
    """Migration 6: llmg_settle runs (migration 5's failed at every call, so reservations
    were never released and spend never booked)."""
    from llm_gateway.billing.ledger import Draw, Hold
    from llm_gateway.billing.ledger_postgres import PostgresLedger

    async def reserve_settle_reserve(store: PostgresStore) -> list[bool]:
        ledger = PostgresLedger(store)
        day = Hold("tok:key:k:d1", 100, 60, time.time() + 3600)
        tpm = Draw("tpm:key:k", 1000, 60)
        first = await ledger.reserve([day], [tpm])
        # Holding 60 of 100, a second hold of 60 cannot fit until the first is settled.
        refused = await ledger.reserve([day], [tpm])
        await ledger.settle([day], [10], [tpm], [10])
        after = await ledger.reserve([day], [tpm])  # 10 spent + 60 held, of 100
        return [first.granted, refused.granted, after.granted]

    assert with_store(postgres_url, reserve_settle_reserve) == [True, False, True]
