"""The maintained price catalogue: `prices sync` loads the installed genai-prices dataset
(and a provider's own published list) as dated rows, operator prices always win, a change
shows as a diff first, and a request for a catalogue model costs exactly what the dataset
says, cache reads, 5-minute and 1-hour writes and long contexts included. `prices list
--unpriced` names every routed model without a price."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest
import yaml

from llm_gateway.billing.catalogue import Routed, catalogue_prices
from llm_gateway.billing.model import Price, PriceSource
from llm_gateway.billing.prices import PriceBook, cost_of
from llm_gateway.stores import open_store
from llm_gateway.stores.admin import AuditEvent
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from tests.agent_support import (  # noqa: F401 (fixtures)
    CLAUDE,
    PROVIDER_KEY,
    agent_routes,
    agent_surface,
    claude_fake,
    gpt_fake,
)
from tests.support import BIN

ANTHROPIC = Routed(provider="anthropic", profile="anthropic", base_url="http://x/v1",
                   model=CLAUDE)


def cli(config: Path, *args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llm-gateway"), "--config", str(config), "prices", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "DATABASE_URL": database_url, "AGENT_TEST_KEY": PROVIDER_KEY})


def routes_file(directory: Path, routes: dict[str, Any]) -> Path:
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(routes))
    return path


def stored_prices(url: str) -> list[Price]:
    async def work() -> list[Price]:
        store = open_store(url)
        try:
            await store.migrate()
            return await store.prices()  # type: ignore[attr-defined,no-any-return]
        finally:
            await store.close()

    return asyncio.run(work())


def put_price(url: str, price: Price) -> None:
    async def work() -> None:
        store = open_store(url)
        try:
            await store.migrate()
            await store.set_price(price, audit=AuditEvent(  # type: ignore[attr-defined]
                id=str(uuid.uuid4()), at=time.time(), actor="test", action="price.set",
                target="test"))
        finally:
            await store.close()

    asyncio.run(work())


def dataset_cost(record: Any) -> Decimal:
    """What genai-prices itself says the record's tokens cost."""
    usage = genai_prices.Usage(
        input_tokens=record.prompt_tokens, output_tokens=record.completion_tokens,
        cache_read_tokens=record.cache_read_tokens, cache_write_tokens=record.cache_write_tokens,
        cache_write_1h_tokens=record.cache_write_1h_tokens)
    calculation = genai_prices.calc_price(
        usage, CLAUDE, provider_id="anthropic",
        genai_request_timestamp=dt.datetime.fromtimestamp(record.started_at, dt.UTC))
    return calculation.total_price


@pytest.fixture
def synced(tmp_path: Path, claude_fake: tuple[FakeUpstream, str],  # noqa: F811
           gpt_fake: tuple[FakeUpstream, str]) -> Iterator[str]:  # noqa: F811
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    config = routes_file(tmp_path, agent_routes(claude_fake[1], gpt_fake[1]))
    done = cli(config, "sync", database_url=url)
    assert done.returncode == 0, done.stderr
    assert f"anthropic/{CLAUDE} (catalogue" in done.stdout
    yield url


# ---- acceptance: a catalogue model's request costs the dataset's price -------------------

