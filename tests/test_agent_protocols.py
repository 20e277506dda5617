"""Anthropic Messages and OpenAI Responses through every surface, with the official SDKs:
each answer as the provider gave it, one usage record each with its protocol, tokens
(cache and reasoning included) and cost as the provider reports them; gateway errors in
the caller's protocol, raising the SDK's own exceptions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import anthropic
import openai
import pytest

from llm_gateway.billing.model import BudgetScope
from llm_gateway.testing.fake_upstream import FakeUpstream
from tests.agent_support import (  # noqa: F401 (fixtures)
    CLAUDE,
    GPT,
    AgentSurface,
    agent_surface,
    claude_fake,
    gpt_fake,
)
from tests.billing_support import set_budget, set_price
from tests.support import usage_records
from tests.surfaces import SURFACES

pytestmark = pytest.mark.slow_once
HELLO = [{"role": "user", "content": "Hello there"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(params=SURFACES)
def on(request: pytest.FixtureRequest, tmp_path: Path,
       claude_fake: tuple[FakeUpstream, str],  # noqa: F811 (a fixture)
       gpt_fake: tuple[FakeUpstream, str],  # noqa: F811
       monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentSurface]:
    with agent_surface(request.param, tmp_path, claude_fake, gpt_fake, monkeypatch) as it:
        yield it


def test_a_message_is_answered_and_recorded(on: AgentSurface) -> None:
    key = on.key()
    message = on.anthropic(key).messages.create(model="claude", max_tokens=200,
                                                messages=HELLO)  # type: ignore[arg-type]
    assert message.content[0].text  # type: ignore[union-attr]
    assert message.model == CLAUDE
    [record] = on.finished.wait_for(1)
    assert (record.protocol, record.endpoint, record.status) == ("messages", "messages", 200)
    assert record.provider == "anthropic" and record.upstream_model == CLAUDE
    assert record.prompt_tokens == message.usage.input_tokens
    assert record.completion_tokens == message.usage.output_tokens
    [seen] = on.claude.requests
    assert seen.headers["x-api-key"] == "sk-fake-upstream"
    assert key not in str(seen.headers)


def test_a_message_stream_with_cache_tokens_is_metered_as_anthropic_reports_it(
    on: AgentSurface,
) -> None:
    key = on.key()
    client = on.anthropic(key)
    long_prompt = [{"role": "user", "content": "word " * 30}]
    with client.messages.stream(
            model="claude", max_tokens=200, messages=long_prompt,  # type: ignore[arg-type]
            extra_headers={"x-fake-cache-read-tokens": "3", "x-fake-cache-write-tokens": "2",
                           "x-fake-cache-write-1h-tokens": "1"}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text
    [record] = on.finished.wait_for(1)
    usage = final.usage
    assert record.error_code is None and record.stream
    assert record.cache_read_tokens == usage.cache_read_input_tokens == 3
    # 5-minute and 1-hour writes, together and the hour's apart.
    assert record.cache_write_tokens == usage.cache_creation_input_tokens == 3
    assert record.cache_write_1h_tokens == 1
    # Every input token: Anthropic's input_tokens leaves the cache's out.
    assert record.prompt_tokens == usage.input_tokens + 3 + 3
    assert record.completion_tokens == usage.output_tokens


def test_a_tool_call_and_its_result(on: AgentSurface) -> None:
    client = on.anthropic(on.key())
    first = client.messages.create(
        model="claude", max_tokens=300, messages=HELLO, tools=[WEATHER],  # type: ignore[list-item,arg-type]
        extra_headers={"x-fake-tool-call": "get_weather"})
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}  # type: ignore[union-attr]
    turns = [*HELLO, {"role": "assistant", "content": first.content},
             {"role": "user", "content": [result]}]
    second = client.messages.create(model="claude", max_tokens=300, tools=[WEATHER],  # type: ignore[list-item]
                                    messages=turns)  # type: ignore[arg-type]
    assert second.stop_reason == "end_turn"
    assert len(on.finished.wait_for(2)) == 2


def test_count_tokens_and_the_model_list(on: AgentSurface) -> None:
    client = on.anthropic(on.key())
    counted = client.messages.count_tokens(model="claude", messages=HELLO)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    listed = [model.id for model in client.models.list()]
    assert "claude" in listed


async def test_async_anthropic(on: AgentSurface) -> None:
    client = on.async_anthropic(await asyncio.to_thread(on.key))
    message = await client.messages.create(model="claude", max_tokens=100,
                                           messages=HELLO)  # type: ignore[arg-type]
    assert message.content[0].text  # type: ignore[union-attr]
    async with client.messages.stream(model="claude", max_tokens=100,
                                      messages=HELLO) as stream:  # type: ignore[arg-type]
        assert "".join([text async for text in stream.text_stream])


def test_gateway_errors_are_anthropic_shaped_and_raise_the_sdks_classes(
    on: AgentSurface,
) -> None:
    with pytest.raises(anthropic.AuthenticationError):
        on.anthropic("llmg_not_a_real_key").messages.create(
            model="claude", max_tokens=10, messages=HELLO)  # type: ignore[arg-type]
    limited = on.key(allowed_models=("gpt",))
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        on.anthropic(limited).messages.create(model="claude", max_tokens=10,
                                              messages=HELLO)  # type: ignore[arg-type]
    assert denied.value.body["type"] == "error"  # type: ignore[index]
    # A document block, which the gpt alias's chat target cannot read: refused before any
    # call (translation carries what both sides can say; this would change the meaning).
    document = [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "a contract"}},
        {"type": "text", "text": "Summarise it"}]}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        on.anthropic(on.key()).messages.create(model="gpt", max_tokens=10,
                                               messages=document)  # type: ignore[arg-type]
    assert "document" in str(refused.value)
    assert on.gpt.requests == []


def test_a_response_is_answered_and_recorded(on: AgentSurface) -> None:
    client = on.openai(on.key())
    response = client.responses.create(model="gpt", input="Hello there",
                                       reasoning={"effort": "low"})
    assert response.output_text
    [record] = on.finished.wait_for(1)
    assert (record.protocol, record.endpoint, record.status) == ("responses", "responses", 200)
    assert response.usage is not None
    assert record.prompt_tokens == response.usage.input_tokens
    assert record.completion_tokens == response.usage.output_tokens
    assert record.reasoning_tokens == response.usage.output_tokens_details.reasoning_tokens


def test_a_response_stream_ends_complete(on: AgentSurface) -> None:
    client = on.openai(on.key())
    with client.responses.stream(model="gpt", input="Hello there") as stream:
        text = "".join(event.delta for event in stream
                       if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text
    [record] = on.finished.wait_for(1)
    assert record.error_code is None and record.stream and record.finish_reasons == ["completed"]
    assert record.total_tokens == final.usage.total_tokens  # type: ignore[union-attr]


def test_responses_errors_raise_openais_classes(on: AgentSurface) -> None:
    with pytest.raises(openai.AuthenticationError):
        on.openai("llmg_not_a_real_key").responses.create(model="gpt", input="hi")
    # Embeddings of an alias whose only target speaks Messages: no translation makes them.
    with pytest.raises(openai.BadRequestError) as refused:
        on.openai(on.key()).embeddings.create(model="claude", input="hi")
    assert refused.value.code == "unsupported_protocol"


# ---- budgets ---------------------------------------------------------------------------


def test_claude_codes_128000_max_tokens_is_clamped_to_the_budget_and_settled(
    on: AgentSurface,
) -> None:
    """Claude Code asks for 128 000 output tokens every turn: a key with $1 left is served
    what $1 pays for, not refused for a reservation of 128 000."""
    record, key = on.key_record()
    set_budget(on.surface.database_url, BudgetScope.KEY, record.id, daily_usd=Decimal("1"))
    set_price(on.surface.database_url, "anthropic", CLAUDE, "1000", "1000")  # $0.001 a token
    on.surface.gateway.refresh_from_thread()
    with on.anthropic(key).messages.stream(
            model="claude", max_tokens=128_000, messages=HELLO) as stream:  # type: ignore[arg-type]
        assert "".join(stream.text_stream)
        clamped = stream.response.headers["x-llm-gateway-max-tokens-clamped"]
    sent_cap = json.loads(on.claude.requests[0].body)["max_tokens"]
    prompt = on.finished.wait_for(1)[0].prompt_tokens
    assert sent_cap < 1000 and clamped == str(sent_cap)
    on.surface.gateway.flush_from_thread()
    [row] = usage_records(on.surface.database_url)
    assert row.cost_usd == Decimal(prompt + row.completion_tokens) / 1000


def test_a_spent_budget_is_final_for_both_sdks(on: AgentSurface) -> None:
    record, key = on.key_record()
    set_budget(on.surface.database_url, BudgetScope.KEY, record.id,
               daily_usd=Decimal("0.0000000001"))
    set_price(on.surface.database_url, "anthropic", CLAUDE, "1000", "1000")
    set_price(on.surface.database_url, "openai", GPT, "1000", "1000")
    on.surface.gateway.refresh_from_thread()
    with pytest.raises(anthropic.RateLimitError) as spent:
        on.anthropic(key, max_retries=3).messages.create(
            model="claude", max_tokens=100, messages=HELLO)  # type: ignore[arg-type]
    assert spent.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.RateLimitError) as also_spent:
        on.openai(key, max_retries=3).responses.create(model="gpt", input="hi")
    assert also_spent.value.code == "insufficient_quota"
    assert on.sent == ["POST /v1/messages", f"POST {on.surface.api}/responses"
                       if not on.proxy else "POST /api/v1/responses"]  # never retried
    assert on.claude.requests == [] and on.gpt.requests == []


# ---- stored responses belong to their caller ---------------------------------------------


def test_a_stored_response_is_its_callers_alone(on: AgentSurface) -> None:
    owner, stranger = on.openai(on.key(name="owner")), on.openai(on.key(name="stranger"))
    created = owner.responses.create(model="gpt", input="Remember this")
    assert owner.responses.retrieve(created.id).id == created.id
    assert [item.type for item in owner.responses.input_items.list(created.id)]
    follow = owner.responses.create(model="gpt", input="And this?",
                                    previous_response_id=created.id)
    assert follow.output_text
    for attempt in (lambda: stranger.responses.retrieve(created.id),
                    lambda: stranger.responses.delete(created.id),
                    lambda: stranger.responses.cancel(created.id),
                    lambda: stranger.responses.input_items.list(created.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            attempt()
        assert missing.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError) as missing:
        stranger.responses.create(model="gpt", input="hi", previous_response_id=created.id)
    assert missing.value.code == "previous_response_not_found"
    seen = len(on.gpt.requests)
    owner.responses.delete(created.id)
    assert len(on.gpt.requests) == seen + 1  # the stranger's never reached the provider
    with pytest.raises(openai.NotFoundError):
        owner.responses.retrieve(created.id)  # deleted: the gateway forgot it too


def test_a_streamed_response_is_bound_as_it_starts(on: AgentSurface) -> None:
    owner = on.openai(on.key())
    with owner.responses.stream(model="gpt", input="Tell me") as stream:
        final = stream.get_final_response()
    assert owner.responses.retrieve(final.id).id == final.id
    with pytest.raises(openai.NotFoundError):
        on.openai(on.key(name="stranger")).responses.retrieve(final.id)


def test_store_false_keeps_nothing(on: AgentSurface) -> None:
    owner = on.openai(on.key())
    created = owner.responses.create(model="gpt", input="Forget this", store=False)
    with pytest.raises(openai.NotFoundError):
        owner.responses.retrieve(created.id)


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_stored_responses_are_kept_apart_on_shared_stores(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
    claude_fake: tuple[FakeUpstream, str],  # noqa: F811
    gpt_fake: tuple[FakeUpstream, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = ({"database_url": request.getfixturevalue("postgres_url")} if backend == "postgres"
              else {"redis_url": request.getfixturevalue("redis_url"),
                    "redis_namespace": f"owners-{tmp_path.name}"})
    with agent_surface("serve", tmp_path, claude_fake, gpt_fake, monkeypatch, **shared) as on:
        owner, stranger = on.openai(on.key(name="owner")), on.openai(on.key(name="stranger"))
        created = owner.responses.create(model="gpt", input="Remember this")
        assert owner.responses.retrieve(created.id).id == created.id
        with pytest.raises(openai.NotFoundError):
            stranger.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            stranger.responses.create(model="gpt", input="hi", previous_response_id=created.id)
