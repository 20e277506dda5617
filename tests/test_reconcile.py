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
from datetime import date
from decimal import Decimal
from typing import Any

import httpx
import pytest

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
from llm_gateway.billing.reconcile_render import as_json, as_table
from llm_gateway.billing.report_client import ReportFetchError, ReportSource, fetch_billed

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
