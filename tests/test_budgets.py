"""Budgets at admission: output caps clamped or refused, the budget-aware clamp, tokens
per minute with OpenAI's headers, streams stopped where the budget ends; and usage reports
that add up."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from llm_gateway.billing.model import BudgetScope, OverCap
from llm_gateway.billing.records import UsageRecord
from llm_gateway.stores import open_store
from tests.billing_support import set_budget, set_price
from tests.routing_support import CHAT, provider, routed_gateway
from tests.support import BIN, create_key

ROUTES = {"providers": {"p": provider("http://127.0.0.1:1/api/v1")}}


def routes_to(url: str) -> dict[str, Any]:
    return {"providers": {"p": provider(url)},
            "models": {"chat-fast": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]}}}


def test_max_tokens_over_the_cap_is_clamped_or_refused(tmp_path: Path, fake, fake_url: str,
                                                       monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with routed_gateway(tmp_path, routes_to(fake_url), monkeypatch) as gw:
        clamped, refused = gw.key_record("clamped"), gw.key_record("refused")
        set_budget(gw.database_url, BudgetScope.KEY, clamped[0].id, max_output_tokens=40)
        set_budget(gw.database_url, BudgetScope.KEY, refused[0].id, max_output_tokens=40,
                   over_cap=OverCap.REJECT)
        response = gw.chat(clamped[1], {**CHAT, "max_tokens": 500})
        assert response.status_code == 200
        assert response.headers["x-llm-gateway-max-tokens-clamped"] == "40"
        assert fake.requests[-1].json["max_tokens"] == 40
        no_cap = gw.chat(clamped[1])  # no max_tokens: the cap is sent, so the estimate holds
        assert fake.requests[-1].json["max_tokens"] == 40 and no_cap.status_code == 200
        refusal = gw.chat(refused[1], {**CHAT, "max_tokens": 500})
        assert (refusal.status_code, refusal.json()["error"]["code"]) == (
            400, "max_tokens_too_large")
        assert gw.chat(refused[1], {**CHAT, "max_tokens": 30}).status_code == 200


def test_the_remaining_budget_lowers_the_cap(tmp_path: Path, fake, fake_url: str,
                                            monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with routed_gateway(tmp_path, routes_to(fake_url), monkeypatch) as gw:
        set_price(gw.database_url, "p", "llama-3.3-70b", "0", "10")  # 1e-5 USD an output token
        record, key = gw.key_record("near")
        # 0.0004 USD pays for 40 output tokens; the request asks for 1000.
        set_budget(gw.database_url, BudgetScope.KEY, record.id, daily_usd=Decimal("0.0004"))
        gw.gateway.refresh_from_thread()
        response = gw.chat(key, {**CHAT, "max_tokens": 1000})
        assert response.status_code == 200
        assert response.headers["x-llm-gateway-max-tokens-clamped"] == "40"
        assert fake.requests[-1].json["max_tokens"] == 40
        [served] = gw.finished.wait_for(1)
        assert served.cost_usd is not None and served.cost_usd <= Decimal("0.0004")


def test_tokens_per_minute_answers_with_openais_headers(tmp_path: Path, fake_url: str,
                                                       monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with routed_gateway(tmp_path, routes_to(fake_url), monkeypatch) as gw:
        record, key = gw.key_record("tpm")
        set_budget(gw.database_url, BudgetScope.KEY, record.id, tokens_per_minute=300)
        first = gw.chat(key, {**CHAT, "max_tokens": 250})
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-tokens"] == "300"
        assert int(first.headers["x-ratelimit-remaining-tokens"]) < 300
        assert first.headers["x-ratelimit-reset-tokens"].endswith("s")
        second = gw.chat(key, {**CHAT, "max_tokens": 250})
        assert (second.status_code, second.json()["error"]["code"]) == (
            429, "rate_limit_exceeded")


def test_a_stream_stops_where_its_budget_ends(tmp_path: Path, fake_url: str,
                                              monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with routed_gateway(tmp_path, routes_to(fake_url), monkeypatch) as gw:
        set_price(gw.database_url, "p", "llama-3.3-70b", "0", "10")
        record, key = gw.key_record("streamer")
        set_budget(gw.database_url, BudgetScope.KEY, record.id, daily_usd=Decimal("0.001"),
                   stop_streams_at_budget=True)
        gw.gateway.refresh_from_thread()
        # Budget for 100 output tokens; the stream would send 50 chunks of 8.
        response = gw.chat(key, {**CHAT, "stream": True, "max_tokens": 100},
                           **{"x-fake-chunks": "50"})
        *_, error, done = response.text.strip().split("\n\n")
        assert json.loads(error.removeprefix("data: "))["error"]["code"] == "insufficient_quota"
        assert done == "data: [DONE]"
        [stopped] = gw.finished.wait_for(1)
        assert stopped.error_code == "insufficient_quota"
        # Settled to what was delivered: the frame that reached the budget went out (about
        # 9 tokens by the estimate), and nothing after it; the provider's usage, had it
        # come in the same read, may say less.
        assert stopped.completion_tokens <= 100 + 10
        assert stopped.cost_usd is not None and stopped.cost_usd <= Decimal("0.0011")


def _seeded(database_url: str) -> list[UsageRecord]:
    record = create_key(database_url, name="reporting")[0]
    base = 1_790_000_000.0  # 2026-09-21
    rows = []
    for index in range(30):
        rows.append(UsageRecord(
            request_id=f"req_seed_{index}", key_id=record.id, key_prefix=record.prefix,
            subject_id="team-a" if index % 3 else "team-b", adapter="asgi",
            endpoint="chat.completions", model="chat-fast" if index % 2 else "chat-big",
            provider="p", upstream_model="m", stream=False,
            status=500 if index % 10 == 0 else 200,
            error_code="upstream_error" if index % 10 == 0 else None,
            started_at=base + index * 3600, duration_ms=float(10 + index),
            prompt_tokens=10 + index, completion_tokens=20, total_tokens=30 + index,
            cost_usd=Decimal("0.0001234567") * (index + 1),
        ))

    async def work() -> None:
        store = open_store(database_url)
        try:
            await store.migrate()
            await store.write_usage(rows)
        finally:
            await store.close()

    import asyncio

    asyncio.run(work())
    return rows


def test_usage_report_totals_equal_the_rows_in_every_format(tmp_path: Path, fake_url: str,
                                                            monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with routed_gateway(tmp_path, routes_to(fake_url), monkeypatch) as gw:
        rows = _seeded(gw.database_url)
    env = {"DATABASE_URL": gw.database_url, "PATH": str(BIN)}

    def report(*args: str) -> str:
        return subprocess.run([str(BIN / "llm-gateway"), "usage", "report", *args], env=env,
                              capture_output=True, text=True, check=True, timeout=60).stdout

    by_model = json.loads(report("--by", "model", "--format", "json"))
    assert {row["model"] for row in by_model} == {"chat-fast", "chat-big"}
    assert sum(row["requests"] for row in by_model) == len(rows)
    assert sum(row["errors"] for row in by_model) == 3
    assert sum(Decimal(row["cost_usd"]) for row in by_model) == sum(r.cost_usd for r in rows)  # type: ignore[misc]
    assert sum(row["total_tokens"] for row in by_model) == sum(r.total_tokens for r in rows)
    by_key = json.loads(report("--by", "key", "--format", "json"))
    assert {(row["key_name"], row["subject"]) for row in by_key} == {
        ("reporting", "team-a"), ("reporting", "team-b")}
    for field in ("key_id", "key_prefix", "requests", "errors", "prompt_tokens",
                  "completion_tokens", "total_tokens", "cost_usd", "provider_cost_usd",
                  "latency_p50_ms", "latency_p95_ms"):
        assert field in by_key[0]
    table = list(csv.DictReader(io.StringIO(report("--by", "day", "--format", "csv"))))
    assert sum(int(row["requests"]) for row in table) == len(rows)
    assert len(table) == len({time.gmtime(r.started_at)[:3] for r in rows})
    text = report("--by", "provider")
    assert "REQUESTS" in text and "30" in text.splitlines()[1]
    since = report("--by", "model", "--format", "json", "--since", "2026-09-22T00:00:00")
    assert sum(row["requests"] for row in json.loads(since)) < len(rows)
