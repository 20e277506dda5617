"""The chat completions codec (llm_gateway/translate/chat.py), both roles: OpenAI's documented
examples read and written, a chat conversation through the form and back unchanged, what the
openai SDK reads of the codec's answers and streams, and recorded streams read as their JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from llm_gateway.testing.fake_content import ChatReply, fake_reply_chunk, usage_payload
from llm_gateway.translate import StreamTranslation
from llm_gateway.translate.chat import CODEC
from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Begin,
    Event,
    Failure,
    Finish,
    Image,
    OutputFormat,
    Reasoning,
    Refusal,
    RefusalDelta,
    Reply,
    Request,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    Tool,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallBegin,
    ToolChoice,
    ToolResult,
    Turn,
    Untranslatable,
    Usage,
)

# Pure translation, no store: the second pass (Postgres and Redis) adds nothing.
pytestmark = pytest.mark.slow_once

RECORDED = Path(__file__).parent / "recorded"

# ---- OpenAI's documented examples (API reference, "Create chat completion", Functions) ---------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
DOCUMENTED_REQUEST = {
    "model": "gpt-4.1",
    "messages": [{"role": "user", "content": "What is the weather like in Boston today?"}],
    "tools": [WEATHER_TOOL],
    "tool_choice": "auto",
}
DOCUMENTED_ANSWER = {
    "id": "chatcmpl-abc123",
    "object": "chat.completion",
    "created": 1699896916,
    "model": "gpt-4o-mini",
    "choices": [{
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [{
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "get_current_weather",
                             "arguments": "{\n\"location\": \"Boston, MA\"\n}"},
            }],
        },
        "logprobs": None,
        "finish_reason": "tool_calls",
    }],
    "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99,
              "completion_tokens_details": {"reasoning_tokens": 0,
                                            "accepted_prediction_tokens": 0,
                                            "rejected_prediction_tokens": 0}},
}


def _documented_stream() -> list[dict]:
    """The function-calling guide's streamed call: the id and name first, the arguments in
    fragments, then the finish reason, then (asked for) the usage."""
    head = {"id": "chatcmpl-abc123", "object": "chat.completion.chunk", "created": 1699896916,
            "model": "gpt-4o-mini"}
    fragments = ["{\"", "location", "\":\"", "Paris", ",", " France", "\"}"]
    chunks = [{**head, "choices": [{"index": 0, "delta": {
        "role": "assistant", "content": None, "tool_calls": [{
            "index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}]},
        "logprobs": None, "finish_reason": None}]}]
    chunks += [{**head, "choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 0, "function": {"arguments": fragment}}]}, "logprobs": None,
        "finish_reason": None}]} for fragment in fragments]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": "tool_calls"}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 60, "completion_tokens": 19,
                                                    "total_tokens": 79}})
    return chunks


def replay(events: list[Event]) -> Reply:
    """A stream's events gathered as the whole answer they stand for."""
    begin = events[0]
    assert isinstance(begin, Begin)
    assert sum(isinstance(event, Begin) for event in events) == 1
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert all(not isinstance(event, Finish | Failure) for event in events[:-1])
    parts: list = []
    calls: dict[int, ToolCall] = {}
    for event in events[1:-1]:
        last = parts[-1] if parts else None
        if isinstance(event, TextDelta):
            if isinstance(last, Text):
                last.text += event.text
            else:
                parts.append(Text(event.text))
        elif isinstance(event, ThinkingDelta):
            if isinstance(last, Thinking):
                last.text += event.text
            else:
                parts.append(Thinking(event.text))
        elif isinstance(event, RefusalDelta):
            parts.append(Refusal(event.text))
        elif isinstance(event, ToolCallBegin):
            assert event.index == len(calls)
            calls[event.index] = ToolCall(event.id, event.name, "", event.kind)
            parts.append(calls[event.index])
        elif isinstance(event, ToolArgumentsDelta):
            calls[event.index].arguments += event.fragment
    return Reply(begin.id, begin.model, parts, finish.stop, finish.stop_sequence, finish.usage,
                 begin.created)


def read_stream(chunks: list[dict]) -> list[Event]:
    reader = CODEC.stream_reader()
    events = [event for chunk in chunks for event in reader.feed(chunk)]
    return events + reader.end()


