"""What the console and the reports show a new user: spend at the provider's reported cost
where no price applies, marked as such (never added to a price for the same request), and
the requests the gateway refused before admission, by kind, apart from the errors of
admitted ones: counted in the store per minute, key and code by every replica. Through
the admin API (checked against its OpenAPI document), ``llm-gateway usage report`` and
``usage refusals``, and the console in Chromium. On SQLite, and on Postgres with
TEST_DATABASE_URL."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest

from llm_gateway.billing.metering import UsageWriter
from llm_gateway.billing.records import UsageRecord
from llm_gateway.billing.refusals import RefusalBucket, RefusalTally, refusal_report
from llm_gateway.billing.reports import usage_report
from llm_gateway.cli import build_parser
from llm_gateway.errors import reject
from llm_gateway.keys import new_key_record
from llm_gateway.stores import open_store
from tests.support import create_key, roomy_window
from tests.test_admin_api import (  # noqa: F401 (fixtures)
    AdminGateway,
    OpenApi,
    admin_gw,
    chat,
    in_new_loop,
    openapi,
)
from tests.test_console import (  # noqa: F401 (a fixture)
    assert_accessible,
    browser,
    open_page,
    sign_in,
)

MODEL = "llama-3.3-70b"


def record(request_id: str, cost: str | None, provider_cost: str | None, *,
           key_id: str | None = None, started_at: float | None = None) -> UsageRecord:
    return UsageRecord(
        request_id=request_id, key_id=key_id, subject_id="team-a", adapter="serve",
        endpoint="chat.completions", model=MODEL, stream=False, status=200,
        started_at=started_at or time.time() - 60, duration_ms=10.0, provider="venice",
        upstream_model=MODEL, prompt_tokens=10, completion_tokens=5, total_tokens=15,
        cost_usd=None if cost is None else Decimal(cost),
        provider_cost_usd=None if provider_cost is None else Decimal(provider_cost))


def seed(database_url: str, records: list[UsageRecord],
         refusals: list[tuple[Any, ...]] = ()) -> None:  # type: ignore[assignment]
    async def write() -> None:
        store = open_store(database_url)
        try:
            await store.migrate()
            await store.write_usage(records)
            if refusals:
                await store.write_refusals(list(refusals))  # type: ignore[attr-defined]
        finally:
            await store.close()

    in_new_loop(write())  # a thread of its own: Playwright's loop may be running here


# Three requests: priced (the provider reported a cost too), unpriced at the provider's
# cost, and one with neither. Shown: 0.50 + 0.25, never the 0.40 beside the price.
MIXED = [("req_priced", "0.5", "0.4"), ("req_provider", None, "0.25"), ("req_none", None, None)]


def test_a_new_user_sees_the_providers_cost_and_refusals_by_kind(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    """No price set, Venice reports its cost: the admin API's spend is that cost, marked
    provider; 401, 403 and 429 are refusals by kind, not errors of admitted requests."""
    url = admin_gw.settings.database_url
    limited, key = create_key(url, rate_limit_requests=2,
                              rate_limit_window_seconds=roomy_window())
    allowed, narrow = create_key(url, name="narrow", allowed_models=("other-model",))
    assert chat(admin_gw.public, key).status_code == 200
    assert chat(admin_gw.public, key).status_code == 200
    assert chat(admin_gw.public, key).status_code == 429  # rate_limit_exceeded
    assert chat(admin_gw.public, narrow).status_code == 403  # model_not_allowed
    for _ in range(2):
        assert chat(admin_gw.public, "llmg_" + "x" * 38).status_code == 401
    admin_gw.gateway.flush_from_thread()
    with admin_gw.client() as c:
        [row] = openapi.check(c.get("/usage", params={"by": "model"})).json()["rows"]
        assert (row["requests"], row["errors"], row["cost_source"]) == (2, 0, "provider")
        assert Decimal(row["cost_usd"]) == 0 and Decimal(row["spend_usd"]) > 0
        assert row["spend_usd"] == row["provider_reported_usd"] == row["provider_cost_usd"]
        kinds = openapi.check(c.get("/refusals")).json()["rows"]
        assert {(r["status"], r["code"]): r["requests"] for r in kinds} == {
            (401, "invalid_api_key"): 2, (403, "model_not_allowed"): 1,
            (429, "rate_limit_exceeded"): 1}
        by_key = openapi.check(c.get("/refusals", params={"by": "key"})).json()["rows"]
        assert {(r["code"], r["key_id"], r["key_name"]) for r in by_key} == {
            ("invalid_api_key", None, None), ("model_not_allowed", allowed.id, "narrow"),
            ("rate_limit_exceeded", limited.id, "test")}
        assert openapi.check(c.get("/refusals", params={
            "since": "2025-02-01", "until": "2025-01-01"})).status_code == 400


def test_summaries_show_the_price_else_the_providers_cost_never_both(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    seed(admin_gw.settings.database_url, [record(*row) for row in MIXED])
    with admin_gw.client() as c:
        [row] = openapi.check(c.get("/usage", params={"by": "model"})).json()["rows"]
        for name, value in {"cost_usd": "0.5", "provider_cost_usd": "0.65", "spend_usd": "0.75",
                            "provider_reported_usd": "0.25", "cost_source": "mixed"}.items():
            assert row[name] == value, name
        views = {r: openapi.check(c.get(f"/usage/{r}")).json()["records"][0]["cost"]
                 for r, _, _ in MIXED}
    assert {r: view["source"] for r, view in views.items()} == {
        "req_priced": "price", "req_provider": "provider", "req_none": "none"}


def cli(*argv: str) -> int:
    """``llm-gateway ARGV`` in this process (the parser and handler ``main`` runs)."""
    args = build_parser().parse_args(list(argv))
    return int(args.handler(args))


def test_usage_report_and_refusals_carry_the_distinction(
    admin_gw: AdminGateway, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = admin_gw.settings.database_url
    key, _ = new_key_record(name="=cmd", subject_id="team-a", now=time.time())
    minute = int(time.time() // 60) * 60
    seed(url, [record(*row) for row in MIXED], [
        (minute, "", "", 401, "invalid_api_key", 7), (minute, key.id, "team-a", 429,
                                                      "insufficient_quota", 2)])
    monkeypatch.setenv("DATABASE_URL", url)
    assert cli("usage", "report", "--by", "model", "--format", "json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["spend_usd"], row["provider_reported_usd"], row["cost_source"]) == (
        "0.75", "0.25", "mixed")
    assert cli("usage", "report", "--by", "model", "--format", "csv") == 0
    [line] = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert (line["cost_usd"], line["spend_usd"], line["cost_source"]) == ("0.5", "0.75", "mixed")
    assert cli("usage", "report", "--by", "model") == 0
    table = capsys.readouterr().out
    assert "SPEND_USD" in table and "COST_SOURCE" in table and "mixed" in table
    assert "else the cost the provider reported" in table  # the legend under the table

    assert cli("usage", "refusals", "--format", "json", "--since", "1h") == 0
    assert {(r["code"], r["requests"]) for r in json.loads(capsys.readouterr().out)} == {
        ("invalid_api_key", 7), ("insufficient_quota", 2)}
    assert cli("usage", "refusals", "--by", "key,day", "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {(r["code"], r["key_id"]) for r in rows} == {
        ("invalid_api_key", ""), ("insufficient_quota", key.id)}
    assert cli("usage", "refusals", "--since", "2000-01-01", "--until", "2000-01-02") == 0
    assert capsys.readouterr().out.split() == ["STATUS", "CODE", "REQUESTS"]
    assert cli("usage", "refusals", "--by", "model") == 2
    assert "cannot group refusals by model" in capsys.readouterr().err


def test_refusals_add_up_across_replicas_within_bounds_and_retention(
    admin_gw: AdminGateway,  # noqa: F811
) -> None:
    """Two writers (two replicas) counting the same minute add up in the store; a store
    that does not answer keeps the counts (at most max_buckets) for the next pass;
    retention drops old minutes with the usage records."""
    url = admin_gw.settings.database_url
    at = time.time()

    class Down:
        async def write_refusals(self, rows: list[tuple[Any, ...]]) -> None:
            raise ConnectionError("down")

    async def work() -> list[dict[str, Any]]:
        store = open_store(url)
        try:
            await store.migrate()
            replicas = [UsageWriter(store), UsageWriter(store)]  # type: ignore[arg-type]
            for count, writer in zip((3, 4), replicas, strict=True):
                for _ in range(count):
                    writer.refused(reject("invalid_api_key", "no"), None, at)
                await writer.flush()
            down = UsageWriter(Down())  # type: ignore[arg-type]
            down.refused(reject("request_too_large", "big"), None, at)
            await down.flush()
            assert sum(down.refusals.counts.values()) == 1  # kept for the next pass
            old = (int(at // 86400) * 86400 - 40 * 86400, "", "", 413, "request_too_large", 5)
            await store.write_refusals([old])  # type: ignore[attr-defined]
            assert len(await refusal_report(store, ["day"])) == 2
            said = await store.drop_usage_before(  # type: ignore[attr-defined]
                dt.datetime.fromtimestamp(at - 30 * 86400, dt.UTC).date())
            assert "1 refusal counts" in said
            return await refusal_report(store, [])
        finally:
            await store.close()

    assert in_new_loop(work()) == [{"status": 401, "code": "invalid_api_key", "requests": 7}]
    tally = RefusalTally(max_buckets=2)
    for minute in (0, 60, 120):
        tally.add(RefusalBucket(minute, "", "", 401, "invalid_api_key"), 1)
    tally.add(RefusalBucket(0, "", "", 401, "invalid_api_key"), 1)  # a bucket it has
    assert (sum(tally.counts.values()), tally.dropped) == (3, 1)


# Chromium; the store's side of it (both dialects) is the tests above.
@pytest.mark.slow_once
def test_the_console_marks_provider_reported_spend_and_shows_refusals_by_kind(
    browser: Any, admin_gw: AdminGateway,  # noqa: F811
) -> None:
    """A new user, no price set, calls Venice (which reports its cost) and is refused
    (401, 429): the console shows that spend, marked, and the refusals by kind."""
    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        key, secret = pool.submit(create_key, admin_gw.settings.database_url, name="app",
                                  rate_limit_requests=2,
                                  rate_limit_window_seconds=roomy_window()).result()
    statuses = [chat(admin_gw.public, secret).status_code for _ in range(3)]
    statuses += [chat(admin_gw.public, "llmg_" + "y" * 38).status_code for _ in range(5)]
    assert statuses == [200, 200, 429, 401, 401, 401, 401, 401]
    admin_gw.gateway.flush_from_thread()
    [row] = in_new_loop(_report(admin_gw.settings.database_url))
    shown = f"${float(row['spend_usd']):.2g}"  # as the console rounds less than a cent
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, admin_gw)
    open_page(page, admin_gw, "overview")
    spend = page.get_by_role("listitem").filter(has_text="Spend")
    assert spend.locator(".stat-value").inner_text().split("\n") == [
        shown, "≈ provider-reported"]
    refused = page.get_by_role("listitem").filter(has_text="Refused")
    assert refused.locator(".stat-value").inner_text() == "6"
    kinds = page.get_by_role("table", name="Requests refused this week, by kind")
    assert [row.get_by_role("cell").all_inner_texts() for row in
            kinds.locator("tbody tr").all()] == [["invalid_api_key", "401", "5"],
                                                 ["rate_limit_exceeded", "429", "1"]]
    assert page.get_by_text("this is the cost the provider reported").count() >= 1
    assert_accessible(page)

    open_page(page, admin_gw, "usage")
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=MODEL, exact=True))
    assert row.get_by_role("cell").last.inner_text() != ""  # drawn
    spend_cell = row.locator("td[data-label=Spend]")
    # A narrow cell's mark is "≈"; its words are for a screen reader and in the legend.
    assert spend_cell.text_content() == f"{shown} ≈ provider-reported"
    assert spend_cell.locator(".cost-mark").get_attribute("title")
    refusals = page.get_by_role("table", name="Requests refused, by kind")
    assert refusals.locator("tbody tr").count() == 2
    # For one key: its own refusals (the 401s had no key).
    page.get_by_label("Key", exact=True).select_option(key.id)
    page.get_by_role("cell", name="invalid_api_key").wait_for(state="detached")
    assert [row.get_by_role("cell").all_inner_texts() for row in
            refusals.locator("tbody tr").all()] == [["rate_limit_exceeded", "429", "1"]]
    assert page.get_by_role("listitem").filter(has_text="Refused").locator(
        ".stat-value").inner_text() == "1"
    assert_accessible(page)
    assert errors == []


async def _report(database_url: str) -> list[dict[str, Any]]:
    store = open_store(database_url)
    try:
        return await usage_report(store, ["model"], latency=False)
    finally:
        await store.close()
