"""Every request under a USD budget is priced, or refused: a target without a price (and
without a cost its provider reports) is refused with 400 model_not_priced before any call,
skipped when the alias has a priced one, or admitted under ``unpriced: allow`` and charged
what the provider reports; and a budget for 10 requests admits no more than 10 of 50 at
once at the table's prices."""

from __future__ import annotations

import concurrent.futures
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.billing.model import BudgetScope
from llm_gateway.protocols import protocol_at
from llm_gateway.routing.config import RouteError, parse_routes
from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from tests.billing_support import set_budget, set_price
from tests.routing_support import CHAT, provider, routed_gateway

MODEL = "llama-3.3-70b"


def routes(url: str, profile: str = "openai", *, target: dict[str, Any] | None = None,
           **provider_options: Any) -> dict[str, Any]:
    """chat-fast on one provider of ``profile`` (openai: it reports no cost of its own)."""
    return {"providers": {"p": provider(url, profile=profile, **provider_options)},
            "models": {"chat-fast": {"targets": [{"provider": "p", "model": MODEL,
                                                  **(target or {})}]}}}


def messages(url: str, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/messages", timeout=20, headers={
        "x-api-key": key, "anthropic-version": "2023-06-01"},
        json={"model": "chat-fast", "max_tokens": 50,
              "messages": [{"role": "user", "content": "Hello"}]})


def test_an_unpriced_model_is_refused_for_a_usd_budget_before_any_call(
        tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch: Any) -> None:
    with routed_gateway(tmp_path, routes(fake_url), monkeypatch) as gw:
        budgeted, key = gw.key_record("budgeted")
        set_budget(gw.database_url, BudgetScope.KEY, budgeted.id, daily_usd=Decimal("10"))
        refused = gw.chat(key)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "model_not_priced"
        assert "'p'" in error["message"] and f"'{MODEL}'" in error["message"]
        # In the caller's protocol's shape: Anthropic's for a Messages caller.
        anthropic = messages(gw.url, key)
        assert anthropic.status_code == 400
        assert anthropic.json()["type"] == "error"
        assert "has no price" in anthropic.json()["error"]["message"]
        assert fake.requests == []  # the provider was never called
        assert gw.chat(gw.key()).status_code == 200  # no budget: nothing to hold it to
        tokens, tokens_key = gw.key_record("tokens")
        set_budget(gw.database_url, BudgetScope.KEY, tokens.id, daily_tokens=100_000)
        assert gw.chat(tokens_key).status_code == 200  # a token budget needs no price
        set_price(gw.database_url, "p", MODEL, "1", "2")
        gw.gateway.refresh_from_thread()
        assert gw.chat(key).status_code == 200  # priced now


def test_an_unpriced_target_is_skipped_for_a_priced_one(tmp_path: Path, fake: FakeUpstream,
                                                       fake_url: str, monkeypatch: Any) -> None:
    two = {"providers": {"plain": provider(fake_url, profile="openai")},
           "models": {"chat-fast": {"targets": [
               {"provider": "plain", "model": "unpriced-model"},
               {"provider": "plain", "model": MODEL, "priority": 1}]}}}
    with routed_gateway(tmp_path, two, monkeypatch) as gw:
        set_price(gw.database_url, "plain", MODEL, "1", "2")
        record, key = gw.key_record("skips")
        set_budget(gw.database_url, BudgetScope.KEY, record.id, daily_usd=Decimal("10"))
        gw.gateway.refresh_from_thread()
        assert gw.chat(key).status_code == 200
        assert [r.json["model"] for r in fake.requests] == [MODEL]
        assert gw.chat(gw.key()).status_code == 200  # no budget: the first target serves
        assert fake.requests[-1].json["model"] == "unpriced-model"


def test_unpriced_allow_charges_the_budget_what_the_provider_reports(
        tmp_path: Path, fake_url: str, monkeypatch: Any) -> None:
    # generic: it reads a cost when one comes (the fake sends Venice's usage.cost), but is
    # not counted on to send one: refused by default, admitted by unpriced: allow.
    with routed_gateway(tmp_path, routes(fake_url, "generic", unpriced="allow"),
                        monkeypatch) as gw:
        probe = gw.chat(gw.key())
        assert probe.status_code == 200
        [probed] = gw.finished.wait_for(1)
        assert probed.cost_usd is None and probed.provider_cost_usd
        record, key = gw.key_record("allowed")
        # Exactly one request's worth: the second finds the budget spent.
        set_budget(gw.database_url, BudgetScope.KEY, record.id,
                   daily_usd=probed.provider_cost_usd)
        assert gw.chat(key).status_code == 200
        [_, charged] = gw.finished.wait_for(2)
        assert charged.provider_cost_usd == probed.provider_cost_usd
        time.sleep(0.3)  # the settlement runs off the request path
        spent = gw.chat(key)
        assert (spent.status_code, spent.json()["error"]["code"]) == (429, "insufficient_quota")