def sse_payloads(raw: bytes) -> list[dict]:
    frames = [frame for frame in raw.decode().split("\n\n") if frame]
    assert frames[-1] == "data: [DONE]"
    return [json.loads(frame.removeprefix("data: ")) for frame in frames[:-1]]


# ---- golden: the documented examples ------------------------------------------------------------


def test_documented_request_reads_into_the_form_and_writes_back_the_same() -> None:
    request = CODEC.read_request(copy.deepcopy(DOCUMENTED_REQUEST))
    assert request.model == "gpt-4.1"
    assert request.turns == [Turn("user", [Text("What is the weather like in Boston today?")])]
    assert request.tools == [Tool("get_current_weather",
                                  "Get the current weather in a given location",
                                  WEATHER_TOOL["function"]["parameters"])]
    assert request.tool_choice == ToolChoice("auto")
    assert request.dropped == []
    assert CODEC.write_request(request, model="gpt-4.1") == DOCUMENTED_REQUEST


def test_documented_tool_call_answer_reads_and_writes_back() -> None:
    reply = CODEC.read_reply(copy.deepcopy(DOCUMENTED_ANSWER))
    assert reply.parts == [ToolCall("call_abc123", "get_current_weather",
                                    "{\n\"location\": \"Boston, MA\"\n}")]
    assert (reply.stop, reply.id, reply.created) == ("tool", "chatcmpl-abc123", 1699896916)
    assert reply.usage == Usage(82, 17)
    written = CODEC.write_reply(reply, Request(model="gpt-4o-mini"))
    ChatCompletion.model_validate(written)
    expected = copy.deepcopy(DOCUMENTED_ANSWER)
    expected["choices"][0]["message"]["refusal"] = None
    expected["usage"] = {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99,
                         "prompt_tokens_details": {"cached_tokens": 0},
                         "completion_tokens_details": {"reasoning_tokens": 0}}
    assert written == expected


