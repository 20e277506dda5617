"""One alias, any protocol: the official SDKs through ``serve`` and the regular sidecar to
targets that speak another protocol, translated both ways; each answer in the caller's
protocol, one usage record each keeping the provider's own figures and naming the target
that answered.

- the openai SDK (chat, streaming, tools) to an Anthropic target;
- the anthropic SDK (``messages.stream()``, tool use and tool result turns) to a Venice-like
  chat target with strict top-level fields (it refuses a field it does not document);
- openai ``responses`` (stream, function tools) to a chat target and to an Anthropic target;
- the openai SDK (chat, streaming, tools) and the anthropic SDK (``messages.stream()``, tool
  use) to a Gemini target;
- a Messages stream failing over from Anthropic (529) to the chat target;
- what cannot cross is refused before any call; what only tunes is dropped and named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from llm_gateway.testing.fake_content import TOOL_CALL_HEADER
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_upstream import FakeUpstream, fake_reply_text, running_fake_upstream
from tests.agent_support import (  # noqa: F401 (fixtures)
    CLAUDE,
    GPT,
    AgentSurface,
    agent_surface,
    claude_fake,
    gpt_fake,
)

pytestmark = pytest.mark.slow_once

OPEN_MODEL = "llama-3.3-70b"  # the Venice-like fake's model
GEMINI_MODEL = "gemini-2.5-flash"
REPLY = fake_reply_text(8)
HELLO = [{"role": "user", "content": "Hello there"}]
WEATHER_INPUT = {"type": "object", "properties": {"city": {"type": "string"}},
                 "required": ["city"]}
ANTHROPIC_WEATHER = {"name": "get_weather", "description": "The weather in a city",
                     "input_schema": WEATHER_INPUT}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather",
                                                 "description": "The weather in a city",
                                                 "parameters": WEATHER_INPUT}}
RESPONSES_WEATHER = {"type": "function", "name": "get_weather",
                     "description": "The weather in a city", "parameters": WEATHER_INPUT}
CALL_WEATHER = {TOOL_CALL_HEADER: "get_weather"}


@pytest.fixture(scope="module")
def venice_fake() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="venice")) as served:
        yield served


@pytest.fixture(scope="module")
def gemini_fake() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="gemini")) as served:
        yield served


def translating_routes(claude_url: str, gpt_url: str, venice_url: str,
                       gemini_url: str) -> dict[str, Any]:
    """``claude``: Anthropic only; ``open``: the Venice-like chat provider only; ``gemini``:
    Gemini only; ``resilient``: Anthropic first, the chat provider when it fails."""
    key = {"api_key_env": "AGENT_TEST_KEY"}
    return {
        "providers": {
            "anthropic": {"base_url": claude_url, "profile": "anthropic", **key},
            "openai": {"base_url": gpt_url, "profile": "openai", **key},
            "venice": {"base_url": venice_url, "profile": "venice", **key},
            "google": {"base_url": gemini_url, "profile": "gemini", **key},
        },
        "default_provider": "openai",
        "models": {
            "claude": {"targets": [{"provider": "anthropic", "model": CLAUDE}]},
            "gpt": {"targets": [{"provider": "openai", "model": GPT}]},
            "open": {"targets": [{"provider": "venice", "model": OPEN_MODEL}]},
            "gemini": {"targets": [{"provider": "google", "model": GEMINI_MODEL}]},
            "gemini-first": {"targets": [
                {"provider": "google", "model": GEMINI_MODEL, "priority": 0},
                {"provider": "venice", "model": OPEN_MODEL, "priority": 1}]},
            "resilient": {"targets": [{"provider": "anthropic", "model": CLAUDE, "priority": 0},
                                      {"provider": "venice", "model": OPEN_MODEL,
                                       "priority": 1}]},
        },
    }


@pytest.fixture(params=["serve", "sidecar-regular"])
def on(request: pytest.FixtureRequest, tmp_path: Path,
       claude_fake: tuple[FakeUpstream, str],  # noqa: F811 (a fixture)
       gpt_fake: tuple[FakeUpstream, str],  # noqa: F811
       venice_fake: tuple[FakeUpstream, str], gemini_fake: tuple[FakeUpstream, str],
       monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentSurface]:
    venice_fake[0].reset()
    gemini_fake[0].reset()
    routes = translating_routes(claude_fake[1], gpt_fake[1], venice_fake[1], gemini_fake[1])
    with agent_surface(request.param, tmp_path, claude_fake, gpt_fake, monkeypatch,
                       routes=routes) as it:
        it.venice = venice_fake[0]  # type: ignore[attr-defined]
        it.gemini = gemini_fake[0]  # type: ignore[attr-defined]
        yield it


def venice(on: AgentSurface) -> FakeUpstream:
    return on.venice  # type: ignore[attr-defined,no-any-return]


def gemini(on: AgentSurface) -> FakeUpstream:
    return on.gemini  # type: ignore[attr-defined,no-any-return]


def sent_body(fake: FakeUpstream, index: int = -1) -> dict[str, Any]:
    return json.loads(fake.requests[index].body)  # type: ignore[no-any-return]


# ---- a chat caller, an Anthropic target ---------------------------------------------------


def test_chat_to_anthropic_answer_and_record(on: AgentSurface) -> None:
    client = on.openai(on.key())
    completion = client.chat.completions.create(
        model="claude", max_tokens=200,
        messages=[{"role": "system", "content": "Be brief."}, *HELLO])  # type: ignore[list-item]
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    sent = sent_body(on.claude)
    assert sent["system"] == "Be brief." and sent["max_tokens"] == 200
    assert sent["messages"] == [{"role": "user", "content": "Hello there"}] or \
        sent["messages"][0]["role"] == "user"
    [record] = on.finished.wait_for(1)
    assert (record.protocol, record.provider, record.upstream_model) == ("chat", "anthropic",
                                                                       CLAUDE)
    assert completion.usage is not None
    assert record.prompt_tokens == completion.usage.prompt_tokens
    assert record.completion_tokens == completion.usage.completion_tokens
    assert record.error_code is None


def test_chat_stream_to_anthropic_with_usage(on: AgentSurface) -> None:
    client = on.openai(on.key())
    chunks = list(client.chat.completions.create(
        model="claude", max_tokens=200, messages=HELLO, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    [record] = on.finished.wait_for(1)
    assert record.stream and record.error_code is None and record.provider == "anthropic"
    assert record.completion_tokens == chunks[-1].usage.completion_tokens


def test_chat_tools_to_anthropic(on: AgentSurface) -> None:
    client = on.openai(on.key(), default_headers=CALL_WEATHER)
    first = client.chat.completions.create(
        model="claude", max_tokens=300, messages=[{"role": "user", "content": "Weather?"}],
        tools=[CHAT_WEATHER])  # type: ignore[list-item]
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    streamed = list(client.chat.completions.create(
        model="claude", max_tokens=300, messages=[{"role": "user", "content": "Weather?"}],
        tools=[CHAT_WEATHER], stream=True))  # type: ignore[list-item]
    arguments = "".join(tc.function.arguments or "" for c in streamed if c.choices
                        for tc in c.choices[0].delta.tool_calls or [] if tc.function)
    assert "city" in json.loads(arguments)
    second = client.chat.completions.create(
        model="claude", max_tokens=300, tools=[CHAT_WEATHER],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
                  {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}])
    assert second.choices[0].message.content == REPLY
    last = sent_body(on.claude)
    [result] = [block for block in last["messages"][-1]["content"]
                if block["type"] == "tool_result"]
    assert result["tool_use_id"] == call.id
    on.finished.wait_for(3)


# ---- a Messages caller, a Venice-like chat target ------------------------------------------


def test_messages_to_chat_answer_stream_and_record(on: AgentSurface) -> None:
    client = on.anthropic(on.key())
    message = client.messages.create(model="open", max_tokens=200, system="Be brief.",
                                     messages=HELLO)  # type: ignore[arg-type]
    assert message.content[0].text == REPLY  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    sent = sent_body(venice(on))
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["model"] == OPEN_MODEL
    with client.messages.stream(model="open", max_tokens=200,
                                messages=HELLO) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == REPLY and final.stop_reason == "end_turn"
    first, second = on.finished.wait_for(2)
    assert (first.protocol, first.provider, second.provider) == ("messages", "venice", "venice")
    assert first.prompt_tokens == message.usage.input_tokens
    assert second.completion_tokens == final.usage.output_tokens
    assert second.stream and second.error_code is None


def test_messages_tool_use_and_result_to_chat(on: AgentSurface) -> None:
    client = on.anthropic(on.key(), default_headers=CALL_WEATHER)
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    with client.messages.stream(model="open", max_tokens=300, tools=[ANTHROPIC_WEATHER],
                                messages=asked) as stream:  # type: ignore[arg-type]
        called = stream.get_final_message()
    assert called.stop_reason == "tool_use"
    [use] = [block for block in called.content if block.type == "tool_use"]
    assert use.name == "get_weather" and "city" in use.input  # type: ignore[operator]
    answered = client.messages.create(
        model="open", max_tokens=300, tools=[ANTHROPIC_WEATHER],  # type: ignore[list-item]
        messages=[*asked, {"role": "assistant", "content": called.content},  # type: ignore[list-item]
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": "Sunny"}]}])
    assert answered.content[0].text == REPLY  # type: ignore[union-attr]
    sent = sent_body(venice(on))
    assert sent["messages"][-1] == {"role": "tool", "tool_call_id": use.id, "content": "Sunny"}
    on.finished.wait_for(2)


def test_what_cannot_cross_is_refused_and_what_tunes_is_dropped(on: AgentSurface) -> None:
    key = on.key()
    raw = on.anthropic(key).messages.with_raw_response.create(
        model="open", max_tokens=200, messages=HELLO,  # type: ignore[arg-type]
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        extra_body={"context_management": {"edits": []}},
        extra_headers={"anthropic-beta": "context-management-2025-06-27"})
    assert raw.parse().content[0].text == REPLY  # type: ignore[union-attr]
    dropped = raw.headers["x-llm-gateway-dropped"]
    assert "cache_control" in dropped and "context_management" in dropped
    sent = venice(on).requests[-1]
    assert "anthropic-beta" not in sent.headers and "anthropic-version" not in sent.headers
    assert "context_management" not in sent_body(venice(on))
    on.finished.wait_for(1)


# ---- a Responses caller, a chat target and an Anthropic target -----------------------------


@pytest.mark.parametrize("alias", ["open", "claude"])
def test_responses_to_another_protocol(on: AgentSurface, alias: str) -> None:
    client = on.openai(on.key())
    response = client.responses.create(model=alias, input="Hello there",
                                       instructions="Be brief.", store=False)
    assert response.output_text == REPLY and response.status == "completed"
    with client.responses.stream(model=alias, input="Hello there", store=False) as stream:
        deltas = "".join(event.delta for event in stream
                         if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert deltas == REPLY == final.output_text
    first, second = on.finished.wait_for(2)
    provider = "venice" if alias == "open" else "anthropic"
    assert (first.protocol, first.provider, second.provider) == ("responses", provider,
                                                                 provider)
    assert response.usage is not None and final.usage is not None
    assert first.prompt_tokens == response.usage.input_tokens
    assert second.completion_tokens == final.usage.output_tokens


@pytest.mark.parametrize("alias", ["open", "claude"])
def test_responses_function_tools_to_another_protocol(on: AgentSurface, alias: str) -> None:
    client = on.openai(on.key(), default_headers=CALL_WEATHER)
    with client.responses.stream(model=alias, input="Weather in Paris?", store=False,
                                 tools=[RESPONSES_WEATHER]) as stream:  # type: ignore[list-item]
        called = stream.get_final_response()
    [call] = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    answered = client.responses.create(
        model=alias, store=False, tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert answered.output_text == REPLY
    on.finished.wait_for(2)


def test_a_stored_conversation_cannot_cross(on: AgentSurface) -> None:
    client = on.openai(on.key())
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="open", input="and then?",
                                previous_response_id="resp_abc")
    assert refused.value.code == "unsupported_parameter"
    assert venice(on).requests == []


# ---- failover across protocols --------------------------------------------------------------


def test_a_messages_stream_fails_over_from_anthropic_to_chat(on: AgentSurface) -> None:
    on.claude.push_fault(Fault(status=529, shape="anthropic", message="Overloaded", times=5))
    client = on.anthropic(on.key())
    with client.messages.stream(model="resilient", max_tokens=200,
                                messages=HELLO) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == REPLY and final.stop_reason == "end_turn"
    [record] = on.finished.wait_for(1)
    assert (record.provider, record.upstream_model, record.protocol) == ("venice", OPEN_MODEL,
                                                                         "messages")
    assert record.attempts >= 2 and record.error_code is None


def test_an_anthropic_overload_reaches_a_chat_caller_as_a_server_error(on: AgentSurface) -> None:
    on.claude.push_fault(Fault(status=529, shape="anthropic", message="Overloaded", times=5))
    with pytest.raises(openai.InternalServerError) as failed:
        on.openai(on.key()).chat.completions.create(model="claude", messages=HELLO)  # type: ignore[arg-type]
    assert failed.value.status_code == 503
    assert "Overloaded" in str(failed.value)


def test_a_chat_providers_error_reaches_a_messages_caller_in_anthropics_shape(
        on: AgentSurface) -> None:
    venice(on).push_fault(Fault(status=400, shape="venice", message="context too long",
                                times=5))
    with pytest.raises(anthropic.BadRequestError) as refused:
        on.anthropic(on.key()).messages.create(model="open", max_tokens=20,
                                               messages=HELLO)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "context too long" in str(refused.value)


# ---- a Gemini target --------------------------------------------------------------------------


def test_chat_to_gemini_answer_stream_and_tools(on: AgentSurface) -> None:
    client = on.openai(on.key())
    completion = client.chat.completions.create(
        model="gemini", max_tokens=200,
        messages=[{"role": "system", "content": "Be brief."}, *HELLO])  # type: ignore[list-item]
    assert completion.choices[0].message.content and completion.usage is not None
    seen = gemini(on).requests[-1]
    assert seen.path.endswith(f"/models/{GEMINI_MODEL}:generateContent")
    assert seen.headers["x-goog-api-key"] and "authorization" not in seen.headers
    assert json.loads(seen.body)["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    chunks = list(client.chat.completions.create(
        model="gemini", max_tokens=200, messages=HELLO, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and gemini(on).requests[-1].query == "alt=sse"
    tools = on.openai(on.key(), default_headers=CALL_WEATHER).chat.completions.create(
        model="gemini", max_tokens=300, tools=[CHAT_WEATHER],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Weather?"}])
    [call] = tools.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and tools.choices[0].finish_reason == "tool_calls"
    first, second, third = on.finished.wait_for(3)
    assert {r.provider for r in (first, second, third)} == {"google"}
    assert first.prompt_tokens == completion.usage.prompt_tokens
    assert second.stream and second.error_code is None
    assert second.completion_tokens == chunks[-1].usage.completion_tokens  # type: ignore[union-attr]


def test_messages_stream_and_tool_use_to_gemini(on: AgentSurface) -> None:
    client = on.anthropic(on.key(), default_headers=CALL_WEATHER)
    with client.messages.stream(model="gemini", max_tokens=300, tools=[ANTHROPIC_WEATHER],
                                messages=[{"role": "user", "content": "Weather?"}],  # type: ignore[list-item]
                                ) as stream:
        called = stream.get_final_message()
    assert called.stop_reason == "tool_use"
    [use] = [block for block in called.content if block.type == "tool_use"]
    answered = client.messages.create(
        model="gemini", max_tokens=300, tools=[ANTHROPIC_WEATHER],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": called.content},  # type: ignore[list-item]
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": "Sunny"}]}])
    assert answered.content[-1].text  # type: ignore[union-attr]
    parts = json.loads(gemini(on).requests[-1].body)["contents"][-1]["parts"]
    assert parts[0]["functionResponse"]["name"] == "get_weather"
    records = on.finished.wait_for(2)
    assert {(r.protocol, r.provider, r.error_code) for r in records} == {
        ("messages", "google", None)}


def test_embeddings_to_gemini(on: AgentSurface) -> None:
    client = on.openai(on.key())
    answer = client.embeddings.create(model="gemini", input=["first text", "second text"],
                                      dimensions=8)
    assert [item.index for item in answer.data] == [0, 1]
    assert all(len(item.embedding) == 8 for item in answer.data)
    assert answer.data[0].embedding != answer.data[1].embedding
    seen = gemini(on).requests[-1]
    assert seen.path.endswith(f"/models/{GEMINI_MODEL}:batchEmbedContents")
    assert json.loads(seen.body)["requests"][1] == {
        "model": f"models/{GEMINI_MODEL}", "content": {"parts": [{"text": "second text"}]},
        "outputDimensionality": 8}
    [record] = on.finished.wait_for(1)
    assert (record.protocol, record.provider, record.status, record.error_code) == (
        "embeddings", "google", 200, None)
    assert record.tokens_estimated and record.prompt_tokens == answer.usage.prompt_tokens


@pytest.mark.parametrize("status", [503, 429])
def test_a_gemini_outage_fails_over_to_a_chat_target(on: AgentSurface, status: int) -> None:
    """Gemini's UNAVAILABLE (503) and RESOURCE_EXHAUSTED (429) are HTTP statuses the relay's
    rules already know: the next target serves, in the caller's protocol."""
    gemini(on).push_fault(Fault(status=status, shape="gemini", times=5))
    client = on.anthropic(on.key())
    message = client.messages.create(model="gemini-first", max_tokens=200,
                                     messages=HELLO)  # type: ignore[arg-type]
    assert message.content[0].text == REPLY  # type: ignore[union-attr]
    [record] = on.finished.wait_for(1)
    assert (record.provider, record.status, record.error_code) == ("venice", 200, None)
    assert record.attempts == 2 and len(gemini(on).requests) == 1
