"""`llm-gateway reconcile`: the provider's own usage and cost report against the gateway's
records, per UTC day and model (issue 32).

The pure core (tolerance, missing days and models on either side, cache tokens, what
explains a drift, metric labels), each provider's report as its API documents it (pages,
cents, DIEM), the report client (pagination, errors naming the provider and status but
never the key), and end to end against each fake provider: requests through an in-process
gateway to the fake, then the command itself: exit 0 when the fake billed what it served,
exit 1 naming the day, model and drift once it over-bills by one request; the drift on
/metrics; the store's query and drift table on Postgres.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from asgi_middleware import create_app
from llm_gateway.billing.provider_reports import (
    AnthropicLedger,
    OpenAILedger,
    VeniceLedger,
    openai_line_item_model,
)
from llm_gateway.billing.reconcile import (
    OTHER_MODELS,
    Billed,
    Figures,
    Recorded,
    ToleranceError,
    metric_drifts,
    parse_tolerance,
    reconcile,
)
from llm_gateway.billing.reconcile_records import recorded as recorded_side
from llm_gateway.billing.reconcile_render import as_json, as_table
from llm_gateway.billing.records import UsageRecord
from llm_gateway.billing.report_client import ReportFetchError, ReportSource, fetch_billed
from llm_gateway.cli import main as cli_main
from llm_gateway.config import load_settings
from llm_gateway.stores import open_store
from llm_gateway.stores.reconcile_drift import DriftRow
from llm_gateway.telemetry.reconcile_metrics import ReconcileDriftCollector
from llm_gateway.testing.fake_ledger import Served, rates_per_mtok
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from llm_gateway.wiring import build_gateway
from tests.support import BIN, create_key, free_port, serve_in_thread, stop_process

DAY = "2026-12-01"
NEXT = "2026-12-02"


def usage(**values: Any) -> Figures:
    return Figures(**{name: Decimal(v) if name == "usd" else v for name, v in values.items()})


def full(requests: int = 10, tokens: int = 1000, usd: str = "1.00", **more: Any) -> Figures:
    return usage(requests=requests, input_tokens=tokens, output_tokens=tokens,
                 cache_read_tokens=more.get("read", 0), cache_write_tokens=more.get("write", 0),
                 usd=usd)


# ---- the pure core -----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("0.5%", Decimal("0.005")), ("0.005", Decimal("0.005")), (" 2 % ", Decimal("0.02")),
    ("0", Decimal(0)), ("0%", Decimal(0)), ("10%", Decimal("0.1")),
])
def test_a_tolerance_is_a_percentage_or_a_fraction(text: str, expected: Decimal) -> None:
    assert parse_tolerance(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1%", "100%", "1", "1.5", "nan", "inf", "5%%"])
def test_a_tolerance_that_is_no_fraction_is_refused_saying_why(text: str) -> None:
    with pytest.raises(ToleranceError, match="--tolerance"):
        parse_tolerance(text)


def test_billed_as_recorded_is_within_and_the_edges_of_the_tolerance_hold() -> None:
    ours = [Recorded(DAY, "m", full(requests=1000, tokens=1000, usd="100"))]
    exact = reconcile("p", [Billed(DAY, "m", full(requests=1000, tokens=1000, usd="100"))],
                      ours, since=DAY, until=NEXT)
    assert exact.within and [d.absolute for d in exact.lines[0].drifts] == [0] * 5 + [0]
    at_edge = reconcile("p", [Billed(DAY, "m", full(requests=1005, tokens=995, usd="100.5"))],
                        ours, since=DAY, until=NEXT, tolerance=Decimal("0.005"))
    assert at_edge.within  # exactly 0.5 % either way is still within
    past = reconcile("p", [Billed(DAY, "m", full(requests=1006, tokens=1000, usd="100"))],
                     ours, since=DAY, until=NEXT, tolerance=Decimal("0.005"))
    assert not past.within
    [requests] = [d for d in past.lines[0].drifts if not d.within]
    assert (requests.figure, requests.absolute, requests.relative) == (
        "requests", 6, Decimal("0.006"))


def test_a_day_or_model_only_one_side_has_is_compared_against_nothing() -> None:
    result = reconcile(
        "p", [Billed(DAY, "billed-only", full()), Billed(NEXT, "both", full())],
        [Recorded(DAY, "recorded-only", full()), Recorded(NEXT, "both", full())],
        since=DAY, until="2026-12-03")
    lines = {(line.day, line.model): line for line in result.lines}
    assert set(lines) == {(DAY, "billed-only"), (DAY, "recorded-only"), (NEXT, "both")}
    billed_only = lines[(DAY, "billed-only")]
    assert not billed_only.within and billed_only.worst_ratio == 1.0
    assert [d.relative for d in billed_only.drifts] == [None] * 3 + [Decimal(0)] * 2 + [None]
    recorded_only = lines[(DAY, "recorded-only")]
    assert not recorded_only.within and recorded_only.worst_ratio == -1.0
    assert lines[(NEXT, "both")].within
    assert not result.within


def test_all_zero_lines_are_left_out_and_rows_of_one_day_and_model_add_up() -> None:
    result = reconcile("p", [Billed(DAY, "m", usage(requests=1, input_tokens=10)),
                             Billed(DAY, "M", usage(usd="0.5")),  # matched ignoring case
                             Billed(DAY, "idle", usage(requests=0, usd="0"))],
                       [Recorded(DAY, "m", usage(requests=1, input_tokens=10, output_tokens=0,
                                                 cache_read_tokens=0, cache_write_tokens=0,
                                                 usd="0.5"))],
                       since=DAY, until=NEXT)
    assert [line.model for line in result.lines] == ["m"] and result.within


def test_cache_tokens_are_compared_reads_and_writes_apart() -> None:
    result = reconcile("p", [Billed(DAY, "m", full(read=500, write=100))],
                       [Recorded(DAY, "m", full(read=500, write=90))], since=DAY, until=NEXT)
    drifts = {d.figure: d for d in result.lines[0].drifts}
    assert drifts["cache_read_tokens"].within
    assert not drifts["cache_write_tokens"].within and drifts["cache_write_tokens"].absolute == 10


def test_a_figure_the_provider_does_not_report_is_not_compared() -> None:
    result = reconcile("p", [Billed(DAY, "m", full(requests=0))],  # Anthropic counts none
                       [Recorded(DAY, "m", full(requests=7))], since=DAY, until=NEXT,
                       compared=AnthropicLedger.compared)
    assert result.within and "requests" not in {d.figure for d in result.lines[0].drifts}
    assert as_json(result)["not_compared"] == ["requests"]


def test_the_records_that_explain_a_drift_are_counted_and_named() -> None:
    result = reconcile(
        "p", [Billed(DAY, "m", full(usd="2.00"))],
        [Recorded(DAY, "m", full(usd="1.00"), estimated=2, cost_unknown=1,
                  explaining=("req-a", "req-b", "req-c"))], since=DAY, until=NEXT)
    line = as_json(result)["lines"][0]
    assert line["explained_by"] == {"estimated_tokens": 2, "cost_unknown": 1,
                                    "request_ids": ["req-a", "req-b", "req-c"]}
    assert line["figures"]["usd"] == {"provider": "2", "gateway": "1", "drift": "1",
                                      "drift_ratio": 1.0, "within_tolerance": False}
    table = as_table(result)
    assert "explained in part by 2 record(s) with estimated tokens" in table
    assert "req-a" in table and "BEYOND tolerance 0.5%" in table


def test_the_metric_keeps_each_models_worst_drift_with_checked_names_only() -> None:
    result = reconcile("p", [Billed(DAY, "ok", full(requests=11)), Billed(NEXT, "ok", full()),
                             Billed(DAY, "bad\nname{x}", full())],
                       [Recorded(DAY, "ok", full()), Recorded(NEXT, "ok", full())],
                       since=DAY, until="2026-12-03")
    drifts = metric_drifts(result)
    assert drifts["ok"] == (pytest.approx(0.1), False)
    assert drifts[OTHER_MODELS] == (1.0, False)
    assert set(drifts) == {"ok", OTHER_MODELS}


def test_the_table_shows_no_control_character_of_a_model_name() -> None:
    result = reconcile("p", [Billed(DAY, "evil\x1b[2Jname", full())], [],
                       since=DAY, until=NEXT)
    assert "\x1b" not in as_table(result) and "evil?[2Jname" in as_table(result)
    assert json.loads(json.dumps(as_json(result)))["lines"][0]["model"] == "evil\x1b[2Jname"


# ---- each provider's report, as documented ----------------------------------------------

def test_openais_usage_and_costs_pages_read_as_documented() -> None:
    ledger = OpenAILedger()
    usage_stream, costs_stream = ledger.streams(date(2026, 12, 1), date(2026, 12, 3))
    assert dict(usage_stream.query) == {
        "start_time": "1796083200", "end_time": "1796256000", "bucket_width": "1d",
        "limit": "31", "group_by": "model"}
    page = {"object": "page", "has_more": True, "next_page": "page_AAAA", "data": [
        {"object": "bucket", "start_time": 1796083200, "end_time": 1796169600, "results": [
            {"object": "organization.usage.completions.result", "input_tokens": 1000,
             "input_cached_tokens": 400, "input_cache_write_tokens": 100,
             "output_tokens": 500, "num_model_requests": 5, "model": "gpt-4o-mini"}]}]}
    items, following = ledger.page(usage_stream, page)
    assert dict(following or ())["page"] == "page_AAAA"
    [row] = ledger.rows(usage_stream, items)
    assert row == Billed(DAY, "gpt-4o-mini", Figures(5, 1000, 500, 400, 100))
    costs = {"object": "page", "has_more": False, "next_page": None, "data": [
        {"object": "bucket", "start_time": 1796083200, "end_time": 1796169600, "results": [
            {"object": "organization.costs.result", "amount": {"value": 0.06,
                                                               "currency": "usd"},
             "line_item": "gpt-4o-mini, cached input"}]}]}
    items, following = ledger.page(costs_stream, costs)
    assert following is None
    assert ledger.rows(costs_stream, items) == [
        Billed(DAY, "gpt-4o-mini", Figures(usd=Decimal("0.06")))]


@pytest.mark.parametrize(("item", "model"), [
    ("gpt-4o-2024-08-06, input", "gpt-4o-2024-08-06"),
    ("gpt-4o-mini-2024-07-18, cached input", "gpt-4o-mini-2024-07-18"),
    ("priority | gpt-5.6-sol, output, long context", "gpt-5.6-sol"),
    ("web search tool calls", "web search tool calls"),
])
def test_an_openai_costs_line_item_names_its_model(item: str, model: str) -> None:
    assert openai_line_item_model(item) == model


def test_anthropics_usage_counts_every_input_token_and_its_costs_are_cents() -> None:
    ledger = AnthropicLedger()
    usage_stream, costs_stream = ledger.streams(date(2026, 12, 1), date(2026, 12, 2))
    assert ("group_by[]", "model") in usage_stream.query
    assert ("starting_at", "2026-12-01T00:00:00Z") in usage_stream.query
    assert ledger.headers("sk-ant-admin-x") == [("x-api-key", "sk-ant-admin-x"),
                                                ("anthropic-version", "2023-06-01")]
    bucket = {"starting_at": "2026-12-01T00:00:00Z", "ending_at": "2026-12-02T00:00:00Z",
              "results": [{"uncached_input_tokens": 100, "cache_read_input_tokens": 50,
                           "cache_creation": {"ephemeral_5m_input_tokens": 20,
                                              "ephemeral_1h_input_tokens": 5},
                           "output_tokens": 70, "model": "claude-sonnet-4-5"}]}
    [row] = ledger.rows(usage_stream, [bucket])
    assert row.figures == Figures(None, 175, 70, 50, 25)
    costs = {"starting_at": "2026-12-01T00:00:00Z", "results": [
        {"currency": "USD", "amount": "123.45", "model": "claude-sonnet-4-5",
         "description": "Claude Sonnet 4.5 Usage - Input Tokens", "cost_type": "tokens"},
        {"currency": "USD", "amount": "50", "model": None, "description": "Web Search",
         "cost_type": "web_search"}]}
    rows = ledger.rows(costs_stream, [costs])
    assert rows == [Billed(DAY, "claude-sonnet-4-5", Figures(usd=Decimal("1.2345"))),
                    Billed(DAY, "Web Search", Figures(usd=Decimal("0.5")))]


def venice_entry(request: str, sku: str, units: float, price: float, amount: float,
                 currency: str = "USD", prompt: int = 339, completion: int = 227) -> dict:
    return {"timestamp": "2026-12-01T19:05:10.504Z", "sku": sku, "units": units,
            "pricePerUnitUsd": price, "amount": amount, "currency": currency,
            "notes": "API Inference",
            "inferenceDetails": {"requestId": request, "promptTokens": prompt,
                                 "completionTokens": completion,
                                 "inferenceExecutionTime": 2964}}


def test_venices_ledger_counts_each_request_once_and_values_diem_at_its_usd_price() -> None:
    ledger = VeniceLedger()
    [stream] = ledger.streams(date(2026, 12, 1), date(2026, 12, 2))
    assert stream.path == "/billing/usage-history"
    entries = [
        venice_entry("chatcmpl-1", "zai-org-glm-5-1-llm-input-mtoken", 0.000339, 0.7,
                     -0.0002373),
        venice_entry("chatcmpl-1", "zai-org-glm-5-1-llm-output-mtoken", 0.000227, 2.8,
                     -0.0006356),
        # Charged in DIEM: its amount is DIEM, its USD value units x the USD price.
        venice_entry("chatcmpl-2", "zai-org-glm-5-1-llm-output-mtoken", 0.000227, 2.8,
                     -0.06356, currency="DIEM", prompt=0),
        {"timestamp": "2026-12-01T10:00:00Z", "sku": "grok-imagine-image-image-unit",
         "units": 1, "pricePerUnitUsd": 0.1, "amount": -0.1, "currency": "USD",
         "notes": "API Inference", "inferenceDetails": None},
    ]
    _, following = ledger.page(stream, {"data": entries[:2], "nextCursor": "abc"})
    assert following == (("cursor", "abc"),)
    _, following = ledger.page(stream, {"data": entries[2:], "nextCursor": None})
    assert following is None
    result = reconcile("venice", ledger.rows(stream, entries), [
        Recorded(DAY, "zai-org-glm-5.1", Figures(2, 339, 454, 0, 0, Decimal("0.0015085")))],
        since=DAY, until=NEXT, compared=ledger.compared)
    glm = next(line for line in result.lines if line.model == "zai-org-glm-5.1")
    assert glm.within, as_table(result)
    image = next(line for line in result.lines if line.model != "zai-org-glm-5.1")
    assert image.model == "grok-imagine-image-image-unit" and not image.within


# ---- the report client --------------------------------------------------------------------

SOURCE = ReportSource(name="openai", base_url="https://api.openai.example/v1")
ADMIN_KEY = "sk-admin-very-secret-0123456789"


def run_fetch(handler: Any, ledger: Any = None) -> list[Billed]:
    return asyncio.run(fetch_billed(SOURCE, ledger or OpenAILedger(), ADMIN_KEY,
                                    date(2026, 12, 1), date(2026, 12, 2),
                                    transport=httpx.MockTransport(handler)))


def test_the_client_follows_every_page_of_every_stream_with_the_admin_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        page = request.url.params.get("page")
        results = [{"object": "organization.usage.completions.result", "input_tokens": 1,
                    "output_tokens": 1, "num_model_requests": 1, "model": "m"}]
        return httpx.Response(200, json={
            "object": "page", "has_more": page is None, "next_page": "page_2",
            "data": [{"start_time": 1796083200, "end_time": 1796169600,
                      "results": results if "usage" in request.url.path else []}]})

    rows = run_fetch(handler)
    assert [r.url.path for r in seen] == ["/v1/organization/usage/completions"] * 2 + [
        "/v1/organization/costs"] * 2
    assert {r.headers["authorization"] for r in seen} == {f"Bearer {ADMIN_KEY}"}
    assert seen[1].url.params["page"] == "page_2" and seen[1].url.params["group_by"] == "model"
    assert len(rows) == 2


@pytest.mark.parametrize(("status", "body"), [
    (401, {"error": {"message": f"Incorrect API key provided: {ADMIN_KEY}"}}),
    (403, {"error": {"message": "Missing scopes: api.usage.read (key sk-admin-abc***xyz)"}}),
    (500, {"error": "oops"}),
])
def test_an_error_names_the_provider_and_status_and_never_the_key(status: int,
                                                                   body: Any) -> None:
    with pytest.raises(ReportFetchError) as raised:
        run_fetch(lambda request: httpx.Response(status, json=body))
    message = str(raised.value)
    assert message.startswith("openai: GET /organization/usage/completions: answered "
                              f"HTTP {status}")
    assert ADMIN_KEY not in message and "sk-admin-abc" not in message


def test_a_timeout_or_an_undocumented_answer_is_a_clear_error() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(ReportFetchError, match=r"openai: GET .*: timed out"):
        run_fetch(slow)
    with pytest.raises(ReportFetchError, match="not the documented report"):
        run_fetch(lambda request: httpx.Response(200, json={"data": "nope"}))
    with pytest.raises(ReportFetchError, match="with no JSON"):
        run_fetch(lambda request: httpx.Response(200, text="<html>"))


# ---- end to end, against each fake provider -------------------------------------------------

KEY_ENV = "RECONCILE_TEST_KEY"
ADMIN_ENV = "RECONCILE_TEST_ADMIN_KEY"
FAKE_ADMIN_KEY = "sk-fake-admin-reconcile-0123456789"
# Per provider: the upstream model routed to, and what a request through the gateway is.
PROVIDERS = {"openai": "gpt-4o-mini-2024-07-18", "anthropic": "claude-sonnet-4-5",
             "venice": "llama-3.3-70b"}


def routes_and_prices(provider: str, url: str) -> dict[str, Any]:
    model = PROVIDERS[provider]
    document: dict[str, Any] = {
        "providers": {provider: {"base_url": url, "profile": provider, "api_key_env": KEY_ENV,
                                 "admin_key_env": ADMIN_ENV}},
        "models": {"m": {"targets": [{"provider": provider, "model": model}]}},
    }
    if provider != "venice":  # Venice's answers carry their cost; the others' are priced
        rates = rates_per_mtok(provider)
        document["prices"] = {provider: {model: {
            "input": str(rates["input"]), "output": str(rates["output"]),
            "cached_input": str(rates["cached_input"]),
            "cache_write": str(rates["cache_write_5m"]),
            "cache_write_1h": str(rates["cache_write_1h"])}}}
    return document


def send(provider: str, url: str, key: str, *, stream: bool, cache: bool) -> None:
    """One request through the gateway, in the protocol the provider speaks."""
    words = {"role": "user", "content": "reconcile these words please " * 20}
    if provider == "anthropic":
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        if cache:
            headers.update({"x-fake-cache-read-tokens": "40", "x-fake-cache-write-tokens": "20",
                            "x-fake-cache-write-1h-tokens": "10"})
        body = {"model": "m", "max_tokens": 64, "messages": [words], "stream": stream}
        answer = httpx.post(f"{url}/v1/messages", headers=headers, json=body, timeout=30)
    else:
        headers = {"authorization": f"Bearer {key}"}
        if cache:
            headers["x-fake-cached-tokens"] = "30"
        body = {"model": "m", "messages": [words], "stream": stream}
        answer = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body,
                            timeout=30)
    assert answer.status_code == 200, answer.text


def reconcile_cli(config: Path, *args: str) -> tuple[int, str, str]:
    """`llm-gateway --config FILE reconcile ARGS`, in process: (status, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(["--config", str(config), "reconcile", *args])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def reconciled(request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fake provider, a gateway in front of it (its routes and prices in a file the
    command reads too), three requests served; yields (provider, fake, config, gateway)."""
    provider = request.param
    with running_fake_upstream(FakeUpstream(usage_mode=provider,
                                            admin_key=FAKE_ADMIN_KEY)) as (fake, fake_url):
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump(routes_and_prices(provider, fake_url)))
        database = f"sqlite:///{tmp_path / 'gateway.db'}"
        for name, value in (("DATABASE_URL", database), (KEY_ENV, fake.api_key),
                            (ADMIN_ENV, FAKE_ADMIN_KEY), ("LOG_FORMAT", "text")):
            monkeypatch.setenv(name, value)
        settings = load_settings(dict(os.environ), str(config))
        gateway = build_gateway(settings, key_cache_seconds=0)
        with serve_in_thread(create_app(settings, gateway=gateway)) as url:
            key = create_key(database)[1]
            for stream, cache in ((False, False), (True, False), (False, True)):
                send(provider, url, key, stream=stream, cache=cache)
            gateway.flush_from_thread()
            assert len(fake.ledger.served) == 3
            yield provider, fake, config, url


def window() -> tuple[str, str]:
    """Yesterday up to tomorrow: whichever UTC day the requests fell on."""
    today = datetime.now(UTC).date()
    return (today - timedelta(days=1)).isoformat(), (today + timedelta(days=1)).isoformat()


@pytest.mark.slow_once
@pytest.mark.parametrize("reconciled", list(PROVIDERS), indirect=True)
def test_reconcile_exits_0_when_billed_as_served_and_1_naming_the_drift_when_over_billed(
        reconciled: Any) -> None:
    provider, fake, config, _ = reconciled
    model = PROVIDERS[provider]
    since, until = window()
    status, out, err = reconcile_cli(config, "--provider", provider, "--since", since,
                                     "--until", until, "--format", "json")
    assert status == 0, out + err
    report = json.loads(out)
    assert report["within_tolerance"] and report["provider"] == provider
    [line] = report["lines"]
    assert line["model"] == model and line["within_tolerance"]
    tokens = line["figures"]["input_tokens"]
    assert tokens["provider"] == tokens["gateway"] > 0
    if provider != "venice":  # the cache tokens reached both sides
        assert line["figures"]["cache_read_tokens"]["gateway"] > 0
    served_day = datetime.fromtimestamp(fake.ledger.served[-1].at, UTC).date().isoformat()

    fake.ledger.skew = 1  # the provider bills one request it never served
    status, out, err = reconcile_cli(config, "--provider", provider, "--since", since,
                                     "--until", until, "--format", "json")
    assert status == 1, out + err
    report = json.loads(out)
    [line] = report["lines"]
    assert (line["day"], line["model"], line["within_tolerance"]) == (served_day, model, False)
    beyond = {name for name, figure in line["figures"].items()
              if not figure["within_tolerance"]}
    assert {"input_tokens", "output_tokens", "usd"} <= beyond
    if provider != "anthropic":  # Anthropic's usage report counts no requests
        assert line["figures"]["requests"]["drift"] == 1
        assert line["figures"]["requests"]["drift_ratio"] == pytest.approx(1 / 3, abs=1e-6)
    else:
        assert "requests" not in line["figures"] and report["not_compared"] == ["requests"]
    assert report["drift_ratio_by_model"][model] > 0.005

    status, table, err = reconcile_cli(config, "--provider", provider, "--since", since,
                                       "--until", until)
    assert status == 1
    assert f"{served_day}  {model}" in table and "BEYOND" in table
    assert FAKE_ADMIN_KEY not in out + table + err


@pytest.mark.slow_once
@pytest.mark.parametrize("reconciled", ["venice"], indirect=True)
def test_under_billing_is_a_drift_too_and_diem_is_valued_in_usd(reconciled: Any) -> None:
    _, fake, config, _ = reconciled
    since, until = window()
    fake.ledger.currency = "DIEM"  # charged in DIEM: worth its USD list price
    assert reconcile_cli(config, "--provider", "venice", "--since", since,
                         "--until", until)[0] == 0
    fake.ledger.skew = -1
    status, out, _ = reconcile_cli(config, "--provider", "venice", "--since", since,
                                   "--until", until, "--format", "json")
    assert status == 1
    assert json.loads(out)["lines"][0]["figures"]["requests"]["drift"] == -1


@pytest.mark.slow_once
@pytest.mark.parametrize("reconciled", ["openai"], indirect=True)
def test_the_last_drift_reaches_every_gateways_metrics(reconciled: Any) -> None:
    _, fake, config, url = reconciled
    since, until = window()
    fake.ledger.skew = 1
    assert reconcile_cli(config, "--provider", "openai", "--since", since,
                         "--until", until)[0] == 1
    found = ""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "llm_gateway_reconcile_drift_ratio{" not in found:
        found = httpx.get(f"{url}/metrics", timeout=5).text  # the first scrape starts a read
        time.sleep(0.05)
    [sample] = [line for line in found.splitlines()
                if line.startswith("llm_gateway_reconcile_drift_ratio{")]
    assert f'model="{PROVIDERS["openai"]}"' in sample and 'provider="openai"' in sample
    # The worst figure's: the request billed twice was the one with 30 cached tokens.
    assert float(sample.rsplit(" ", 1)[1]) == 1.0
    assert 'llm_gateway_reconcile_last_run_timestamp_seconds{provider="openai"}' in found


# ---- what stops the command before it compares: exit 2, one clear line ----------------------

def stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: dict[str, Any],
            *args: str) -> tuple[int, str, str]:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "providers": {"p": {"api_key_env": KEY_ENV, **provider}},
        "models": {"m": {"targets": [{"provider": "p", "model": "x"}]}}}))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'gateway.db'}")
    monkeypatch.setenv(KEY_ENV, "sk-inference")
    monkeypatch.delenv(ADMIN_ENV, raising=False)
    return reconcile_cli(config, *(args or ("--provider", "p")))


OPENAI = {"base_url": "http://127.0.0.1:9/v1", "profile": "openai"}


@pytest.mark.parametrize(("provider", "args", "said"), [
    (OPENAI, (), "providers.p.admin_key_env is not set: name the variable"),
    ({**OPENAI, "admin_key_env": ADMIN_ENV}, (),
     f"{ADMIN_ENV} is not set (providers.p.admin_key_env): the provider's admin key"),
    ({**OPENAI, "profile": "generic", "admin_key_env": ADMIN_ENV}, (),
     "provider 'p' (profile generic) publishes no usage report the gateway reads"),
    (OPENAI, ("--provider", "nope"), "--provider: no provider 'nope' in the routes (known: p)"),
    (OPENAI, ("--provider", "p", "--since", "yesterday"),
     "--since: expected a day as YYYY-MM-DD, got 'yesterday'"),
    (OPENAI, ("--provider", "p", "--since", "2026-12-02", "--until", "2026-12-01"),
     "--until (2026-12-01) must be a later day than --since (2026-12-02)"),
    (OPENAI, ("--provider", "p", "--tolerance", "lots"), "--tolerance: expected a percentage"),
])
def test_what_stops_a_reconciliation_is_said_in_one_line_with_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: dict[str, Any],
        args: tuple[str, ...], said: str) -> None:
    status, out, err = stopped(tmp_path, monkeypatch, provider, *args)
    assert (status, out) == (2, "")
    assert err.startswith("llm-gateway reconcile: ") and said in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_admin_key_env_that_is_no_variable_name_is_a_route_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status, _, err = stopped(tmp_path, monkeypatch, {**OPENAI, "admin_key_env": ["X"]})
    assert status == 2 and "providers.p.admin_key_env: expected an environment variable" in err


def test_a_provider_that_refuses_the_admin_key_is_exit_2_naming_it_and_the_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_fake_upstream(FakeUpstream(usage_mode="openai",
                                            admin_key=FAKE_ADMIN_KEY)) as (_, url):
        monkeypatch.setenv(ADMIN_ENV, "sk-wrong-admin-key-0123456789")
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump(routes_and_prices("openai", url)))
        monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'gateway.db'}")
        monkeypatch.setenv(KEY_ENV, "sk-inference")
        status, out, err = reconcile_cli(config, "--provider", "openai")
    assert (status, out) == (2, "")
    assert ("llm-gateway reconcile: openai: GET /organization/usage/completions: answered "
            "HTTP 401") in err
    assert "sk-wrong-admin-key" not in err


# ---- the fake's report APIs behave as the real ones -----------------------------------------

def test_the_fakes_reports_take_the_admin_key_only_and_validate_their_queries() -> None:
    for mode, report, query in (
            ("openai", "/organization/usage/completions", "start_time=0"),
            ("anthropic", "/organizations/cost_report", "starting_at=2026-12-01T00:00:00Z"),
            ("venice", "/billing/usage-history", "pageSize=10")):
        with running_fake_upstream(FakeUpstream(usage_mode=mode,
                                                admin_key=FAKE_ADMIN_KEY)) as (fake, url):
            def get(path: str, key: str, mode: str = mode) -> httpx.Response:
                headers = ({"x-api-key": key, "anthropic-version": "2023-06-01"}
                           if mode == "anthropic" else {"authorization": f"Bearer {key}"})
                return httpx.get(f"{url}{path}", headers=headers, timeout=10)

            assert get(f"{report}?{query}", FAKE_ADMIN_KEY).status_code == 200
            assert get(f"{report}?{query}", fake.api_key).status_code == 401
            assert get("/models", FAKE_ADMIN_KEY).status_code == 401
            bad = {"openai": "bucket_width=1d", "anthropic": "limit=99&starting_at=x",
                   "venice": "cursor=abc&pageSize=10"}[mode]
            assert get(f"{report}?{bad}", FAKE_ADMIN_KEY).status_code == 400
        if mode == "venice":
            with running_fake_upstream(FakeUpstream(admin_key=FAKE_ADMIN_KEY)) as (_, url):
                gone = httpx.get(f"{url}/billing/usage",
                                 headers={"authorization": f"Bearer {FAKE_ADMIN_KEY}"})
                assert gone.status_code == 410 and "usage-history" in gone.text


def test_the_client_walks_the_fakes_pages_across_days() -> None:
    """Three requests on three days: a page per day (limit 1), a cursor per page."""
    day = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()
    fake = FakeUpstream(usage_mode="anthropic", admin_key=FAKE_ADMIN_KEY)
    for n in range(3):
        fake.ledger.served.append(Served(at=day + n * 86400, model="claude-x",
                                         request_id=f"msg_{n}", input_tokens=10 + n,
                                         output_tokens=5))
    with running_fake_upstream(fake) as (_, url):
        ledger = AnthropicLedger()
        source = ReportSource(name="anthropic", base_url=url)
        rows = asyncio.run(fetch_billed(source, ledger, FAKE_ADMIN_KEY, date(2026, 12, 1),
                                        date(2026, 12, 4)))
    by_day = {}
    for row in rows:
        by_day[row.day] = by_day.get(row.day, Figures()).plus(row.figures)
    assert sorted(by_day) == ["2026-12-01", "2026-12-02", "2026-12-03"]
    assert [by_day[d].input_tokens for d in sorted(by_day)] == [10, 11, 12]
    assert all(figures.usd and figures.usd > 0 for figures in by_day.values())


# ---- the gateway's side and the drift table, on both stores ---------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gateway.db'}"
    return str(request.getfixturevalue("postgres_url"))


def record(request_id: str, at: float, **fields: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "key_id": None, "subject_id": "s", "adapter": "asgi", "endpoint": "chat.completions",
        "model": "m", "stream": False, "status": 200, "duration_ms": 10.0, "provider": "p",
        "upstream_model": "gpt-x", "prompt_tokens": 100, "completion_tokens": 10,
        "cache_read_tokens": 20, "cost_usd": Decimal("0.001"), **fields}
    return UsageRecord(request_id=request_id, started_at=at, **values)


def test_the_gateways_side_sums_what_the_provider_billed_per_day_and_model(
        store_url: str) -> None:
    first = datetime(2026, 12, 1, 23, 59, 59, tzinfo=UTC).timestamp()
    second = first + 2  # the next UTC day
    records = [
        record("a", first), record("b", first, tokens_estimated=True, cost_usd=None,
                                   provider_cost_usd=Decimal("0.002")),
        record("c", first, cost_usd=None),  # cost unknown
        record("d", second, cache_write_tokens=5),
        record("e", first, status=500, error_code="upstream_error"),  # not billed
        record("f", first, endpoint="embeddings"),  # another report's
        record("g", first, endpoint="messages.count_tokens"),  # free
        record("h", first, provider="other"),
        record("i", first, upstream_model=None, status=200),  # never reached a model
        record("j", first - 86400 * 3),  # out of range
    ]

    async def work() -> tuple[list[Recorded], list[Any]]:
        store = open_store(store_url)
        try:
            await store.migrate()
            await store.write_usage(records)
            found = await recorded_side(store, "p", date(2026, 12, 1), date(2026, 12, 3))
            await store.replace_reconcile_drift(  # type: ignore[attr-defined]
                "p", {"gpt-x": (0.25, False), "old": (0.0, True)}, since="2026-12-01",
                until="2026-12-03", at=1796000000.5)
            await store.replace_reconcile_drift(  # type: ignore[attr-defined]
                "p", {"gpt-x": (-0.5, False)}, since="2026-12-01", until="2026-12-03",
                at=1796000001.5)
            await store.replace_reconcile_drift(  # type: ignore[attr-defined]
                "q", {"other-model": (0.0, True)}, since="2026-12-01", until="2026-12-02",
                at=1796000002.0)
            return found, await store.reconcile_drifts()  # type: ignore[attr-defined]
        finally:
            await store.close()

    found, drifts = asyncio.run(work())
    by_day = {row.day: row for row in found}
    assert sorted(by_day) == ["2026-12-01", "2026-12-02"]
    day_one = by_day["2026-12-01"]
    assert day_one.figures == Figures(3, 300, 30, 60, 0, Decimal("0.003"))
    assert (day_one.estimated, day_one.cost_unknown) == (1, 1)
    assert sorted(day_one.explaining) == ["b", "c"]
    assert by_day["2026-12-02"].figures == Figures(1, 100, 10, 20, 5, Decimal("0.001"))
    assert [(d.provider, d.model, d.drift_ratio, d.within_tolerance, d.since, d.until,
             d.reconciled_at) for d in drifts] == [
        ("p", "gpt-x", -0.5, False, "2026-12-01", "2026-12-03", 1796000001.5),
        ("q", "other-model", 0.0, True, "2026-12-01", "2026-12-02", 1796000002.0)]


def test_the_collector_reads_at_most_once_per_period_and_never_blocks_a_scrape() -> None:
    reads: list[float] = []
    now = [0.0]

    async def read() -> list[DriftRow]:
        reads.append(now[0])
        return [DriftRow("p", "gpt-x", 0.25, False, DAY, NEXT, 5.0),
                DriftRow("p", "bad name", 1.0, False, DAY, NEXT, 5.0)]

    collector = ReconcileDriftCollector(read, every=60, clock=lambda: now[0])

    async def scrape() -> dict[str, list[Any]]:
        found = {family.name: family.samples for family in collector.collect()}
        await asyncio.sleep(0)  # the read it started runs
        return found

    async def scrapes() -> list[dict[str, list[Any]]]:
        first = await scrape()  # empty: the read has only started
        now[0] = 30
        second = await scrape()
        now[0] = 61
        third = await scrape()
        return [first, second, third]

    first, second, third = asyncio.run(scrapes())
    assert first["llm_gateway_reconcile_drift_ratio"] == []
    [sample] = second["llm_gateway_reconcile_drift_ratio"]
    assert sample.labels == {"provider": "p", "model": "gpt-x"} and sample.value == 0.25
    assert reads == [0.0, 61]
    assert third["llm_gateway_reconcile_last_run_timestamp_seconds"][0].value == 5.0


@pytest.mark.slow_once
def test_the_fake_upstream_command_over_bills_as_told(tmp_path: Path) -> None:
    port = free_port()
    command = [str(BIN / "llm-gateway"), "fake-upstream", "--listen", f"127.0.0.1:{port}",
               "--usage-mode", "openai", "--admin-key", FAKE_ADMIN_KEY, "--over-bill", "1"]
    with tempfile.TemporaryFile(mode="w+") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)
        try:
            url = f"http://127.0.0.1:{port}/api/v1"
            deadline = time.monotonic() + 20
            while True:
                try:
                    answer = httpx.post(f"{url}/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": "hi"}]},
                        headers={"authorization": "Bearer sk-fake-upstream"}, timeout=2)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and process.poll() is None
                    time.sleep(0.05)
            assert answer.status_code == 200
            report = httpx.get(f"{url}/organization/usage/completions",
                               params={"start_time": int(time.time()) - 60},
                               headers={"authorization": f"Bearer {FAKE_ADMIN_KEY}"}).json()
        finally:
            stop_process(process)
    [bucket] = [b for b in report["data"] if b["results"]]
    assert bucket["results"][0]["num_model_requests"] == 2  # one served, one over-billed