def test_documented_streamed_call_reads_as_its_whole_answer() -> None:
    events = read_stream(_documented_stream())
    assert events[1] == ToolCallBegin(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather")
    whole = replay(events)
    assert whole.parts == [ToolCall("call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather",
                                    "{\"location\":\"Paris, France\"}")]
    assert (whole.stop, whole.usage) == ("tool", Usage(60, 19))
    # Written back for a chat caller that asked for usage: the same chunks, as the SDK reads.
    request = Request(model="gpt-4o-mini", stream=True, stream_usage=True)
    writer = CODEC.stream_writer(request)
    raw = b"".join(writer.write(event) for event in events)
    payloads = sse_payloads(raw)
    assert payloads[1]["choices"][0]["delta"]["tool_calls"] == [{
        "index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "type": "function",
        "function": {"name": "get_weather", "arguments": ""}}]
    assert replay(read_stream(payloads)) == whole


# ---- recorded streams and the fake upstream's, read as their JSON --------------------------------


@pytest.mark.parametrize(("name", "text", "usage"), [
    ("openai_stream_with_usage.sse", "Hi", Usage(8, 1)),
    ("venice_stream.sse", "Hi there", Usage(8, 2)),
])
def test_recorded_stream_reads_as_its_answer(name: str, text: str, usage: Usage) -> None:
    whole = replay(read_stream(sse_payloads((RECORDED / name).read_bytes())))
    assert (whole.parts, whole.stop, whole.usage) == ([Text(text)], "end", usage)


def test_recorded_answers_read() -> None:
    openai_answer = CODEC.read_reply(json.loads((RECORDED / "openai_chat_completion.json")
                                                .read_text()))
    assert (openai_answer.parts, openai_answer.stop) == ([Text("Hello!")], "end")
    venice = CODEC.read_reply(json.loads((RECORDED / "venice_chat_completion.json").read_text()))
    assert venice.parts == [Text("Hello! How can I help you today?")]
    assert venice.usage == Usage(12, 9)
    vllm = CODEC.read_reply(json.loads((RECORDED / "vllm_usage_input_output.json").read_text()))
    assert (vllm.stop, vllm.usage) == ("length", Usage(30, 7))


@pytest.mark.parametrize("chunk_count", [0, 1, 5])
def test_the_fake_upstreams_stream_reads_as_its_json(chunk_count: int) -> None:
    fake = ChatReply(model="llama-3.3-70b", chunk_count=chunk_count, created=1764463201)
    usage = usage_payload(12, 8 * chunk_count, with_cost=True, cached_tokens=4)
    chunks = [fake.chunk({"role": "assistant", "content": ""}, None)]
    chunks += [fake.chunk({"content": fake_reply_chunk(index)}, None)
               for index in range(chunk_count)]
    chunks += [fake.chunk({}, "stop"), fake.usage_chunk(usage)]
    assert replay(read_stream(chunks)) == CODEC.read_reply(fake.completion(usage))


# ---- the caller's side: what a chat body says ----------------------------------------------------


def test_a_full_chat_body_reads_into_the_form() -> None:
    request = CODEC.read_request({
        "model": "alias",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                    "detail": "high"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]},
            {"role": "assistant", "content": None, "reasoning_content": "Hmm.",
             "tool_calls": [
                 {"id": "c1", "type": "function",
                  "function": {"name": "look", "arguments": "{}"}},
                 {"id": "c2", "type": "custom", "custom": {"name": "patch", "input": "*** x"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "ok"}]},
            {"role": "system", "content": "Now answer."},
        ],
        "tools": [WEATHER_TOOL, {"type": "custom", "custom": {"name": "patch"}}],
        "tool_choice": {"type": "function", "function": {"name": "get_current_weather"}},
        "parallel_tool_calls": False,
        "max_completion_tokens": 300, "temperature": 0.2, "top_p": 0.9, "stop": "END",
        "stream": True, "stream_options": {"include_usage": True},
        "reasoning_effort": "low",
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "out", "schema": {"type": "object"},
                                            "strict": True}},
        "user": "u-1", "seed": 7, "presence_penalty": 0.5, "logprobs": True, "store": False,
        "metadata": {"a": "b"}, "service_tier": "auto", "n": 1,
    })
    assert request.system == [Text("Be brief."), Text("Use tools.")]
    assert request.turns == [
        Turn("user", [Text("Look"), Image(data="AAAA", media_type="image/png"),
                      Image(url="https://example.com/cat.jpg")]),
        Turn("assistant", [Thinking("Hmm."), ToolCall("c1", "look", "{}"),
                           ToolCall("c2", "patch", "*** x", kind="custom")]),
        Turn("tool", [ToolResult("c1", [Text("a cat")]),
                      ToolResult("c2", [Text("ok")], kind="custom")]),
        Turn("system", [Text("Now answer.")]),
    ]
    assert [tool.kind for tool in request.tools] == ["function", "custom"]
    assert request.tool_choice == ToolChoice("tool", "get_current_weather")
    assert (request.parallel_tool_calls, request.max_output_tokens, request.temperature,
            request.top_p, request.stop) == (False, 300, 0.2, 0.9, ["END"])
    assert (request.stream, request.stream_usage, request.user) == (True, True, "u-1")
    assert request.reasoning == Reasoning(effort="low")
    assert request.output_format == OutputFormat("json_schema", {"type": "object"}, "out", True)
    assert request.dropped == ["image_url.detail", "seed", "presence_penalty", "logprobs",
                               "store", "metadata", "service_tier"]


@pytest.mark.parametrize(("body", "field"), [
    ({"n": 2}, "n"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}]},
     "input_audio"),
    ({"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": "f"}}]}]}, "file"),
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[].role"),
])
def test_what_would_change_the_conversation_is_refused(body: dict, field: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        CODEC.read_request({"model": "m", "messages": [], **body})
    assert refused.value.field == field


def test_reasoning_spellings_read() -> None:
    def reasoning(**fields: object) -> Reasoning | None:
        return CODEC.read_request({"model": "m", "messages": [], **fields}).reasoning

    assert reasoning(reasoning_effort="none") == Reasoning(enabled=False)
    assert reasoning(reasoning_effort="xhigh") == Reasoning(effort="high")
    assert reasoning(reasoning={"effort": "medium"}) == Reasoning(effort="medium")
    assert reasoning(reasoning={"max_tokens": 3000}) == Reasoning(budget_tokens=3000)
    assert reasoning() is None


def test_allowed_tools_narrow_the_tools() -> None:
    request = CODEC.read_request({
        "model": "m", "messages": [],
        "tools": [WEATHER_TOOL, {"type": "function", "function": {"name": "other"}}],
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "other"}}]}},
    })
    assert [tool.name for tool in request.tools] == ["other"]
    assert request.tool_choice == ToolChoice("required")


