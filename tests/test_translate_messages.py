"""The Messages codec (llm_gateway/translate/messages.py), both roles: Anthropic's documented
examples read and written back, a round trip keeping messages, tools and tool calls, what a
Claude Code body keeps and drops, what a target body holds, and the streams: the one the
writer makes read by the anthropic SDK as it reads the whole answer, the fake upstream's
Anthropic stream read as its JSON message is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gateway import errors
from llm_gateway.protocols.messages import MESSAGES
from llm_gateway.testing.fake_anthropic_reply import AnthropicReply, plan_reply
from llm_gateway.testing.fake_anthropic_request import (
    MESSAGES_FIELDS,
    SAMPLING_FIELDS,
    CacheSplit,
)
from llm_gateway.translate import codec
from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Begin,
    Event,
    Failure,
    Finish,
    Image,
    OutputFormat,
    Part,
    Reasoning,
    Refusal,
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
from llm_gateway.translate.messages import DEFAULT_MAX_TOKENS

# Pure translation, no store: the second pass (Postgres and Redis) adds nothing.
pytestmark = pytest.mark.slow_once

CODEC = codec("messages")
RECORDED = Path(__file__).parent / "recorded"
TOP_LEVEL = MESSAGES_FIELDS | SAMPLING_FIELDS  # what the Messages API takes (2023-06-01)


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


def sse_events(raw: bytes | str) -> list[tuple[str, dict]]:
    """(event name, data) of every frame."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    events = []
    for frame in filter(None, text.split("\n\n")):
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        events.append((name[7:], json.loads(data[6:])))
    return events


def read_stream(payloads: list[dict]) -> list[Event]:
    reader = CODEC.stream_reader()
    events = [event for payload in payloads for event in reader.feed(payload)]
    return events + reader.end()


def fold(events: list[Event]) -> Reply:
    """A stream's events as the whole answer they say."""
    begin = events[0]
    assert isinstance(begin, Begin)
    reply = Reply(id=begin.id, model=begin.model)
    texts: dict[int, Text] = {}
    thoughts: dict[int, Thinking] = {}
    calls: dict[int, ToolCall] = {}
    for event in events[1:]:
        if isinstance(event, TextDelta):
            if event.index not in texts:
                texts[event.index] = Text("")
                reply.parts.append(texts[event.index])
            texts[event.index].text += event.text
        elif isinstance(event, ThinkingDelta):
            if event.index not in thoughts:
                thoughts[event.index] = Thinking("")
                reply.parts.append(thoughts[event.index])
            thoughts[event.index].text += event.text
            if event.signature:
                thoughts[event.index].signature = event.signature
        elif isinstance(event, ToolCallBegin):
            calls[event.index] = ToolCall(event.id, event.name, "", event.kind)
            reply.parts.append(calls[event.index])
        elif isinstance(event, ToolArgumentsDelta):
            calls[event.index].arguments += event.fragment
        elif isinstance(event, Finish):
            reply.stop, reply.usage, reply.stop_sequence = (event.stop, event.usage,
                                                            event.stop_sequence)
    for call in calls.values():
        call.arguments = orjson.dumps(orjson.loads(call.arguments or "{}")).decode()
    assert isinstance(events[-1], Finish)
    return reply


