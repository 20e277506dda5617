"""The usage record's protocol, cache and reasoning tokens, and the prices of cache writes:
kept by both stores and the spool (a spool line from before the rename too), carried
over by the migration, priced each at its own rate, set through the CLI, the admin API
and the settings file, and summed by the reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from llm_gateway.billing.model import Price
from llm_gateway.billing.prices import PriceBook, PriceError, cost_of, prices_from_settings
from llm_gateway.billing.records import UsageRecord
from llm_gateway.billing.spool import Spool
from llm_gateway.config import load_settings
from llm_gateway.finishing import Finisher
from llm_gateway.stores import open_store
from llm_gateway.stores.migrations import MIGRATIONS
from llm_gateway.wiring import build_gateway
from tests.support import REPO, fresh_database_url
from tests.test_admin_api import (  # noqa: F401 (fixtures)
    AdminGateway,
    OpenApi,
    admin_gw,
    openapi,
)
from tests.test_admin_cli import cli

# The schema before this change: a store migrated this far has cached_tokens.
PREVIOUS = [migration for migration in MIGRATIONS if migration.version <= 7]
NEW_TOKEN_FIELDS = ("cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens",
                    "reasoning_tokens")
MILLION = Decimal(1_000_000)


def full_record(request_id: str = "req_full", started_at: float | None = None,
                **fields: Any) -> UsageRecord:
    """A record with every field set, the new ones to values no default has."""
    values: dict[str, Any] = dict(
        request_id=request_id, key_id="key-1", key_prefix="llmg_abcdefg", subject_id="team-a",
        adapter="asgi", endpoint="messages", protocol="messages", model="claude",
        provider="anthropic", upstream_model="claude-sonnet-4-5", stream=True, status=200,
        # Whole milliseconds: Postgres keeps microseconds, a float beyond them is not kept.
        started_at=round(time.time() - 60, 3) if started_at is None else started_at,
        duration_ms=812.5,
        prompt_tokens=10_000, completion_tokens=2_000, total_tokens=12_000,
        cache_read_tokens=4_000, cache_write_tokens=3_000, cache_write_1h_tokens=1_000,
        reasoning_tokens=1_500, cost_usd=Decimal("0.0537"),
        provider_cost_usd=Decimal("0.0536"), response_id="msg_1",
        finish_reasons=["end_turn"], ttfb_ms=100.25, first_chunk_ms=120.5, max_gap_ms=30.0,
        attempts=2, trace_id="0af7651916cd43dd8448eb211c80319c",
    )
    values.update(fields)
    return UsageRecord(**values)


def with_store[T](url: str, work: Callable[[Any], Awaitable[T]], *,
                  migrations: list[Any] | None = None) -> T:
    """``work(store)`` on a migrated store (to ``migrations`` only, when given)."""

    async def run() -> T:
        store = open_store(url)
        try:
            if migrations is None:
                await store.migrate()
            else:
                module = sys.modules[type(store).__module__]
                everything = module.MIGRATIONS  # type: ignore[attr-defined]
                module.MIGRATIONS = tuple(migrations)  # type: ignore[attr-defined]
                try:
                    await store.migrate()
                finally:
                    module.MIGRATIONS = everything  # type: ignore[attr-defined]
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metering.db'}"
    return str(request.getfixturevalue("postgres_url"))


# ---- kept: stores and spool ---------------------------------------------------------------

def test_a_record_with_every_new_field_round_trips_through_the_store(store_url: str) -> None:
    record = full_record()

    async def work(store: Any) -> list[UsageRecord]:
        await store.write_usage([record, record])  # a replay is one row
        return await store.usage_records()  # type: ignore[no-any-return]

    [stored] = with_store(store_url, work)
    assert stored == record


def assert_never_kept(url: str, record: UsageRecord) -> None:
    """The schema's CHECK refuses the record: Postgres raises, SQLite's INSERT OR IGNORE
    (there for replays) skips the row."""

    async def write(store: Any) -> list[str]:
        if store.dialect == "postgres":
            with pytest.raises(psycopg.errors.CheckViolation):
                await store.write_usage([record])
        else:
            await store.write_usage([record])
        return [r.request_id for r in await store.usage_records()]

    assert record.request_id not in with_store(url, write)


def test_the_store_refuses_negative_cache_and_reasoning_counts(store_url: str) -> None:
    for name in NEW_TOKEN_FIELDS:
        assert_never_kept(store_url, full_record(request_id=f"req_{name}", **{name: -1}))


def spool_in_a_process_that_dies(directory: Path, record: UsageRecord) -> None:
    """The record spooled by another process, which then dies without closing its spool
    (its segment is left for the next start, as after a kill)."""
    script = (
        "import json, os, sys\n"
        "from pathlib import Path\n"
        "from llm_gateway.billing.records import UsageRecord\n"
        "from llm_gateway.billing.spool import Spool\n"
        "record = UsageRecord.from_json(json.loads(sys.argv[2]))\n"
        "Spool(Path(sys.argv[1])).finished(record)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(directory), json.dumps(record.to_json())],
                   cwd=REPO, check=True, timeout=30)


def test_a_record_with_every_new_field_round_trips_through_the_spool(tmp_path: Path) -> None:
    record = full_record()
    spool_in_a_process_that_dies(tmp_path, record)
    [(_, [orphan])] = list(Spool(tmp_path).orphans())
    assert orphan.record == record


def test_a_spool_line_written_before_the_rename_is_read(tmp_path: Path) -> None:
    """A spool outlives an upgrade: its lines say cached_tokens, and know no protocol or
    cache writes."""
    before = full_record().to_json()
    for name in ("protocol", "cache_read_tokens", "cache_write_tokens",
                 "cache_write_1h_tokens", "reasoning_tokens"):
        before.pop(name)
    before["cached_tokens"] = 4_000
    admitted = {**before, "request_id": "req_cut", "status": 0}
    (tmp_path / "usage-1-dead0000-1.jsonl").write_text(
        json.dumps({"finished": before}) + "\n" + json.dumps({"admitted": admitted}) + "\n")
    [(_, orphans)] = list(Spool(tmp_path).orphans())
    finished, cut = (orphan.record for orphan in orphans)
    assert finished == full_record(protocol="", cache_write_tokens=0, cache_write_1h_tokens=0,
                                   reasoning_tokens=0, started_at=before["started_at"])
    assert (cut.request_id, cut.cache_read_tokens, cut.error_code) == (
        "req_cut", 4_000, "gateway_interrupted")


# ---- carried over: the migration ----------------------------------------------------------

def _insert_previous_row(store: Any, started_at: float) -> Awaitable[None]:
    """A row as the previous version wrote it: cached_tokens, no protocol."""
    columns = ("request_id, started_at, ended_at, key_id, subject_id, adapter, endpoint, "
               "model, provider, stream, status, prompt_tokens, completion_tokens, "
               "total_tokens, cached_tokens, duration_ms")
    if store.dialect == "sqlite":
        values = ("req_old", started_at, started_at + 0.5, "key-1", "team-a", "asgi", "chat",
                  "gpt-4o", "openai", 0, 200, 100, 20, 120, 64, 500.0)
        return store._run(lambda db: db.execute(  # type: ignore[no-any-return]
            f"INSERT INTO usage_records ({columns}) VALUES ({', '.join('?' * 16)})", values))

    async def insert() -> None:
        moment = datetime.fromtimestamp(started_at, UTC)
        await store.ensure_usage_partitions([moment.date()])
        async with store.connection() as conn:
            await conn.execute(
                f"INSERT INTO usage_records ({columns}) VALUES ({', '.join(['%s'] * 16)})",
                ("req_old", moment, moment, "key-1", "team-a", "asgi", "chat", "gpt-4o",
                 "openai", False, 200, 100, 20, 120, 64, 500.0))

    return insert()


def test_the_migration_keeps_existing_rows_and_their_cached_tokens(store_url: str) -> None:
    old_day = datetime(2026, 3, 1, 12, tzinfo=UTC).timestamp()
    with_store(store_url, lambda store: _insert_previous_row(store, old_day),
               migrations=PREVIOUS)
    # A day whose partition (on Postgres) is made after the migration.
    new = full_record(request_id="req_new", started_at=old_day + 86_400)

    async def upgraded(store: Any) -> list[UsageRecord]:
        await store.write_usage([new])
        return await store.usage_records()  # type: ignore[no-any-return]

    old, written = with_store(store_url, upgraded)
    assert (old.request_id, old.cache_read_tokens, old.prompt_tokens, old.protocol) == (
        "req_old", 64, 100, "")
    assert all(getattr(old, name) == 0 for name in NEW_TOKEN_FIELDS[1:])
    assert written == new
    # The new columns' rule holds on the partition made before the migration as well.
    assert_never_kept(store_url, full_record(request_id="req_bad", started_at=old_day,
                                             reasoning_tokens=-1))


def test_prices_stored_before_the_migration_have_no_cache_write_rates(store_url: str) -> None:
    async def old_price(store: Any) -> None:
        if store.dialect == "sqlite":
            await store._run(lambda db: db.execute(
                "INSERT INTO prices VALUES ('openai', 'gpt-4o', '2.50', '10', '1.25', 0)"))
            return
        async with store.connection() as conn:
            await conn.execute("INSERT INTO prices VALUES "
                               "('openai', 'gpt-4o', 2.50, 10, 1.25, to_timestamp(0))")

    with_store(store_url, old_price, migrations=PREVIOUS)
    [price] = with_store(store_url, lambda store: store.prices())
    assert (price.cached_input_per_mtok, price.cache_write_per_mtok,
            price.cache_write_1h_per_mtok) == (Decimal("1.25"), None, None)


# ---- priced: each kind of token at its rate -----------------------------------------------

CLAUDE = Price("anthropic", "claude-sonnet-4-5", input_per_mtok=Decimal("3"),
               output_per_mtok=Decimal("15"), effective_from=0.0,
               cached_input_per_mtok=Decimal("0.30"), cache_write_per_mtok=Decimal("3.75"),
               cache_write_1h_per_mtok=Decimal("6"))


def test_each_kind_of_token_is_priced_at_its_own_rate_exactly() -> None:
    # Of 10,000 prompt tokens: 4,000 read (0.30), 2,000 written for 5 minutes (3.75),
    # 1,000 for an hour (6), 3,000 neither (3); 2,000 completion tokens (15).
    assert cost_of(CLAUDE, prompt_tokens=10_000, completion_tokens=2_000,
                   cache_read_tokens=4_000, cache_write_tokens=3_000,
                   cache_write_1h_tokens=1_000) == Decimal(
        3_000 * 3 + 4_000 * Decimal("0.30") + 2_000 * Decimal("3.75") + 1_000 * 6
        + 2_000 * 15) / MILLION == Decimal("0.0537")
    # One token of each kind: amounts a float would not keep.
    tiny = Price("p", "m", input_per_mtok=Decimal("0.0001"), output_per_mtok=Decimal("0.0005"),
                 effective_from=0.0, cached_input_per_mtok=Decimal("0.0002"),
                 cache_write_per_mtok=Decimal("0.0003"), cache_write_1h_per_mtok=Decimal("0.0004"))
    assert cost_of(tiny, prompt_tokens=4, completion_tokens=1, cache_read_tokens=1,
                   cache_write_tokens=2, cache_write_1h_tokens=1) == Decimal("0.0000000015")


@pytest.mark.parametrize(("tokens", "rate"), [
    ({"cache_read_tokens": 1_000_000}, "0.30"),
    ({"cache_write_tokens": 1_000_000}, "3.75"),
    ({"cache_write_tokens": 1_000_000, "cache_write_1h_tokens": 1_000_000}, "6"),
    ({}, "3"),
])
def test_a_million_prompt_tokens_of_one_kind_cost_its_rate(tokens: dict[str, int],
                                                           rate: str) -> None:
    assert cost_of(CLAUDE, prompt_tokens=1_000_000, completion_tokens=0,
                   **tokens) == Decimal(rate)


def test_a_rate_left_unset_falls_back() -> None:
    """Cache reads and writes at input; 1-hour writes at the 5-minute write rate, else
    at input."""
    writes = {"prompt_tokens": 3_000_000, "completion_tokens": 0,
              "cache_read_tokens": 1_000_000, "cache_write_tokens": 2_000_000,
              "cache_write_1h_tokens": 1_000_000}
    plain = dataclasses.replace(CLAUDE, cached_input_per_mtok=None, cache_write_per_mtok=None,
                                cache_write_1h_per_mtok=None)
    assert cost_of(plain, **writes) == Decimal(9)
    five_minutes = dataclasses.replace(plain, cache_write_per_mtok=Decimal("3.75"))
    assert cost_of(five_minutes, **writes) == Decimal("3") + 2 * Decimal("3.75")
    one_hour = dataclasses.replace(plain, cache_write_1h_per_mtok=Decimal("6"))
    assert cost_of(one_hour, **writes) == Decimal("3") + Decimal("3") + Decimal("6")


def test_counts_the_prompt_cannot_hold_are_never_billed_twice() -> None:
    assert cost_of(CLAUDE, prompt_tokens=1_000_000, completion_tokens=0,
                   cache_read_tokens=800_000, cache_write_tokens=900_000,
                   cache_write_1h_tokens=900_000) == (
        Decimal("0.8") * Decimal("0.30") + Decimal("0.2") * 6)


def test_a_record_is_priced_with_its_reasoning_as_output() -> None:
    """Finisher.price passes the record's fields: reasoning is part of completion_tokens,
    priced once, at output."""
    finisher = Finisher(None, SimpleNamespace(prices=PriceBook([CLAUDE])),  # type: ignore[arg-type]
                        None)  # type: ignore[arg-type]
    reasoned = full_record(cost_usd=None)
    finisher.price(reasoned, CLAUDE.provider, CLAUDE.model)
    unreasoned = full_record(cost_usd=None, reasoning_tokens=0)
    finisher.price(unreasoned, CLAUDE.provider, CLAUDE.model)
    assert reasoned.cost_usd == unreasoned.cost_usd == Decimal("0.0537")


# ---- set: CLI, admin API, settings file ---------------------------------------------------

def test_the_cli_sets_and_lists_cache_write_rates(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    done = cli("prices", "set", "--provider", "anthropic", "--model", "claude-sonnet-4-5",
               "--input", "3", "--output", "15", "--cached-input", "0.30",
               "--cache-write", "3.75", "--cache-write-1h", "6", database_url=url)
    assert done.returncode == 0, done.stderr
    assert "cache write 3.75, 1-hour cache write 6.00" in done.stdout
    [listed] = json.loads(cli("prices", "list", "--json", database_url=url).stdout)
    assert (listed["cache_write_per_mtok"], listed["cache_write_1h_per_mtok"]) == ("3.75", "6.00")
    table = cli("prices", "list", database_url=url).stdout.splitlines()
    assert "CACHE WRITE" in table[0] and "WRITE 1H" in table[0]
    assert table[1].split()[2:7] == ["3.00", "15.00", "0.30", "3.75", "6.00"]
    bad = cli("prices", "set", "--provider", "p", "--model", "m", "--input", "1",
              "--output", "1", "--cache-write-1h", "-1", database_url=url)
    assert bad.returncode == 2 and "1-hour cache write" in bad.stderr


def test_the_admin_api_sets_cache_write_rates(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    with admin_gw.client() as c:
        price = openapi.check(c.post("/prices", json={
            "provider": "anthropic", "model": "claude-sonnet-4-5", "input_per_mtok": "3",
            "output_per_mtok": "15", "cache_write_per_mtok": "3.75",
            "cache_write_1h_per_mtok": "6"}))
        assert price.status_code == 201, price.text
        [listed] = openapi.check(c.get("/prices")).json()
        refused = openapi.check(c.post("/prices", json={
            "provider": "p", "model": "m", "input_per_mtok": "1", "output_per_mtok": "1",
            "cache_write_per_mtok": "-1"}))
    assert (price.json()["cache_write_per_mtok"], price.json()["cache_write_1h_per_mtok"],
            price.json()["cached_input_per_mtok"]) == ("3.75", "6.00", None)
    assert listed == price.json()
    assert refused.status_code == 422


def test_the_settings_file_seeds_cache_write_rates(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "prices:\n"
        "  anthropic:\n"
        "    claude-sonnet-4-5: {input: 3, output: 15, cached_input: 0.30,\n"
        "                        cache_write: 3.75, cache_write_1h: 6}\n"
        "    claude-haiku-4-5: {input: 1, output: 5}\n")
    settings = load_settings({"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}",
                              "VENICE_API_KEY": "sk-test"}, str(config))
    gateway = build_gateway(settings)
    seeded = {price.model: price for price in gateway.seed_prices}
    assert seeded["claude-sonnet-4-5"] == dataclasses.replace(CLAUDE)
    assert (seeded["claude-haiku-4-5"].cache_write_per_mtok,
            seeded["claude-haiku-4-5"].cache_write_1h_rate) == (None, Decimal(1))


@pytest.mark.parametrize(("entry", "says"), [
    ({"input": 1, "output": 1, "cache_write": -1}, "not negative"),
    ({"input": 1, "output": 1, "cache_write": "a lot"}, "numbers"),
    ({"input": 1, "output": 1, "cache_write_1hr": 6}, "unknown rate 'cache_write_1hr'"),
])
def test_a_settings_rate_that_cannot_be_read_is_named(entry: dict[str, Any], says: str) -> None:
    with pytest.raises(PriceError, match=says):
        prices_from_settings({"anthropic": {"claude": entry}})


# ---- summed: reports by protocol ----------------------------------------------------------

def protocol_records(started_at: float) -> list[UsageRecord]:
    """Two Messages requests and one chat request, with cache and reasoning tokens."""
    return [
        full_record(request_id="req_m1", started_at=started_at),
        full_record(request_id="req_m2", started_at=started_at + 1, cache_read_tokens=10,
                    cache_write_tokens=20, cache_write_1h_tokens=5, reasoning_tokens=7),
        full_record(request_id="req_c1", started_at=started_at + 2, protocol="chat",
                    endpoint="chat.completions", prompt_tokens=100, completion_tokens=50,
                    total_tokens=150, cache_read_tokens=64, cache_write_tokens=0,
                    cache_write_1h_tokens=0, reasoning_tokens=30, cost_usd=Decimal("0.001")),
    ]


EXPECTED_BY_PROTOCOL = {
    "chat": {"requests": 1, "prompt_tokens": 100, "completion_tokens": 50,
             "cache_read_tokens": 64, "cache_write_tokens": 0, "cache_write_1h_tokens": 0,
             "reasoning_tokens": 30, "cost_usd": "0.001"},
    "messages": {"requests": 2, "prompt_tokens": 20_000, "completion_tokens": 4_000,
                 "cache_read_tokens": 4_010, "cache_write_tokens": 3_020,
                 "cache_write_1h_tokens": 1_005, "reasoning_tokens": 1_507,
                 "cost_usd": "0.1074"},
}


def by_protocol(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["protocol"]: {name: row[name] for name in EXPECTED_BY_PROTOCOL["chat"]}
            for row in rows}


def test_the_usage_report_groups_by_protocol_and_sums_cache_and_reasoning(
        tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path)
    with_store(url, lambda store: store.write_usage(protocol_records(time.time() - 120)))
    done = cli("usage", "report", "--by", "protocol", "--since", "1d", "--format", "json",
               database_url=url)
    assert done.returncode == 0, done.stderr
    assert by_protocol(json.loads(done.stdout)) == EXPECTED_BY_PROTOCOL
    table = cli("usage", "report", "--by", "protocol,model", database_url=url).stdout
    assert "CACHE_WRITE_1H_TOKENS" in table.splitlines()[0]
    bad = cli("usage", "report", "--by", "colour", database_url=url)
    assert bad.returncode != 0 and "protocol" in bad.stderr


def test_the_admin_api_reports_by_protocol(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    with_store(admin_gw.settings.database_url,
               lambda store: store.write_usage(protocol_records(time.time() - 120)))
    with admin_gw.client() as c:
        report = openapi.check(c.get("/usage", params={"by": "protocol", "since": "0"}))
    assert report.status_code == 200, report.text
    assert by_protocol(report.json()["rows"]) == EXPECTED_BY_PROTOCOL