# ---- the target's side: what a chat target is sent ----------------------------------------------


def test_a_form_request_writes_a_standard_chat_body() -> None:
    request = Request(
        model="caller-name",
        system=[Text("You are Claude Code."), Text("Be careful.")],
        turns=[
            Turn("user", [Text("fix it"), Image(data="QUJD", media_type="image/jpeg")]),
            Turn("assistant", [Thinking("plan", signature="sig"), Text("On it."),
                               ToolCall("toolu_1", "Bash", "{\"cmd\":\"ls\"}"),
                               ToolCall("toolu_2", "apply_patch", "*** Begin", kind="custom")]),
            Turn("user", [ToolResult("toolu_1", [Text("a.py"), Image(url="https://x/y.png")]),
                          ToolResult("toolu_2", [Text("done")], kind="custom", is_error=True),
                          Text("and now?")]),
        ],
        tools=[Tool("Bash", "Run", {"type": "object"}),
               Tool("apply_patch", "Patch files", kind="custom")],
        tool_choice=ToolChoice("tool", "Bash"), parallel_tool_calls=True,
        max_output_tokens=32000, temperature=1.0, stop=["\n\nHuman:"], stream=True,
        reasoning=Reasoning(budget_tokens=4096), output_format=OutputFormat("json_object"),
        user="user-7", dropped=["cache_control"],
    )
    body = CODEC.write_request(request, model="qwen3")
    assert body == {
        "model": "qwen3",
        "messages": [
            {"role": "system", "content": "You are Claude Code."},
            {"role": "system", "content": "Be careful."},
            {"role": "user", "content": [
                {"type": "text", "text": "fix it"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}}]},
            {"role": "assistant", "content": "On it.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "Bash", "arguments": "{\"cmd\":\"ls\"}"}},
                {"id": "toolu_2", "type": "function",
                 "function": {"name": "apply_patch",
                              "arguments": json.dumps({CUSTOM_INPUT: "*** Begin"})}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "done"},
            {"role": "user", "content": [
                {"type": "text", "text": "Images from tool call toolu_1:"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
            {"role": "user", "content": "and now?"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "Bash", "description": "Run",
                                              "parameters": {"type": "object"}}},
            {"type": "function", "function": {
                "name": "apply_patch", "description": "Patch files",
                "parameters": {"type": "object", "properties": {CUSTOM_INPUT: {
                    "type": "string",
                    "description": "The tool's whole input, as free-form text."}},
                    "required": [CUSTOM_INPUT]}}},
        ],
        "tool_choice": {"type": "function", "function": {"name": "Bash"}},
        "parallel_tool_calls": True,
        "max_tokens": 32000, "stop": ["\n\nHuman:"], "temperature": 1.0,
        "stream": True, "stream_options": {"include_usage": True},
        "reasoning_effort": "high",
        "response_format": {"type": "json_object"},
        "user": "user-7",
    }
    assert request.dropped == ["cache_control", "thinking", "is_error"]
    assert CODEC.path("qwen3", True) == ("/chat/completions", "")


def test_the_writers_fields_are_what_openai_and_venice_take() -> None:
    from llm_gateway.providers.openai import OPENAI_CHAT_FIELDS
    from llm_gateway.providers.venice import VENICE_CHAT_FIELDS

    request = Request(model="m", turns=[Turn("user", [Text("hi")])],
                      tools=[Tool("t")], tool_choice=ToolChoice("required"),
                      parallel_tool_calls=False, max_output_tokens=5, temperature=0.5,
                      top_p=0.5, stop=["x"], stream=True, reasoning=Reasoning(effort="minimal"),
                      output_format=OutputFormat("json_schema", {"type": "object"}), user="u")
    body = CODEC.write_request(request, model="m")
    assert set(body) <= OPENAI_CHAT_FIELDS & VENICE_CHAT_FIELDS
    assert None not in body.values()
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "response",
                                                       "schema": {"type": "object"}}}