def sdk_message(frames: bytes) -> Message:
    """What the anthropic SDK's stream helper makes of ``frames`` (its accumulator, as a
    caller's code gets it from get_final_message)."""
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=frames,
                               headers={"content-type": "text/event-stream"})

    client = anthropic.Anthropic(api_key="unused", base_url="http://gateway.test",
                                 max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))
    with client.messages.stream(model="claude-alias", max_tokens=1024,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        return stream.get_final_message()


def written_stream(reply: Reply, request: Request, events: list[Event] | None = None) -> bytes:
    writer = CODEC.stream_writer(request)
    return b"".join(writer.write(event) for event in (events or stream_of(reply)))


def stream_of(reply: Reply) -> list[Event]:
    """The events a reader would say ``reply`` in, the usage at the end only (a chat
    target's way)."""
    events: list[Event] = [Begin(reply.id, reply.model)]
    calls = 0
    for index, part in enumerate(reply.parts):
        if isinstance(part, Text):
            events.append(TextDelta(part.text, index))
        elif isinstance(part, Thinking):
            events.append(ThinkingDelta(part.text, index=index))
            if part.signature:
                events.append(ThinkingDelta(signature=part.signature, index=index))
        elif isinstance(part, ToolCall):
            events.append(ToolCallBegin(calls, part.id, part.name))
            middle = len(part.arguments) // 2
            events += [ToolArgumentsDelta(calls, part.arguments[:middle]),
                       ToolArgumentsDelta(calls, part.arguments[middle:])]
            calls += 1
    events.append(Finish(reply.stop, reply.usage, reply.stop_sequence))
    return events


# ---- Anthropic's documented examples ---------------------------------------------------------


def test_the_documented_tool_use_request_reads_into_the_form() -> None:
    request = CODEC.read_request(recorded("anthropic_tool_use_request.json"))
    assert request.max_output_tokens == 1024 and request.dropped == []
    assert request.tools[0].name == "get_weather"
    assert request.tools[0].parameters["required"] == ["location"]  # type: ignore[index]
    assert [turn.role for turn in request.turns] == ["user", "assistant", "tool"]
    call = request.turns[1].parts[1]
    assert call == ToolCall("toolu_01A09q90qw90lq917835lq9", "get_weather",
                            '{"location":"San Francisco, CA","unit":"celsius"}')
    assert request.turns[2].parts == [ToolResult("toolu_01A09q90qw90lq917835lq9",
                                                 [Text("15 degrees")])]


def test_the_documented_tool_use_request_is_written_back_as_it_came() -> None:
    payload = recorded("anthropic_tool_use_request.json")
    written = CODEC.write_request(CODEC.read_request(payload), model=payload["model"])
    expected = {**payload, "messages": [
        {"role": "user", "content": [{"type": "text",
                                      "text": "What is the weather like in San Francisco?"}]},
        *payload["messages"][1:]]}
    assert written == expected


def test_the_documented_tool_use_answer_reads_and_writes_back() -> None:
    message = recorded("anthropic_tool_use_message.json")
    reply = CODEC.read_reply(message)
    assert reply.stop == "tool" and reply.usage == Usage(384, 67)
    assert reply.parts[1] == ToolCall("toolu_01A09q90qw90lq917835lq9", "get_weather",
                                      '{"location":"San Francisco, CA","unit":"celsius"}')
    request = Request(model="claude-opus-4-6")
    assert CODEC.write_reply(reply, request) == message
    Message.model_validate(CODEC.write_reply(reply, request))


@pytest.mark.parametrize("name", ["anthropic_stream_tool_use.sse",
                                  "anthropic_stream_thinking.sse"])
def test_a_documented_stream_reads_as_the_sdk_reads_it(name: str) -> None:
    raw = (RECORDED / name).read_bytes()
    payloads = [data for _, data in sse_events(raw)]
    reply = fold(read_stream(payloads))
    # The SDK's own accumulation of the same frames, read back by the reply reader.
    assert reply == CODEC.read_reply(sdk_message(raw).model_dump(exclude_none=True))


def test_the_documented_tool_stream_says_its_call_and_its_stop() -> None:
    payloads = [data for _, data in sse_events((RECORDED / "anthropic_stream_tool_use.sse")
                                               .read_text())]
    events = read_stream(payloads)
    assert events[0] == Begin("msg_014p7gG3wDgGV9EUtLvnow3U", "claude-opus-4-6",
                              usage=Usage(472, 0))
    assert ToolCallBegin(0, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather") in events
    assert all(event.fragment for event in events if isinstance(event, ToolArgumentsDelta))
    assert events[-1] == Finish("tool", Usage(472, 89))
    reply = fold(events)
    assert reply.parts[0] == Text("Okay, let's check the weather for San Francisco, CA:")
    assert json.loads(reply.parts[1].arguments) == {  # type: ignore[union-attr]
        "location": "San Francisco, CA", "unit": "fahrenheit"}


def test_the_documented_thinking_stream_keeps_the_signature() -> None:
    payloads = [data for _, data in sse_events((RECORDED / "anthropic_stream_thinking.sse")
                                               .read_text())]
    reply = fold(read_stream(payloads))
    thinking = reply.parts[0]
    assert isinstance(thinking, Thinking) and thinking.text.startswith("I need to find the GCD")
    assert thinking.signature == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    assert reply.parts[1] == Text("The greatest common divisor of 1071 and 462 is **21**.")
    # Written to an Anthropic caller again, the SDK reads the same blocks.
    message = sdk_message(written_stream(reply, Request(model="claude-sonnet-4-5")))
    assert message.content[0].type == "thinking"
    assert message.content[0].signature == thinking.signature


def test_a_thinking_request_maps_its_budget() -> None:
    payload = {"model": "claude-sonnet-4-5", "max_tokens": 16000,
               "thinking": {"type": "enabled", "budget_tokens": 10000},
               "messages": [{"role": "user", "content": "Are there an infinite number of "
                                                        "prime numbers such that n mod 4 == 3?"}]}
    request = CODEC.read_request(payload)
    assert request.reasoning == Reasoning(budget_tokens=10000)
    assert CODEC.write_request(request, model="claude-sonnet-4-5")["thinking"] == \
        payload["thinking"]


# ---- the caller's side: what a Claude Code body keeps and drops ----------------------------


CLAUDE_CODE = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Work in /repo."}],
    "messages": [
        {"role": "system", "content": "The user switched to plan mode."},
        {"role": "user", "content": [
            {"type": "text", "text": "Read the file", "cache_control": {"type": "ephemeral"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgoAAAANSUhEUg=="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Read it.", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "toolu_1", "name": "Read",
             "input": {"file_path": "/repo/a.py"}},
            {"type": "tool_use", "id": "toolu_2", "name": "Read",
             "input": {"file_path": "/repo/b.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no such file"}]},
            {"type": "text", "text": "Go on."}]},
    ],
    "tools": [
        {"name": "Read", "description": "Read a file",
         "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                          "required": ["file_path"]}},
        {"type": "custom", "name": "Bash", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "xhigh"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
    "metadata": {"user_id": "user_abc_account_123_session_9"},
    "temperature": 1,
    "top_k": 5,
}


def test_a_claude_code_body_reads_into_the_form() -> None:
    request = CODEC.read_request(CLAUDE_CODE)
    assert request.system == [Text("You are Claude Code."), Text("Work in /repo.")]
    assert [turn.role for turn in request.turns] == ["system", "user", "assistant", "tool",
                                                     "user"]
    assert request.turns[1].parts[1:] == [
        Image(data="iVBORw0KGgoAAAANSUhEUg==", media_type="image/png"),
        Image(url="https://example.com/a.png")]
    assert request.turns[2].parts[:2] == [Thinking("Read it.", signature="sig-1"),
                                          Thinking("", signature="opaque", redacted=True)]
    assert request.turns[3].parts == [
        ToolResult("toolu_1", [Text("print(1)")]),
        ToolResult("toolu_2", [Text("no such file")], is_error=True)]
    assert [tool.name for tool in request.tools] == ["Read", "Bash"]
    assert request.tool_choice == ToolChoice("auto") and request.parallel_tool_calls is False
    assert request.reasoning == Reasoning(effort="high")
    assert (request.max_output_tokens, request.temperature, request.stream, request.user) == (
        32000, 1.0, True, "user_abc_account_123_session_9")
    assert request.dropped == ["cache_control", "tools[web_search_20250305]",
                               "tools[text_editor_20250728]", "top_k", "context_management"]


@pytest.mark.parametrize(("block", "field"), [
    ({"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                     "data": "x"}}, "messages[0].content[1]"),
    ({"type": "search_result", "source": "s", "title": "t", "content": []},
     "messages[0].content[1]"),
    ({"type": "container_upload", "file_id": "file_1"}, "messages[0].content[1]"),
    ({"type": "image", "source": {"type": "file", "file_id": "file_1"}},
     "messages[0].content[1]"),
    ({"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]},
     "messages[0].content[1].content[0]"),
])
def test_content_no_other_protocol_reads_is_refused(block: dict, field: str) -> None:
    payload = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "see"}, block]}]}
    with pytest.raises(Untranslatable) as refused:
        CODEC.read_request(payload)
    assert refused.value.field == field


def test_thinking_settings_read() -> None:
    def reasoning(**fields: Any) -> Reasoning | None:
        return CODEC.read_request({"model": "m", "max_tokens": 10, "messages": [],
                                   **fields}).reasoning

    assert reasoning() is None
    assert reasoning(thinking={"type": "disabled"}) == Reasoning(enabled=False)
    assert reasoning(thinking={"type": "adaptive"}) == Reasoning()
    assert reasoning(thinking={"type": "enabled", "budget_tokens": 2048},
                     output_config={"effort": "low"}) == Reasoning("low", 2048)
    assert reasoning(output_config={"effort": "max"}) == Reasoning("high")


def test_structured_output_reads_from_output_config_and_the_beta_field() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    for fields in ({"output_config": {"format": {"type": "json_schema", "schema": schema}}},
                   {"output_format": {"type": "json_schema", "schema": schema}}):
        request = CODEC.read_request({"model": "m", "max_tokens": 10, "messages": [], **fields})
        assert request.output_format == OutputFormat("json_schema", schema)


def test_tool_choice_reads() -> None:
    def choice(value: dict) -> ToolChoice | None:
        return CODEC.read_request({"model": "m", "max_tokens": 1, "messages": [],
                                   "tool_choice": value}).tool_choice

    assert choice({"type": "any"}) == ToolChoice("required")
    assert choice({"type": "tool", "name": "Read"}) == ToolChoice("tool", "Read")
    assert choice({"type": "none"}) == ToolChoice("none")


# ---- the caller's side: the answer ----------------------------------------------------------


def a_reply(**fields: Any) -> Reply:
    base: dict[str, Any] = {
        "id": "chatcmpl-42", "model": "llama-3.3-70b",
        "parts": [Thinking("Let me see."), Text("Two calls."),
                  ToolCall("call_a", "Read", '{"file_path": "/a"}'),
                  ToolCall("call_b", "Read", '{"file_path": "/b"}')],
        "stop": "tool", "usage": Usage(input_tokens=120, output_tokens=40,
                                       cache_read_tokens=100, cache_write_tokens=5,
                                       reasoning_tokens=12)}
    return Reply(**{**base, **fields})


def test_the_answer_is_a_message_the_sdk_parses() -> None:
    message = CODEC.write_reply(a_reply(), Request(model="claude-alias"))
    parsed = Message.model_validate(message)
    assert parsed.id == "chatcmpl-42" and parsed.model == "claude-alias"
    assert [block.type for block in parsed.content] == ["thinking", "text", "tool_use",
                                                        "tool_use"]
    assert parsed.content[0].signature == ""  # type: ignore[union-attr]
    assert parsed.content[3].input == {"file_path": "/b"}  # type: ignore[union-attr]
    assert parsed.stop_reason == "tool_use"
    assert parsed.usage.input_tokens == 15  # without the cache's 105
    assert (parsed.usage.cache_read_input_tokens, parsed.usage.cache_creation_input_tokens,
            parsed.usage.output_tokens) == (100, 5, 40)
    assert parsed.usage.output_tokens_details.thinking_tokens == 12  # type: ignore[union-attr]


@pytest.mark.parametrize(("stop", "reason"), [
    ("end", "end_turn"), ("length", "max_tokens"), ("tool", "tool_use"),
    ("stop_sequence", "stop_sequence"), ("refusal", "refusal"), ("filter", "refusal"),
    ("pause", "pause_turn")])
def test_stop_reasons_map(stop: str, reason: str) -> None:
    reply = a_reply(parts=[Text("x")], stop=stop,
                    stop_sequence="END" if stop == "stop_sequence" else None)
    message = CODEC.write_reply(reply, Request(model="m"))
    assert (message["stop_reason"], message["stop_sequence"]) == (
        reason, "END" if stop == "stop_sequence" else None)
    assert CODEC.read_reply(message).stop == ("refusal" if stop == "filter" else stop)


def test_arguments_that_are_no_json_object_keep_their_text() -> None:
    reply = a_reply(parts=[ToolCall("c", "Read", '{"file_path": "/a'),
                           ToolCall("d", "List", "")])
    content = CODEC.write_reply(reply, Request(model="m"))["content"]
    assert content[0]["input"] == {"input": '{"file_path": "/a'}
    assert content[1]["input"] == {}


def test_a_refusal_is_text_with_the_refusal_stop() -> None:
    message = CODEC.write_reply(a_reply(parts=[Refusal("I can't help with that.")],
                                        stop="refusal"), Request(model="m"))
    assert message["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert message["stop_reason"] == "refusal"


# ---- the caller's side: the stream, read by the SDK ------------------------------------------


def sdk_view(message: Message) -> tuple:
    return (message.id, message.model,
            [(block.type, getattr(block, "text", None), getattr(block, "id", None),
              getattr(block, "input", None), getattr(block, "thinking", None))
             for block in message.content],
            message.stop_reason, message.stop_sequence,
            message.usage.model_dump(exclude_none=True))


def test_the_stream_reads_in_the_sdk_as_the_answer_does() -> None:
    reply, request = a_reply(), Request(model="claude-alias")
    streamed = sdk_message(written_stream(reply, request))
    whole = Message.model_validate(CODEC.write_reply(reply, request))
    assert sdk_view(streamed) == sdk_view(whole)


def test_interleaved_tool_call_fragments_come_out_as_whole_blocks() -> None:
    # A chat target sends two calls' arguments in turns, by index; Anthropic's blocks
    # cannot interleave.
    events: list[Event] = [
        Begin("chatcmpl-7", "qwen"), TextDelta("Both."),
        ToolCallBegin(0, "call_a", "Read"), ToolArgumentsDelta(0, '{"file_'),
        ToolCallBegin(1, "call_b", "Read"), ToolArgumentsDelta(1, '{"file_path":'),
        ToolArgumentsDelta(0, 'path": "/a"}'), ToolArgumentsDelta(1, ' "/b"}'),
        Finish("tool", Usage(30, 9))]
    frames = written_stream(Reply("", ""), Request(model="m"), events)
    names = [name for name, _ in sse_events(frames)]
    assert names[:2] == ["message_start", "ping"]
    starts = [data["index"] for name, data in sse_events(frames)
              if name == "content_block_start"]
    assert starts == [0, 1, 2]
    message = sdk_message(frames)
    assert [(block.id, block.input) for block in message.content[1:]] == [  # type: ignore[union-attr]
        ("call_a", {"file_path": "/a"}), ("call_b", {"file_path": "/b"})]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (30, 9)


def test_usage_told_at_the_start_stays_when_the_end_tells_none() -> None:
    events: list[Event] = [Begin("msg_1", "m", usage=Usage(50, 0, cache_read_tokens=20)),
                           TextDelta("hi"), Finish("end")]
    message = sdk_message(written_stream(Reply("", ""), Request(model="m"), events))
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (30, 20)


def test_a_failure_ends_the_stream_with_anthropics_error_event() -> None:
    writer = CODEC.stream_writer(Request(model="m"))
    writer.write(Begin("msg_1", "m"))
    frames = writer.write(Failure("Overloaded", type="overloaded_error", status=529))
    assert sse_events(frames) == [("error", {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}})]
    assert writer.write(TextDelta("late")) == b""
    with pytest.raises(anthropic.APIStatusError):
        sdk_message(written_stream(Reply("", ""), Request(model="m"), [
            Begin("msg_1", "m"), TextDelta("hi"), Failure("boom", status=500)]))


@pytest.mark.parametrize("code", sorted(errors.CATALOGUE))
def test_fail_writes_what_the_protocol_writes(code: str) -> None:
    kind = errors.CATALOGUE[code]
    writer = CODEC.stream_writer(Request(model="m"))
    ours = sse_events(writer.fail(kind.status, kind.type, code, "it broke"))
    assert ours == sse_events(MESSAGES.stream_error(code, "it broke"))
    assert writer.fail(kind.status, kind.type, code, "again") == b""


# ---- the target's side: the body -------------------------------------------------------------


def conversation(**fields: Any) -> Request:
    return Request(model="alias", **fields)


def test_a_chat_conversation_becomes_alternating_messages() -> None:
    request = conversation(
        system=[Text("Be brief.")],
        turns=[Turn("user", [Text("Weather in Paris and Rome?")]),
               Turn("assistant", [Thinking("Two cities.", signature=None),
                                  ToolCall("call_1", "weather", '{"city":"Paris"}'),
                                  ToolCall("call_2", "weather", '{"city":"Rome"}')]),
               Turn("tool", [ToolResult("call_1", [Text("18C")])]),
               Turn("tool", [ToolResult("call_2", [Text("25C")], is_error=True)]),
               Turn("system", [Text("Answer in French.")]),
               Turn("user", [Text("Thanks"), Image(url="data:image/png;base64,iVBORw0KGgo=")])],
        tools=[Tool("weather", "The weather", {"type": "object", "properties": {
            "city": {"type": "string"}}}), Tool("now")],
        tool_choice=ToolChoice("required"), parallel_tool_calls=False,
        stop=["END"], user="u-1", temperature=0.2, stream=True)
    body = CODEC.write_request(request, model="claude-sonnet-4-5")
    assert set(body) <= TOP_LEVEL
    assert body["system"] == "Be brief." and body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert [message["role"] for message in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}}]
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "25C", "is_error": True},
        {"type": "text", "text": "<system>\nAnswer in French.\n</system>"},
        {"type": "text", "text": "Thanks"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]
    assert body["tools"][1] == {"name": "now", "input_schema": {"type": "object",
                                                                "properties": {}}}
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert (body["stop_sequences"], body["metadata"], body["temperature"], body["stream"]) == (
        ["END"], {"user_id": "u-1"}, 0.2, True)
    assert request.dropped == ["thinking"]  # unsigned: Anthropic would refuse it


