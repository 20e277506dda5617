"""An upstream that ignores the request's output cap (``max_tokens``, ``max_output_tokens``)
and reports no usage could overspend a budget by as many whole answers as there were
requests in flight: the reservation holds the cap, the settlement books whatever came. The
gateway counts the output as it relays it and ends a stream just past the cap itself, the
protocol's way (finish ``length`` / ``max_tokens`` / ``incomplete``, with the usage it
counted, then the end event), closes the upstream, and records it (``output_over_cap``,
estimated tokens); a JSON answer far above its cap is relayed, flagged the same way and
counted (``llm_gateway_output_over_cap_total``). The budget is charged what was relayed.
Each of these failed before the gateway counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_gateway.billing.model import BudgetScope
from llm_gateway.billing.quotas import usd_units
from llm_gateway.billing.records import UsageRecord
from llm_gateway.engine import Gateway
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_upstream import FakeUpstream, fake_reply_chunk, fake_reply_text
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.tokens import estimate_text, far_over_cap, stream_output_ceiling
from tests.agent_support import (  # noqa: F401 (fixtures)
    AgentSurface,
    agent_surface,
    claude_fake,
    gpt_fake,
)
from tests.billing_support import set_budget, set_price
from tests.support import create_key, usage_records
from tests.surfaces import SURFACES, Surface, local_surface, reserved, wait_until
from tests.test_translation_gateway import (  # noqa: F401 (fixtures)
    gemini_fake,
    translating_routes,
    venice_fake,
)

pytestmark = pytest.mark.slow_once  # servers of their own, in-process state

CAP = 20
# The whole reply a server that ignores the cap sends: 200 chunks (about 1 800 tokens).
LONG = {"x-fake-chunks": "200", "x-fake-chunk-delay-ms": "2"}
CHUNK_TOKENS = estimate_text(fake_reply_chunk(199))  # the most one relayed chunk adds
OVERSPENDING = Fault(ignore_output_cap=True, omit_usage=True)
CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}]}


def over_cap(gateway: Gateway, provider: str) -> float:
    return gateway.telemetry.registry.get_sample_value(
        "llm_gateway_output_over_cap_total", {"provider": provider}) or 0.0


def sent(on: Surface, body: dict[str, Any], key: str | None = None,
         ) -> tuple[list[dict[str, Any]], bool]:
    """A chat stream's chunks as the client got them, and whether it ended with [DONE]."""
    answer = on.send("/chat/completions", json.dumps(body).encode(),
                     {"authorization": f"Bearer {key or on.key()}", **LONG})
    assert answer.status == 200, answer.body[:300]
    frames = [frame.removeprefix(b"data: ") for frame in answer.body.strip().split(b"\n\n")]
    return [json.loads(frame) for frame in frames if frame != b"[DONE]"], frames[-1] == b"[DONE]"


def relayed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks
                   if chunk["choices"])


@pytest.mark.parametrize("name", SURFACES)
def test_a_stream_past_its_cap_is_ended_there_the_protocol_s_way(
        name: str, tmp_path: Path, fake: FakeUpstream, fake_url: str) -> None:
    with local_surface(name, tmp_path, fake_url) as on:
        finished = RecordedUsage()
        on.gateway.add_record_sink(finished)
        fake.push_fault(OVERSPENDING)
        chunks, done = sent(on, {**CHAT, "stream": True, "max_tokens": CAP,
                                 "stream_options": {"include_usage": True}})
        [record] = finished.wait_for(1)
        assert over_cap(on.gateway, "venice") == 1
    text = relayed_text(chunks)
    finishes = [chunk["choices"][0]["finish_reason"] for chunk in chunks
                if chunk["choices"] and chunk["choices"][0].get("finish_reason")]
    assert done and finishes == ["length"]
    assert chunks[-1]["choices"] == []  # the usage chunk it asked for: what was counted
    usage = chunks[-1]["usage"]
    # Ended just past the cap and its tolerance, not 200 chunks later.
    assert CAP < estimate_text(text) <= stream_output_ceiling(CAP) + CHUNK_TOKENS
    assert usage["completion_tokens"] == record.completion_tokens >= estimate_text(text)
    assert (record.status, record.error_code) == (200, "output_over_cap")
    assert record.tokens_estimated and record.finish_reasons == ["length"]
    wait_until(lambda: fake.requests[0].client_hung_up, what="the upstream was not closed")