def test_reasoning_writes_as_an_effort_or_not_at_all() -> None:
    def effort(reasoning: Reasoning | None) -> str | None:
        return CODEC.write_request(Request(model="m", reasoning=reasoning),
                                   model="m").get("reasoning_effort")

    assert effort(Reasoning(budget_tokens=1024)) == "low"
    assert effort(Reasoning(budget_tokens=2048)) == "medium"
    assert effort(Reasoning(budget_tokens=10000)) == "high"
    assert effort(Reasoning(effort="low", budget_tokens=10000)) == "low"
    assert effort(Reasoning(enabled=False, budget_tokens=2048)) is None
    assert effort(Reasoning()) is None  # adaptive: the model's default
    assert effort(None) is None


def test_a_stored_conversation_and_unreadable_content_are_refused() -> None:
    with pytest.raises(Untranslatable) as refused:
        CODEC.write_request(Request(model="m", previous_response_id="resp_1"), model="m")
    assert refused.value.field == "previous_response_id"
    with pytest.raises(Untranslatable):
        CODEC.write_request(Request(model="m", turns=[
            Turn("assistant", [Image(url="https://x/y.png")])]), model="m")


def test_tool_choice_and_parallel_calls_go_only_with_tools() -> None:
    body = CODEC.write_request(Request(model="m", tool_choice=ToolChoice("none"),
                                       parallel_tool_calls=False), model="m")
    assert "tool_choice" not in body and "parallel_tool_calls" not in body


# ---- the target's answers read ------------------------------------------------------------------