def test_a_custom_tool_is_a_function_of_one_string() -> None:
    request = conversation(
        turns=[Turn("user", [Text("patch it")]),
               Turn("assistant", [ToolCall("c1", "apply_patch", "*** Begin Patch", "custom")]),
               Turn("tool", [ToolResult("c1", [Text("done")], kind="custom")])],
        tools=[Tool("apply_patch", "Patch files", kind="custom",
                    grammar={"type": "grammar", "syntax": "lark", "definition": "start: /.+/"})])
    body = CODEC.write_request(request, model="claude")
    assert request.dropped == ["format"]
    assert body["tools"] == [{"name": "apply_patch", "description": "Patch files",
                              "input_schema": {"type": "object", "properties": {
                                  CUSTOM_INPUT: {"type": "string"}},
                                  "required": [CUSTOM_INPUT]}}]
    assert body["messages"][1]["content"][0]["input"] == {CUSTOM_INPUT: "*** Begin Patch"}


def test_reasoning_becomes_a_thinking_budget_without_temperature() -> None:
    request = conversation(turns=[Turn("user", [Text("hi")])], max_output_tokens=8000,
                           reasoning=Reasoning(effort="high"), temperature=0.3, top_p=0.5)
    body = CODEC.write_request(request, model="claude")
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert "temperature" not in body and "top_p" not in body
    assert request.dropped == ["temperature", "top_p"]