def test_a_stream_its_upstream_capped_is_not_touched(
        tmp_path: Path, fake: FakeUpstream, fake_url: str) -> None:
    with local_surface("serve", tmp_path, fake_url) as on:
        finished = RecordedUsage()
        on.gateway.add_record_sink(finished)
        chunks, done = sent(on, {**CHAT, "stream": True, "max_tokens": CAP})
        [record] = finished.wait_for(1)
        assert over_cap(on.gateway, "venice") == 0
    assert done and relayed_text(chunks) == fake_reply_text(CAP // 8)
    assert record.error_code is None and not record.tokens_estimated


def test_streams_in_flight_are_charged_what_they_relayed_within_the_budget(
        tmp_path: Path, fake: FakeUpstream, fake_url: str) -> None:
    """Four streams at once, each reserved for 50 tokens, from an upstream that would send
    1 800 each: a $1 budget (1 000 output tokens) is not overspent, and the ledger books
    exactly what the records say was relayed."""
    cap, streams = 50, 4
    with local_surface("serve", tmp_path, fake_url) as on:
        finished = RecordedUsage()
        on.gateway.add_record_sink(finished)
        key_record, key = create_key(on.database_url, rate_limit_requests=1000)
        set_budget(on.database_url, BudgetScope.KEY, key_record.id, daily_usd=Decimal("1"))
        set_price(on.database_url, "venice", "llama-3.3-70b", "0", "1000")  # $0.001 a token
        on.gateway.refresh_from_thread()
        fake.push_fault(Fault(ignore_output_cap=True, omit_usage=True, times=streams))
        body = {**CHAT, "stream": True, "max_tokens": cap}
        with ThreadPoolExecutor(streams) as pool:
            answers = list(pool.map(lambda _: sent(on, body, key), range(streams)))
        records = finished.wait_for(streams)
        wait_until(lambda: reserved(on.gateway) == 0, what="reservations left held")
        ledger = on.gateway.quotas.ledger
        spent = sum(ledger.counter(name)[0] for name in list(ledger._counters)  # type: ignore[attr-defined]
                    if name.startswith("usd:"))
        on.gateway.flush_from_thread()
        rows = usage_records(on.database_url)
    assert len(fake.requests) == streams  # all of them were in flight together
    for (chunks, done), record in zip(answers, records, strict=True):
        assert done and record.error_code == "output_over_cap"
        assert record.completion_tokens >= estimate_text(relayed_text(chunks))
    assert sum(r.completion_tokens for r in records) <= streams * (
        stream_output_ceiling(cap) + CHUNK_TOKENS)
    cost = sum((row.cost_usd or Decimal(0)) for row in rows)
    assert Decimal(0) < cost <= Decimal("1")
    assert spent == usd_units(cost)  # charged what was relayed, never less


def test_a_json_answer_far_above_its_cap_is_flagged_and_counted(
        tmp_path: Path, fake: FakeUpstream, fake_url: str) -> None:
    with local_surface("serve", tmp_path, fake_url) as on:
        finished = RecordedUsage()
        on.gateway.add_record_sink(finished)
        key = on.key()

        def ask(chunks: int, fault: Fault | None) -> dict[str, Any]:
            if fault is not None:
                fake.push_fault(fault)
            answer = on.send("/chat/completions", json.dumps({**CHAT, "max_tokens": 10}).encode(),
                             {"authorization": f"Bearer {key}", "x-fake-chunks": str(chunks)})
            assert answer.status == 200, answer.body[:300]
            return json.loads(answer.body)  # type: ignore[no-any-return]

        whole = ask(50, OVERSPENDING)  # 50 chunks (about 450 tokens) for a cap of 10
        within = ask(3, OVERSPENDING)  # about 27: over the cap, not far over it
        honest = ask(50, None)  # the upstream kept to the cap itself
        records = finished.wait_for(3)
        counted = over_cap(on.gateway, "venice")
    assert whole["choices"][0]["message"]["content"] == fake_reply_text(50)  # relayed whole
    flagged, near, kept = records
    assert flagged.error_code == "output_over_cap" and flagged.tokens_estimated
    assert flagged.completion_tokens == estimate_text(fake_reply_text(50))
    assert "usage" not in within and near.error_code is None
    assert honest["usage"]["completion_tokens"] <= 10 and kept.error_code is None
    assert counted == 1


def test_the_slack_is_a_quarter_and_32_tokens_and_far_is_twice_and_64() -> None:
    assert [stream_output_ceiling(cap) for cap in (1, 20, 100, 4096)] == [33, 57, 157, 5152]
    assert not far_over_cap(10, 84) and far_over_cap(10, 85)


# ---- each protocol's end, native and translated ------------------------------------------


@pytest.fixture
def agents(tmp_path: Path, claude_fake: tuple[FakeUpstream, str],  # noqa: F811
           gpt_fake: tuple[FakeUpstream, str],  # noqa: F811
           venice_fake: tuple[FakeUpstream, str],  # noqa: F811
           gemini_fake: tuple[FakeUpstream, str],  # noqa: F811
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AgentSurface, dict[str, Any]]]:
    venice_fake[0].reset()
    gemini_fake[0].reset()
    routes = translating_routes(claude_fake[1], gpt_fake[1], venice_fake[1], gemini_fake[1])
    with agent_surface("serve", tmp_path, claude_fake, gpt_fake, monkeypatch,
                       routes=routes) as on:
        yield on, {"claude": claude_fake[0], "gpt": gpt_fake[0], "open": venice_fake[0],
                   "gemini": gemini_fake[0]}