def test_venice_and_deepseek_answers_read_reasoning_and_cache() -> None:
    reply = CODEC.read_reply({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "deepseek-r1",
        "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": None, "message": {
            "role": "assistant", "content": "42", "reasoning_content": "Think.",
            "tool_calls": []}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130,
                  "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36,
                  "completion_tokens_details": {"reasoning_tokens": 20}},
    })
    assert reply.parts == [Thinking("Think."), Text("42")]
    assert reply.usage == Usage(100, 30, cache_read_tokens=64, reasoning_tokens=20)
    venice = CODEC.read_reply({"id": "x", "model": "m", "choices": [{"message": {
        "role": "assistant", "content": "a", "reasoning": "b"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 1, "prompt_tokens_details": {
            "cached_tokens": 30, "cache_creation_input_tokens": 10}}})
    assert venice.parts == [Thinking("b"), Text("a")]
    assert venice.usage == Usage(50, 1, cache_read_tokens=30, cache_write_tokens=10)


@pytest.mark.parametrize(("finish", "extra", "stop"), [
    ("stop", {}, "end"), ("length", {}, "length"), ("tool_calls", {}, "tool"),
    ("content_filter", {}, "filter"), (None, {}, "end"),
    ("stop", {"stop_reason": "END"}, "stop_sequence"),
])
def test_finish_reasons_read(finish: str | None, extra: dict, stop: str) -> None:
    reply = CODEC.read_reply({"id": "x", "model": "m", "choices": [
        {"message": {"role": "assistant", "content": "a"}, "finish_reason": finish, **extra}]})
    assert reply.stop == stop


def test_a_call_said_to_stop_still_stops_for_the_tool() -> None:
    reply = CODEC.read_reply({"id": "x", "model": "m", "choices": [{"finish_reason": "stop",
        "message": {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]})
    assert reply.stop == "tool"
    assert reply.parts == [ToolCall("call_x_0", "f", "{}")]  # an id where the server sent none


def test_interleaved_tool_call_deltas_read_by_index() -> None:
    head = {"id": "c", "model": "m", "created": 1}

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def call(index: int, **fields: object) -> dict:
        return {"tool_calls": [{"index": index, **fields}]}

    events = read_stream([
        chunk({"role": "assistant", "reasoning_content": "Two calls."}),
        chunk(call(0, id="a", type="function", function={"name": "f", "arguments": "{\"x\""})),
        chunk(call(1, id="b", type="function", function={"name": "g", "arguments": ""})),
        chunk(call(1, function={"arguments": "{}"})),
        chunk(call(0, function={"arguments": ":1}"})),
        chunk({}, "tool_calls"),
        {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ])
    assert isinstance(events[-1], Finish) and events[-1].usage == Usage(3, 4)
    assert replay(events).parts == [Thinking("Two calls."), ToolCall("a", "f", "{\"x\":1}"),
                                    ToolCall("b", "g", "{}")]


def test_ollamas_parallel_calls_on_one_index_are_two_calls() -> None:
    events = read_stream([
        {"id": "o", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]},
        {"id": "o", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}}]},
        {"id": "o", "model": "m", "choices": [{"index": 0, "delta": {},
                                               "finish_reason": "tool_calls"}]},
    ])
    assert replay(events).parts == [ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}")]


@pytest.mark.parametrize(("error", "message", "type_"), [
    ("Inference failed", "Inference failed", "api_error"),  # Venice's
    ({"message": "overloaded", "type": "server_error", "code": None}, "overloaded",
     "server_error"),
])
def test_an_error_chunk_is_a_failure(error: object, message: str, type_: str) -> None:
    reader = CODEC.stream_reader()
    assert reader.feed({"id": "c", "model": "m", "choices": [
        {"index": 0, "delta": {"content": "a"}}]})[-1] == TextDelta("a")
    failure = reader.feed({"error": error})
    assert failure == [Failure(message, type_)]
    assert reader.feed({"choices": []}) == [] and reader.end() == []


# ---- the caller's answers written: what the openai SDK reads ------------------------------------


def _client(body: bytes, content_type: str) -> openai.OpenAI:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(api_key="k", base_url="http://gateway.test/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(answer)))


def _events_of(reply: Reply, split: int) -> list[Event]:
    """``reply`` as a target's stream would say it, each text cut into ``split``-long deltas
    and each call's arguments likewise."""
    def cuts(text: str) -> list[str]:
        return [text[i:i + split] for i in range(0, len(text), split)] or [""]

    events: list[Event] = [Begin(reply.id, reply.model, created=reply.created)]
    calls = 0
    for part in reply.parts:
        if isinstance(part, Text):
            events += [TextDelta(piece) for piece in cuts(part.text)]
        elif isinstance(part, Thinking):
            events += [ThinkingDelta(piece) for piece in cuts(part.text)]
        elif isinstance(part, Refusal):
            events.append(RefusalDelta(part.text))
        elif isinstance(part, ToolCall):
            events.append(ToolCallBegin(calls, part.id, part.name, part.kind))
            events += [ToolArgumentsDelta(calls, piece) for piece in cuts(part.arguments)
                       if piece]
            calls += 1
    events.append(Finish(reply.stop, reply.usage, reply.stop_sequence))
    return events


names = st.text("abcdefghij_", min_size=1, max_size=8)
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=30)
arguments = st.dictionaries(names, st.integers() | texts, max_size=3).map(json.dumps)
replies = st.builds(
    lambda text, thinking, calls, stop, usage: Reply(
        "chatcmpl-9", "target-model",
        [*([Thinking(thinking)] if thinking else []), *([Text(text)] if text else []),
         *[ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls)]],
        "tool" if calls else stop, None, usage, 1700000000),
    st.none() | texts, st.none() | texts, st.lists(st.tuples(names, arguments), max_size=3),
    st.sampled_from(["end", "length", "filter", "stop_sequence"]),
    st.builds(lambda i, o, c, r: Usage(i + c, o + r, c, 0, r),
              *[st.integers(0, 10_000)] * 4),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply=replies, split=st.integers(1, 7))
def test_the_sdk_reads_the_stream_as_the_json_answer(reply: Reply, split: int) -> None:
    request = Request(model="caller-alias", stream=True, stream_usage=True, now=1)
    whole = CODEC.write_reply(reply, request)
    parsed = ChatCompletion.model_validate(whole)
    writer = CODEC.stream_writer(request)
    frames = b"".join(writer.write(event) for event in _events_of(reply, split))
    client = _client(frames, "text/event-stream")
    with client.chat.completions.stream(model="caller-alias", messages=[]) as stream:
        for _ in stream:
            pass
        # The snapshot, not get_final_completion(), which raises for a length stop.
        final = stream.current_completion_snapshot
    got, want = final.choices[0], parsed.choices[0]
    # The first chunk's content "" (as OpenAI's own) leaves "" where the JSON says null.
    assert (got.message.content or None) == want.message.content
    assert got.finish_reason == want.finish_reason
    assert [(c.id, c.function.name, c.function.arguments) for c in got.message.tool_calls or []] \
        == [(c.id, c.function.name, c.function.arguments)
            for c in want.message.tool_calls or []]
    assert final.usage == parsed.usage
    assert (final.id, final.model, final.created) == (parsed.id, "caller-alias", 1700000000)
    chunks = [chunk for chunk in _client(frames, "text/event-stream").chat.completions.create(
        model="caller-alias", messages=[], stream=True)]
    streamed_reasoning = "".join((chunk.choices[0].delta.model_extra or {}).get(
        "reasoning_content", "") for chunk in chunks if chunk.choices)
    assert streamed_reasoning == (want.message.model_extra or {}).get("reasoning_content", "")