@pytest.mark.parametrize(("fields", "dropped"), [
    ({"max_output_tokens": 1000, "reasoning": Reasoning(effort="low")}, ["reasoning"]),
    ({"reasoning": Reasoning(budget_tokens=2000), "tool_choice": ToolChoice("tool", "f"),
      "tools": [Tool("f")]}, ["reasoning"]),
    ({"reasoning": Reasoning(enabled=False)}, []),
])
def test_thinking_anthropic_would_refuse_is_left_out(fields: dict, dropped: list) -> None:
    request = conversation(turns=[Turn("user", [Text("hi")])], **fields)
    assert "thinking" not in CODEC.write_request(request, model="claude")
    assert request.dropped == dropped


def test_no_thinking_in_a_tool_loop_another_target_answered() -> None:
    loop = [Turn("user", [Text("run it")]),
            Turn("assistant", [Thinking("unsigned"), ToolCall("c1", "run", "{}")]),
            Turn("tool", [ToolResult("c1", [Text("ok")])])]
    request = conversation(turns=loop, reasoning=Reasoning(effort="medium"))
    assert "thinking" not in CODEC.write_request(request, model="c")
    assert request.dropped == ["thinking", "reasoning"]
    loop[1].parts[0] = Thinking("signed", signature="sig")
    signed = conversation(turns=loop, reasoning=Reasoning(effort="medium"))
    assert CODEC.write_request(signed, model="c")["thinking"]["type"] == "enabled"