def _record(on: AgentSurface) -> UsageRecord:
    [record] = on.finished.wait_for(1)
    assert (record.status, record.error_code) == (200, "output_over_cap")
    assert record.tokens_estimated
    return record


@pytest.mark.parametrize("alias", ["open", "claude", "gemini"])
def test_a_chat_caller_gets_finish_reason_length(
        alias: str, agents: tuple[AgentSurface, dict[str, Any]]) -> None:
    on, fakes = agents
    fakes[alias].push_fault(Fault(ignore_output_cap=True))
    chunks = list(on.openai(on.key()).chat.completions.create(
        model=alias, max_tokens=CAP, stream=True, extra_headers=LONG,
        messages=[{"role": "user", "content": "Hi"}], stream_options={"include_usage": True}))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert finishes == ["length"] and chunks[-1].usage is not None
    assert estimate_text(text) <= stream_output_ceiling(CAP) + CHUNK_TOKENS
    assert chunks[-1].usage.completion_tokens == _record(on).completion_tokens


@pytest.mark.parametrize("alias", ["claude", "open"])
def test_a_messages_caller_gets_stop_reason_max_tokens(
        alias: str, agents: tuple[AgentSurface, dict[str, Any]]) -> None:
    on, fakes = agents
    fakes[alias].push_fault(Fault(ignore_output_cap=True))
    with on.anthropic(on.key()).messages.stream(
            model=alias, max_tokens=CAP, extra_headers=LONG,
            messages=[{"role": "user", "content": "Hi"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    text = "".join(block.text for block in final.content if block.type == "text")
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.stop_reason == "max_tokens"
    assert estimate_text(text) <= stream_output_ceiling(CAP) + CHUNK_TOKENS
    assert final.usage.output_tokens == _record(on).completion_tokens


@pytest.mark.parametrize("alias", ["gpt", "open"])
def test_a_responses_caller_gets_an_incomplete_response(
        alias: str, agents: tuple[AgentSurface, dict[str, Any]]) -> None:
    on, fakes = agents
    fakes[alias].push_fault(Fault(ignore_output_cap=True))
    events = list(on.openai(on.key()).responses.create(
        model=alias, input="Hi", max_output_tokens=CAP, stream=True, extra_headers=LONG))
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert estimate_text(text) <= stream_output_ceiling(CAP) + CHUNK_TOKENS
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == _record(on).completion_tokens