def test_a_synced_catalogue_model_costs_the_datasets_price_with_every_cache_kind(
    synced: str, tmp_path: Path, claude_fake: tuple[FakeUpstream, str],  # noqa: F811
    gpt_fake: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    with agent_surface("serve", tmp_path, claude_fake, gpt_fake, monkeypatch,
                       database_url=synced) as on:
        client = on.anthropic(on.key())
        client.messages.create(
            model="claude", max_tokens=200,
            messages=[{"role": "user", "content": "word " * 5000}],
            extra_headers={"x-fake-cache-read-tokens": "3000",
                           "x-fake-cache-write-tokens": "1200",
                           "x-fake-cache-write-1h-tokens": "400"})
        [record] = on.finished.wait_for(1)
    assert (record.cache_read_tokens, record.cache_write_tokens,
            record.cache_write_1h_tokens) == (3000, 1600, 400)
    expected = dataset_cost(record)
    assert expected > 0 and record.cost_usd is not None
    assert abs(record.cost_usd - expected) <= Decimal("1e-8"), (record.cost_usd, expected)


def test_a_prompt_above_the_long_context_threshold_costs_the_datasets_tier(
    synced: str, tmp_path: Path, claude_fake: tuple[FakeUpstream, str],  # noqa: F811
    gpt_fake: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    with agent_surface("serve", tmp_path, claude_fake, gpt_fake, monkeypatch,
                       database_url=synced, request_body_limit_bytes=4_000_000) as on:
        on.anthropic(on.key()).messages.create(
            model="claude", max_tokens=50,
            messages=[{"role": "user", "content": "w " * 200_100}],
            extra_headers={"x-fake-cache-read-tokens": "100000",
                           "x-fake-cache-write-1h-tokens": "1000"})
        [record] = on.finished.wait_for(1)
    assert record.prompt_tokens > 200_000
    expected = dataset_cost(record)
    assert record.cost_usd is not None
    assert abs(record.cost_usd - expected) <= Decimal("1e-8"), (record.cost_usd, expected)
    [base] = [p for p in stored_prices(synced) if p.model == CLAUDE]
    assert record.cost_usd > cost_of(base, prompt_tokens=200_000, completion_tokens=0)


# ---- the dataset as rows ------------------------------------------------------------------

def test_the_dataset_becomes_dated_rows_with_its_matching_and_tiers() -> None:
    # Matched as the dataset matches names: a dated snapshot of the model is the model.
    [row] = catalogue_prices(Routed("anthropic", "anthropic", "http://x/v1",
                                    "claude-sonnet-4-5-20250929")) or []
    assert (row.source, row.effective_from, row.long_context_above) == (
        PriceSource.CATALOGUE, 0.0, 200_000)
    assert row.long_context is not None and row.long_context.input_per_mtok > row.input_per_mtok
    # A dated change: one row per price in force from its start date.
    dated = catalogue_prices(Routed("anthropic", "anthropic", "http://x/v1",
                                    "claude-sonnet-4-6")) or []
    assert [p.effective_from for p in dated] == [
        0.0, dt.datetime(2026, 3, 13, tzinfo=dt.UTC).timestamp()]
    # A provider the profile does not name is found by its base URL, when the dataset has it.
    assert catalogue_prices(Routed("ds", "generic", "https://api.deepseek.com/v1",
                                   "deepseek-chat")) is not None
    assert catalogue_prices(Routed("v", "venice", "https://api.venice.ai/api/v1",
                                   "llama-3.3-70b")) is None


def test_an_operator_price_outranks_the_catalogue_whatever_their_dates() -> None:
    operator = Price("anthropic", CLAUDE, Decimal(1), Decimal(2), effective_from=100.0)
    later = Price("anthropic", CLAUDE, Decimal(3), Decimal(15), effective_from=200.0,
                  source=PriceSource.CATALOGUE)
    listed = Price("anthropic", CLAUDE, Decimal(4), Decimal(16), effective_from=150.0,
                   source=PriceSource.PROVIDER)
    book = PriceBook([later, operator, listed])
    assert book.price_at("anthropic", CLAUDE, 300.0) == operator
    assert book.price_at("anthropic", CLAUDE, 120.0) == operator
    # Before the operator's price: the provider's published one, else the catalogue's.
    assert book.price_at("anthropic", CLAUDE, 50.0) is None
    assert PriceBook([later, listed]).price_at("anthropic", CLAUDE, 300.0) == listed
    assert PriceBook([later]).price_at("anthropic", CLAUDE, 300.0) == later


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'prices.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_the_store_keeps_source_and_tiers_and_never_lets_a_sync_replace_an_operator(
    store_url: str,
) -> None:
    [row] = catalogue_prices(ANTHROPIC) or []
    put_price(store_url, row)
    [kept] = stored_prices(store_url)
    assert kept == row  # source, threshold and long-context rates round-trip
    operator = Price("anthropic", CLAUDE, Decimal(1), Decimal(2), effective_from=0.0)
    put_price(store_url, operator)
    put_price(store_url, row)  # a later sync at the same moment
    [kept] = stored_prices(store_url)
    assert kept.source is PriceSource.OPERATOR and kept.input_per_mtok == 1

    async def lookup() -> Price | None:
        store = open_store(store_url)
        try:
            later = Price("anthropic", CLAUDE, Decimal(9), Decimal(9), effective_from=50.0,
                          source=PriceSource.CATALOGUE)
            await store.set_price(later, audit=AuditEvent(  # type: ignore[attr-defined]
                id=str(uuid.uuid4()), at=time.time(), actor="t", action="a", target="t"))
            return await store.price_at("anthropic", CLAUDE, 100.0)  # type: ignore[attr-defined,no-any-return]
        finally:
            await store.close()

    assert asyncio.run(lookup()) == operator


# ---- the command ----------------------------------------------------------------------------

def test_sync_shows_a_diff_writes_nothing_on_a_dry_run_and_spares_operator_prices(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    routes = {"providers": {"anthropic": {"base_url": "http://127.0.0.1:9/v1",
                                          "profile": "anthropic"},
                            "openai": {"base_url": "http://127.0.0.1:9/v1", "profile": "openai"}},
              "default_provider": "openai",
              "models": {"claude": {"targets": [{"provider": "anthropic", "model": CLAUDE}]},
                         "gpt": {"targets": [{"provider": "openai", "model": "gpt-4o-mini"}]}}}
    config = routes_file(tmp_path, routes)
    [row] = catalogue_prices(ANTHROPIC) or []
    put_price(url, Price("anthropic", CLAUDE, Decimal("2.5"), row.output_per_mtok, 0.0,
                         row.cached_input_per_mtok, row.cache_write_per_mtok,
                         row.cache_write_1h_per_mtok, PriceSource.CATALOGUE,
                         row.long_context_above, row.long_context))
    put_price(url, Price("openai", "gpt-4o-mini", Decimal(1), Decimal(1), 0.0))  # operator's
    dry = cli(config, "sync", "--dry-run", database_url=url)
    assert dry.returncode == 0, dry.stderr
    assert f"anthropic/{CLAUDE} (catalogue" in dry.stdout
    assert "input_per_mtok: 2.5 → 3" in dry.stdout
    assert "gpt-4o-mini" not in dry.stdout  # the operator's price is not touched
    assert "1 price would change (--dry-run: nothing written)" in dry.stdout
    assert {p.model: p.input_per_mtok for p in stored_prices(url)}[CLAUDE] == Decimal("2.5")
    done = cli(config, "sync", "--provider", "anthropic", database_url=url)
    assert done.returncode == 0 and "1 price written" in done.stdout, done.stderr
    prices = {p.model: p for p in stored_prices(url)}
    assert prices[CLAUDE].input_per_mtok == 3
    assert prices["gpt-4o-mini"].source is PriceSource.OPERATOR
    assert "0 prices written" in cli(config, "sync", database_url=url).stdout
    unknown = cli(config, "sync", "--provider", "nobody", database_url=url)
    assert unknown.returncode == 2 and "nobody" in unknown.stderr


def test_sync_reads_prices_from_a_provider_whose_model_list_has_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    # The fake refuses a request without the provider's key: the list is read with it.
    fake = FakeUpstream(usage_mode="venice", api_key=PROVIDER_KEY)
    with running_fake_upstream(fake) as (_, venice_url):
        config = routes_file(tmp_path, {
            "providers": {"venice": {"base_url": venice_url, "profile": "venice",
                                     "api_key_env": "AGENT_TEST_KEY"}},
            "default_provider": "venice",
            "models": {"llama": {"targets": [{"provider": "venice", "model": "llama-3.3-70b"}]},
                       "odd": {"targets": [{"provider": "venice", "model": "not-listed"}]}}})
        done = cli(config, "sync", database_url=url)
        again = cli(config, "sync", database_url=url)
        unpriced = cli(config, "list", "--unpriced", "--json", database_url=url)
    assert done.returncode == 0, done.stderr
    assert "venice/llama-3.3-70b (provider" in done.stdout
    assert "venice/not-listed: neither the catalogue nor the provider's model list" in done.stderr
    [listed] = stored_prices(url)
    assert (listed.source, listed.input_per_mtok, listed.output_per_mtok) == (
        PriceSource.PROVIDER, Decimal("0.7"), Decimal("2.8"))
    assert "0 prices written" in again.stdout  # the same list: no new row
    assert json.loads(unpriced.stdout) == [
        {"provider": "venice", "model": "not-listed", "aliases": ["odd"]}]


def test_prices_list_unpriced_names_each_routed_model_and_its_aliases(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    config = routes_file(tmp_path, {
        "providers": {"p": {"base_url": "http://127.0.0.1:9/v1", "profile": "generic"}},
        "default_provider": "p",
        "models": {"a": {"targets": [{"provider": "p", "model": "m1"},
                                     {"provider": "p", "model": "m2"}]},
                   "b": {"targets": [{"provider": "p", "model": "m1"}]}}})
    put_price(url, Price("p", "m2", Decimal(1), Decimal(1), 0.0))
    table = cli(config, "list", "--unpriced", database_url=url)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["PROVIDER", "MODEL", "ALIASES"]
    assert table.stdout.splitlines()[1].split() == ["p", "m1", "a,", "b"]
    assert len(table.stdout.splitlines()) == 2