def test_the_json_answer_parses_and_says_everything() -> None:
    reply = Reply("msg_01", "claude-x", [Thinking("why", signature="s"), Text("Hi"),
                                         Refusal("no"), ToolCall("toolu_1", "f", "{}")],
                  "tool", None, Usage(120, 40, cache_read_tokens=100, cache_write_tokens=20,
                                      reasoning_tokens=10))
    body = CODEC.write_reply(reply, Request(model="alias", now=1234))
    completion = ChatCompletion.model_validate(body)
    message = completion.choices[0].message
    assert (completion.id, completion.model, completion.created) == ("msg_01", "alias", 1234)
    assert (message.content, message.refusal) == ("Hi", "no")
    assert message.model_extra == {"reasoning_content": "why"}
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 160
    assert completion.usage.prompt_tokens_details.cached_tokens == 100
    assert completion.usage.completion_tokens_details.reasoning_tokens == 10


@pytest.mark.parametrize(("stop", "finish"), [
    ("end", "stop"), ("stop_sequence", "stop"), ("pause", "stop"), ("length", "length"),
    ("tool", "tool_calls"), ("filter", "content_filter"), ("refusal", "content_filter"),
])
def test_stop_reasons_write(stop: str, finish: str) -> None:
    body = CODEC.write_reply(Reply("r", "m", [Text("a")], stop), Request(model="m"))  # type: ignore[arg-type]
    assert body["choices"][0]["finish_reason"] == finish
    assert "usage" not in body


def test_a_custom_tools_call_comes_back_as_a_custom_call() -> None:
    request = CODEC.read_request({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                  "tools": [{"type": "custom", "custom": {"name": "patch"}}]})
    sent = CODEC.write_request(request, model="t")
    assert sent["tools"][0]["function"]["parameters"]["required"] == [CUSTOM_INPUT]
    # The target called the one-string function; the caller sees its custom call.
    wrapped = ToolCall("call_1", "patch", json.dumps({CUSTOM_INPUT: "*** Begin Patch"}))
    body = CODEC.write_reply(Reply("r", "t", [wrapped], "tool"), request)
    assert body["choices"][0]["message"]["tool_calls"] == [
        {"id": "call_1", "type": "custom",
         "custom": {"name": "patch", "input": "*** Begin Patch"}}]
    ChatCompletion.model_validate(body)
    # A target with custom tools of its own (Responses) gave it as custom already.
    native = ToolCall("call_1", "patch", "*** Begin Patch", kind="custom")
    assert CODEC.write_reply(Reply("r", "t", [native], "tool"), request) == body
    # And in a stream: announced as custom, its input given whole once the call is complete.
    events: list[Event] = [Begin("r", "t"), ToolCallBegin(0, "call_1", "patch"),
                           ToolArgumentsDelta(0, wrapped.arguments[:5]),
                           ToolArgumentsDelta(0, wrapped.arguments[5:]), Finish("tool")]
    writer = CODEC.stream_writer(request)
    calls = [call for payload in sse_payloads(b"".join(writer.write(event) for event in events))
        for choice in payload["choices"] for call in choice["delta"].get("tool_calls", [])]
    assert calls == [{"index": 0, "id": "call_1", "type": "custom",
                      "custom": {"name": "patch", "input": ""}},
                     {"index": 0, "custom": {"input": "*** Begin Patch"}}]