def test_a_budget_stays_below_max_tokens() -> None:
    request = conversation(turns=[Turn("user", [Text("hi")])], max_output_tokens=3000,
                           reasoning=Reasoning(budget_tokens=5000))
    assert CODEC.write_request(request, model="c")["thinking"]["budget_tokens"] == 2999


def test_structured_output_and_json_mode() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    request = conversation(turns=[Turn("user", [Text("n?")])],
                           output_format=OutputFormat("json_schema", schema, name="n"))
    assert CODEC.write_request(request, model="c")["output_config"] == {
        "format": {"type": "json_schema", "schema": schema}}
    plain = conversation(turns=[Turn("user", [Text("n?")])],
                         output_format=OutputFormat("json_object"))
    assert "output_config" not in CODEC.write_request(plain, model="c")
    assert plain.dropped == ["response_format"]


def test_temperature_and_top_p_together_keep_temperature() -> None:
    request = conversation(turns=[Turn("user", [Text("hi")])], temperature=1.7, top_p=0.9)
    body = CODEC.write_request(request, model="c")
    assert (body["temperature"], "top_p" in body, request.dropped) == (1.0, False, ["top_p"])


def test_what_anthropic_cannot_take_is_refused() -> None:
    with pytest.raises(Untranslatable) as stateful:
        CODEC.write_request(conversation(previous_response_id="resp_1"), model="c")
    assert stateful.value.field == "previous_response_id"
    tiff = conversation(turns=[Turn("user", [Image(data="SUkqAA==", media_type="image/tiff")])])
    with pytest.raises(Untranslatable):
        CODEC.write_request(tiff, model="c")