def test_unpriced_settings_per_provider_and_target(tmp_path: Path, fake: FakeUpstream,
                                                  fake_url: str, monkeypatch: Any) -> None:
    cases = [  # (profile, provider's setting, target's setting, served)
        ("venice", None, None, True),  # Venice reports each answer's cost
        ("venice", "refuse", None, False),
        ("generic", None, None, False),
        ("openai", None, "allow", True),
        ("openai", "allow", "refuse", False),  # the target's own setting wins
    ]
    for index, (profile, on_provider, on_target, served) in enumerate(cases):
        options = {"unpriced": on_provider} if on_provider else {}
        target = {"unpriced": on_target} if on_target else {}
        with routed_gateway(tmp_path / str(index), routes(fake_url, profile, target=target,
                                                          **options), monkeypatch) as gw:
            record, key = gw.key_record("k")
            set_budget(gw.database_url, BudgetScope.KEY, record.id, monthly_usd=Decimal("5"))
            answer = gw.chat(key)
            assert (answer.status_code == 200) is served, (profile, on_provider, on_target)
            if not served:
                assert answer.json()["error"]["code"] == "model_not_priced"


def test_unpriced_takes_refuse_or_allow_only() -> None:
    for where, document in (
        ("providers.p.unpriced", routes("http://x", unpriced="maybe")),
        ("models.chat-fast.targets[0].unpriced", routes("http://x", target={"unpriced": 1})),
    ):
        with pytest.raises(RouteError, match="expected refuse or allow") as raised:
            parse_routes(document, {})
        assert str(raised.value).startswith(where)
    table = parse_routes(routes("http://x", target={"unpriced": "allow"}), {})
    assert table.providers["p"].unpriced is None
    assert table.models["chat-fast"].targets[0].unpriced == "allow"


@pytest.mark.parametrize("backend", ["sqlite", "postgres+redis"])
def test_a_budget_for_10_admits_at_most_10_of_50_at_once(
        tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch: Any,
        request: pytest.FixtureRequest, backend: str) -> None:
    stores: dict[str, Any] = {"database_url": f"sqlite:///{tmp_path / 'g.db'}",
                              "redis_url": None}
    if backend == "postgres+redis":
        stores = {"database_url": request.getfixturevalue("postgres_url"),
                  "redis_url": request.getfixturevalue("redis_url")}
    patient = {"connect": 5, "first_byte": 30, "read": 30, "stream_idle": 5}
    with routed_gateway(tmp_path, routes(fake_url, timeouts=patient), monkeypatch,
                        **stores) as gw:
        set_price(gw.database_url, "p", MODEL, "10", "10")  # 1e-5 USD a token
        record, key = gw.key_record("ten", rate_limit_requests=100_000)
        body = {**CHAT, "max_tokens": 100}
        estimate = protocol_at("/v1/chat/completions").prompt_tokens(body)
        one = Decimal(estimate + 100) * Decimal("0.00001")  # what one request reserves
        set_budget(gw.database_url, BudgetScope.KEY, record.id, daily_usd=one * 10)
        gw.gateway.refresh_from_thread()
        # Every answer waits, so all 50 are decided while the admitted ones still hold
        # their reservations (a settlement to the cheaper real cost would free room, and a
        # later request would fit: that is not concurrency). Long, for a loaded machine.
        fake.push_fault(Fault(delay=8.0, times=50))
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda _: gw.chat(key, body), range(50)))
        served = [a for a in answers if a.status_code == 200]
        assert len(served) == 10  # exactly what the budget pays for, and no more
        records = gw.finished.wait_for(10)
        assert sum(r.cost_usd or 0 for r in records) <= one * 10
        assert {(a.status_code, a.json()["error"]["code"]) for a in answers
                if a.status_code != 200} == {(429, "insufficient_quota")}