def test_the_stream_writes_each_event_as_its_chunk() -> None:
    request = Request(model="alias", stream=True, now=99)
    writer = CODEC.stream_writer(request)
    frames = [writer.write(event) for event in [
        Begin("msg_1", "claude", usage=Usage(10)), ThinkingDelta("t"),
        ThinkingDelta(signature="sig"), TextDelta("a"), RefusalDelta("r"),
        ToolCallBegin(3, "toolu_9", "f"), ToolArgumentsDelta(3, "{}"), Finish("tool")]]
    assert frames[2] == b""  # a signature is Anthropic's alone
    payloads = [json.loads(frame.removeprefix(b"data: ")) for frame in frames[:2] + frames[3:-1]]
    assert all((p["id"], p["object"], p["created"], p["model"])
               == ("msg_1", "chat.completion.chunk", 99, "alias") for p in payloads)
    assert [p["choices"][0]["delta"] for p in payloads] == [
        {"role": "assistant", "content": ""}, {"reasoning_content": "t"}, {"content": "a"},
        {"refusal": "r"},
        {"tool_calls": [{"index": 0, "id": "toolu_9", "type": "function",
                         "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}]
    # No usage chunk: the caller did not ask for one.
    end = sse_payloads(frames[-1])
    assert [p["choices"][0]["finish_reason"] for p in end] == ["tool_calls"]
    assert writer.write(TextDelta("late")) == b""


def test_a_failed_stream_ends_as_the_chat_protocol_ends_one() -> None:
    from llm_gateway.protocols.chat import CHAT

    writer = CODEC.stream_writer(Request(model="m"))
    writer.write(Begin("c", "m"))
    ended = writer.fail(502, "upstream_error", "upstream_stream_interrupted", "cut")
    assert ended == CHAT.stream_error("upstream_stream_interrupted", "cut")
    assert writer.write(TextDelta("x")) == b""
    in_band = CODEC.stream_writer(Request(model="m")).write(Failure("overloaded"))
    assert in_band == (b'data: {"error": {"message": "overloaded", "type": "api_error", '
                       b'"code": null}}\n\ndata: [DONE]\n\n')
    # The SDK raises on it rather than ending quietly.
    with pytest.raises(openai.APIError, match="overloaded"):
        list(_client(in_band, "text/event-stream").chat.completions.create(
            model="m", messages=[], stream=True))


def test_a_translated_stream_runs_through_stream_translation() -> None:
    request = Request(model="alias", stream=True, stream_usage=True)
    translation = StreamTranslation(CODEC.stream_reader(), CODEC.stream_writer(request))
    out = b"".join(translation.feed(chunk) for chunk in _documented_stream()) + translation.end()
    payloads = sse_payloads(out)
    assert payloads[-1]["usage"]["prompt_tokens"] == 60
    assert payloads[-2]["choices"][0]["finish_reason"] == "tool_calls"


# ---- a chat conversation through the form and back ----------------------------------------------

ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
images = (st.builds(lambda data: {"type": "image_url",
                                  "image_url": {"url": f"data:image/png;base64,{data}"}},
                    st.text("ABCDEFGHIJ0123456789+/", min_size=4, max_size=12))
          | st.builds(lambda path: {"type": "image_url",
                                    "image_url": {"url": f"https://example.com/{path}.png"}},
                      names))
user_contents = texts | st.lists(st.builds(lambda t: {"type": "text", "text": t}, texts)
                                 | images, min_size=2, max_size=4)


@st.composite
def conversations(draw: st.DrawFn) -> dict:
    messages: list[dict] = [{"role": "system", "content": text}
                            for text in draw(st.lists(texts, max_size=2))]
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(user_contents)})
        calls = [{"id": f"call_{draw(ids)}_{i}", "type": "function",
                  "function": {"name": draw(names), "arguments": draw(arguments)}}
                 for i in range(draw(st.integers(0, 3)))]
        assistant: dict = {"role": "assistant"}
        text = draw(st.none() | texts)
        if text is not None or not calls:
            assistant["content"] = text or "ok"
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": draw(texts)}
                     for call in calls]
        if draw(st.booleans()):
            messages.append({"role": "system", "content": draw(texts)})
    tools = [{"type": "function", "function": {"name": name, "description": draw(texts),
                                               "parameters": {"type": "object"}}}
             for name in draw(st.lists(names, max_size=3, unique=True))]
    body: dict = {"model": "m", "messages": messages}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = draw(st.sampled_from(
            ["auto", "none", "required",
             {"type": "function", "function": {"name": tools[0]["function"]["name"]}}]))
    return body


@settings(max_examples=80, deadline=None)
@given(body=conversations())
def test_a_chat_conversation_survives_the_form(body: dict) -> None:
    request = CODEC.read_request(copy.deepcopy(body))
    assert request.dropped == []
    assert CODEC.write_request(request, model="m") == body