def test_an_inline_image_without_its_type_is_sniffed() -> None:
    request = conversation(turns=[Turn("user", [Image(data="/9j/4AAQSkZJRg==")])])
    block = CODEC.write_request(request, model="c")["messages"][0]["content"][0]
    assert block["source"]["media_type"] == "image/jpeg"


def test_path() -> None:
    assert CODEC.path("claude", True) == ("/messages", "")


# ---- the target's side: the answer and its stream --------------------------------------------


def test_an_error_event_is_a_failure_with_anthropics_status() -> None:
    reader = CODEC.stream_reader()
    reader.feed({"type": "message_start", "message": {"id": "msg_1", "model": "c",
                                                      "usage": {"input_tokens": 3}}})
    assert reader.feed({"type": "error", "error": {"type": "overloaded_error",
                                                   "message": "Overloaded"}}) == [
        Failure("Overloaded", type="overloaded_error", status=529)]
    assert reader.end() == []


def test_a_stream_cut_before_message_stop_still_finishes() -> None:
    reader = CODEC.stream_reader()
    reader.feed({"type": "message_start", "message": {"id": "msg_1", "model": "c",
                                                      "usage": {"input_tokens": 3,
                                                                "output_tokens": 1}}})
    reader.feed({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                 "usage": {"output_tokens": 7}})
    assert reader.end() == [Finish("length", Usage(3, 7))]


def fake_stream_payloads(reply: AnthropicReply) -> list[dict]:
    """The fake upstream's event stream for ``reply``, as its stream() sends it."""
    payloads: list[dict] = [reply.message_start()]
    for index, block in enumerate(reply.blocks):
        payloads.append({"type": "content_block_start", "index": index,
                         "content_block": block.start})
        if index == 0:
            payloads.append({"type": "ping"})
        payloads += [{"type": "content_block_delta", "index": index, "delta": delta}
                     for delta in block.deltas]
        payloads.append({"type": "content_block_stop", "index": index})
    return [*payloads, reply.message_delta(), {"type": "message_stop"}]


WEATHER = {"name": "get_weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.mark.parametrize(("thinking", "tool", "max_tokens"), [
    (None, None, 1000), ({"type": "enabled", "budget_tokens": 1024}, None, 4000),
    ({"type": "adaptive"}, "get_weather", 4000), (None, None, 10)])
def test_the_fake_upstreams_stream_reads_as_its_message(thinking: dict | None,
                                                        tool: str | None,
                                                        max_tokens: int) -> None:
    request: dict[str, Any] = {"model": "claude-sonnet-5-5", "max_tokens": max_tokens,
                               "tools": [WEATHER],
                               "messages": [{"role": "user", "content": "weather?"}]}
    if thinking:
        request["thinking"] = thinking
    reply = plan_reply(request, "claude-sonnet-5-5", max_tokens, 8, tool,
                       CacheSplit(prompt=900, read=600, write_5m=100, write_1h=50))
    folded = fold(read_stream(fake_stream_payloads(reply)))
    assert folded == CODEC.read_reply(reply.message())
    assert folded.usage is not None and folded.usage.input_tokens == 900


# ---- round trips -------------------------------------------------------------------------------

# Structure is what a round trip tests: a few characters, JSON's special ones among them.
_text = st.text(st.sampled_from('aZ 9"\\\n\u00e9\u4e2d\U0001f600<>'), min_size=1, max_size=12)
_json_value = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(_text, inner, max_size=3), max_leaves=6)
_image = st.sampled_from([
    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                 "data": "iVBORw0KGgo="}},
    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}])
_text_block = st.builds(lambda text: {"type": "text", "text": text}, _text)
_ids = st.integers(0, 10**9).map(lambda n: f"toolu_{n:09d}")


@st.composite
def _exchange(draw: st.DrawFn) -> list[dict]:
    """A user message, the assistant's answer (text, thinking, tool calls) and, when it
    called tools, the user's results (first, as Anthropic requires) and more text."""
    user = draw(st.one_of(_text, st.lists(_text_block | _image, min_size=1, max_size=3)))
    calls = draw(st.lists(st.builds(lambda id_, name, arguments: {
        "type": "tool_use", "id": id_, "name": name, "input": arguments},
        _ids, st.sampled_from(["Read", "Bash", "Grep"]),
        st.dictionaries(_text, _json_value, max_size=3)), max_size=3,
        unique_by=lambda call: call["id"]))
    head = draw(st.lists(st.builds(lambda text, sig: {"type": "thinking", "thinking": text,
                                                      "signature": sig}, _text, _text),
                         max_size=1))
    said = draw(st.lists(_text_block, min_size=0 if calls else 1, max_size=2))
    messages = [{"role": "user", "content": user},
                {"role": "assistant", "content": head + said + calls}]
    if calls:
        results = [{"type": "tool_result", "tool_use_id": call["id"],
                    "content": draw(st.one_of(_text, st.lists(_text_block | _image,
                                                              min_size=2, max_size=3))),
                    **({"is_error": True} if draw(st.booleans()) else {})} for call in calls]
        messages.append({"role": "user", "content": results + draw(st.lists(_text_block,
                                                                            max_size=2))})
    return messages


@st.composite
def _bodies(draw: st.DrawFn) -> dict:
    messages = [message for exchange in draw(st.lists(_exchange(), min_size=1, max_size=3))
                for message in exchange]
    # Two user messages in a row are one to Anthropic (and to the writer).
    merged: list[dict] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {"role": message["role"],
                          "content": _blocks(merged[-1]["content"])
                          + _blocks(message["content"])}
        else:
            merged.append(message)
    body: dict[str, Any] = {"model": "claude-sonnet-4-5",
                            "max_tokens": draw(st.integers(1, 64000)), "messages": merged}
    if draw(st.booleans()):
        body["system"] = draw(_text)
    body["tools"] = [{"name": name, "description": draw(_text), "input_schema": {
        "type": "object", "properties": {"path": {"type": "string"}}}}
        for name in ("Read", "Bash", "Grep")]
    return body


def _blocks(content: str | list) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _normal(body: dict) -> dict:
    """A body with each message's and tool result's content as blocks."""
    messages = []
    for message in body["messages"]:
        blocks = []
        for block in _blocks(message["content"]):
            if block["type"] == "tool_result":
                block = {**block, "content": _blocks(block["content"])}
            blocks.append(block)
        messages.append({"role": message["role"], "content": blocks})
    return {**body, "messages": messages}


@settings(max_examples=40, deadline=None)
@given(_bodies())
def test_messages_round_trip_through_the_form(body: dict) -> None:
    request = CODEC.read_request(body)
    written = CODEC.write_request(request, model=body["model"])
    assert _normal(written) == _normal(body)
    assert request.dropped == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(
    st.builds(Text, _text),
    st.builds(lambda text, sig: Thinking(text, signature=sig), _text, _text),
    st.builds(lambda id_, args: ToolCall(id_, "Read", orjson.dumps(args).decode()), _ids,
              st.dictionaries(_text, _json_value, max_size=3))), max_size=5),
    st.sampled_from(["end", "length", "tool", "stop_sequence", "refusal", "pause"]),
    st.builds(Usage, st.integers(200, 10**6), st.integers(0, 10**5), st.integers(0, 100),
              st.integers(0, 100), st.integers(0, 0)))
def test_an_answer_streams_to_what_it_says_whole(parts: list[Part], stop: str,
                                                 usage: Usage) -> None:
    # The writer's stream, read back by this codec's own reader, is the answer it wrote whole.
    reply = Reply("msg_x", "m", parts=parts, stop=stop,  # type: ignore[arg-type]
                  stop_sequence="END" if stop == "stop_sequence" else None, usage=usage)
    request = Request(model="alias")
    frames = written_stream(reply, request)
    streamed = fold(read_stream([data for _, data in sse_events(frames)]))
    assert streamed == CODEC.read_reply(CODEC.write_reply(reply, request))


def test_empty_text_never_becomes_a_block() -> None:
    request = conversation(system=[Text(""), Text("Be brief.")], turns=[
        Turn("user", [Text(""), Text("hi")]),
        Turn("assistant", [ToolCall("c1", "look", "{}")]),
        Turn("tool", [ToolResult("c1", [Text(""), Image(url="https://x/y.png")])])])
    body = CODEC.write_request(request, model="c")
    assert body["system"] == "Be brief."
    assert body["messages"][0]["content"] == [{"type": "text", "text": "hi"}]
    assert body["messages"][2]["content"][0]["content"] == [
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]
