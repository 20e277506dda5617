"""The Responses codec (llm_gateway.translate.responses): OpenAI's documented examples read
and written, a Codex-like request read with what it loses named, round trips through the
hub form, and the caller's side checked by the openai SDK itself (its Response model and its
stream accumulator over an httpx.MockTransport)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response

from llm_gateway.translate import codec, responses
from llm_gateway.translate.form import (
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
CODEC = responses.CODEC


def sse_events(raw: bytes | str) -> list[dict]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    # SSE's lines end at CR or LF only (str.splitlines would also cut at U+2028 and the like)
    return [json.loads(line[len("data: "):]) for line in text.split("\n")
            if line.startswith("data: ")]


def read_stream(events: list[dict]) -> list[Event]:
    reader = CODEC.stream_reader()
    out: list[Event] = []
    for event in events:
        out += reader.feed(event)
    return out + reader.end()


def write_stream(request: Request, events: list[Event]) -> bytes:
    writer = CODEC.stream_writer(request)
    return b"".join(writer.write(event) for event in events)


_ANSWER: list[bytes] = [b""]  # what the one client's transport answers next


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"},
                          content=_ANSWER[0])


# One client for every example: making one per example is most of a property test's time.
_CLIENT = openai.OpenAI(api_key="test", base_url="http://gateway.test/v1", max_retries=0,
                        http_client=httpx.Client(transport=httpx.MockTransport(_answer)))


def sdk_client(body: bytes) -> openai.OpenAI:
    """The openai SDK, its every request answered with ``body`` (an SSE stream)."""
    _ANSWER[0] = body
    return _CLIENT


# ---- OpenAI's documented examples ----------------------------------------------------------


def test_codec_is_registered_under_its_protocol_name() -> None:
    assert codec("responses") is CODEC
    assert CODEC.name == "responses"
    assert CODEC.path("gpt-4.1", True) == ("/responses", "")


def test_documented_function_calling_request_reads_into_the_form() -> None:
    documented = json.loads((RECORDED / "openai_responses_function_call.json").read_text())
    request = CODEC.read_request(documented["request"])
    assert request.model == "gpt-4.1"
    assert request.turns == [Turn("user", [Text("What is the weather like in Paris today?")])]
    assert request.tools == [Tool(
        "get_weather", "Get current temperature for a given location.",
        documented["request"]["tools"][0]["parameters"], strict=True)]
    assert request.dropped == []


def test_documented_function_call_answer_reads_and_writes_back() -> None:
    documented = json.loads((RECORDED / "openai_responses_function_call.json").read_text())
    reply = CODEC.read_reply(documented["response"])
    assert reply.id == "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41"
    assert reply.parts == [ToolCall("call_12345xyz", "get_weather",
                                    '{"location":"Paris, France"}')]
    assert reply.stop == "tool"
    assert reply.usage == Usage(input_tokens=291, output_tokens=23)
    assert reply.created == 1741476777
    request = CODEC.read_request(documented["request"])
    written = Response.model_validate(CODEC.write_reply(reply, request))
    assert written.id == reply.id
    assert written.status == "completed"
    [call] = written.output
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call", "call_12345xyz", "get_weather", '{"location":"Paris, France"}')
    assert written.usage is not None and written.usage.total_tokens == 314


def test_documented_text_stream_reads_into_events() -> None:
    events = read_stream(sse_events((RECORDED / "openai_responses_stream_text.sse").read_text()))
    begin, *deltas, finish = events
    assert begin == Begin("resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654",
                          "gpt-4.1-2025-04-14", created=1741290958)
    assert all(isinstance(delta, TextDelta) and delta.index == 0 for delta in deltas)
    assert "".join(delta.text for delta in deltas) == "Hi there! How can I assist you today?"
    assert finish == Finish("end", Usage(input_tokens=37, output_tokens=11))


def test_documented_function_call_stream_reads_into_events() -> None:
    raw = (RECORDED / "openai_responses_stream_function_call.sse").read_text()
    begin, call, *fragments, finish = read_stream(sse_events(raw))
    assert isinstance(begin, Begin) and begin.id == "resp_1234xyz"
    assert call == ToolCallBegin(0, "call_1234xyz", "get_weather")
    assert all(isinstance(fragment, ToolArgumentsDelta) and fragment.index == 0
               for fragment in fragments)
    assert "".join(f.fragment for f in fragments) == '{"location":"Paris, France"}'
    assert finish == Finish("tool", Usage(input_tokens=291, output_tokens=23,
                                          cache_read_tokens=128))


def test_documented_stream_through_the_writer_is_what_the_sdk_reads_of_the_original() -> None:
    """A Responses target's stream read and written again: the SDK's final response is the
    one it reads of the documented stream (text, call, usage)."""
    for name in ("openai_responses_stream_text.sse", "openai_responses_stream_function_call.sse"):
        raw = (RECORDED / name).read_text()
        documented = json.loads((RECORDED / "openai_responses_function_call.json").read_text())
        request = CODEC.read_request(documented["request"])
        rewritten = write_stream(request, read_stream(sse_events(raw)))
        with sdk_client(raw.encode()).responses.stream(model="m", input="x") as stream:
            want = stream.get_final_response()
        with sdk_client(rewritten).responses.stream(model="m", input="x") as stream:
            got = stream.get_final_response()
        assert got.output_text == want.output_text
        assert [(o.call_id, o.name, o.arguments) for o in got.output if o.type == "function_call"] \
            == [(o.call_id, o.name, o.arguments) for o in want.output if o.type == "function_call"]
        assert counts(got) == counts(want)


def counts(response: Response) -> tuple[int, ...] | None:
    usage = response.usage
    if usage is None:
        return None
    return (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens,
            usage.output_tokens_details.reasoning_tokens, usage.total_tokens)


# ---- what a Codex caller sends -------------------------------------------------------------

APPLY_PATCH_GRAMMAR = {"type": "grammar", "syntax": "lark",
                       "definition": 'start: begin_patch hunk+ end_patch\n'
                                     'begin_patch: "*** Begin Patch"'}

CODEX_REQUEST = {
    "model": "gpt-5.1-codex",
    "instructions": "You are Codex, a coding agent.",
    "input": [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}]},
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "<collaboration_mode>default"}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "<environment_context>cwd=/w"}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Fix the failing test."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
                                                         "text": "Look at the test first."}],
         "encrypted_content": "gAAAAABopaque"},
        {"type": "function_call", "call_id": "call_a", "name": "shell",
         "arguments": '{"command":["pytest","-q"]}'},
        {"type": "function_call", "call_id": "call_b", "name": "shell",
         "arguments": '{"command":["cat","t.py"]}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "1 failed"},
        {"type": "function_call_output", "call_id": "call_b", "output": "assert 1 == 2"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "pytest"}},
        {"type": "custom_tool_call", "call_id": "call_c", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_c", "output": "Done"},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a command.", "strict": False,
         "parameters": {"type": "object", "properties": {
             "command": {"type": "array", "items": {"type": "string"}}},
             "required": ["command"], "additionalProperties": False}},
        {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
         "format": APPLY_PATCH_GRAMMAR},
        {"type": "tool_search", "execution": "client"},
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1",
    "text": {"verbosity": "low"},
    "client_metadata": {"session": "s"},
}


def test_a_codex_request_reads_with_what_it_loses_named() -> None:
    request = CODEC.read_request(CODEX_REQUEST)
    assert request.system == [Text("You are Codex, a coding agent."),
                              Text("<permissions>sandboxed</permissions>"),
                              Text("<collaboration_mode>default")]
    assert request.turns == [
        Turn("user", [Text("<environment_context>cwd=/w")]),
        Turn("user", [Text("Fix the failing test.")]),
        Turn("assistant", [Thinking("Look at the test first.", encrypted="gAAAAABopaque"),
                           ToolCall("call_a", "shell", '{"command":["pytest","-q"]}'),
                           ToolCall("call_b", "shell", '{"command":["cat","t.py"]}')]),
        Turn("tool", [ToolResult("call_a", [Text("1 failed")]),
                      ToolResult("call_b", [Text("assert 1 == 2")])]),
        Turn("assistant", [ToolCall("call_c", "apply_patch", "*** Begin Patch\n*** End Patch",
                                    kind="custom")]),
        Turn("tool", [ToolResult("call_c", [Text("Done")], kind="custom")]),
    ]
    assert [(tool.name, tool.kind) for tool in request.tools] == [
        ("shell", "function"), ("apply_patch", "custom")]
    assert request.tools[0].strict is False
    assert request.tools[1].grammar == APPLY_PATCH_GRAMMAR
    assert request.tool_choice == ToolChoice("auto")
    assert request.parallel_tool_calls is True
    assert request.reasoning == Reasoning(effort="medium", summary="auto")
    assert request.stream is True
    assert request.dropped == ["input[web_search_call]", "tools[tool_search]",
                               "tools[web_search]", "text.verbosity", "include",
                               "prompt_cache_key", "client_metadata"]


def test_the_rest_of_the_request_maps() -> None:
    request = CODEC.read_request({
        "model": "m", "input": "hi", "max_output_tokens": 300, "temperature": 0.2, "top_p": 0.9,
        "tool_choice": {"type": "function", "name": "f"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "answer", "strict": True,
                            "schema": {"type": "object"}}},
        "safety_identifier": "end-user-1", "previous_response_id": "resp_prev",
        "store": True, "metadata": {"a": "b"}, "service_tier": "flex", "truncation": "auto",
        "max_tool_calls": 3, "top_logprobs": 2, "reasoning": {"effort": "none"}})
    assert request.turns == [Turn("user", [Text("hi")])]
    assert request.max_output_tokens == 300
    assert (request.temperature, request.top_p) == (0.2, 0.9)
    assert request.tool_choice == ToolChoice("tool", "f")
    assert request.output_format == OutputFormat("json_schema", {"type": "object"}, "answer",
                                                 True)
    assert request.user == "end-user-1"
    assert request.previous_response_id == "resp_prev"
    assert request.reasoning == Reasoning(enabled=False)
    assert request.dropped == ["store", "metadata", "service_tier", "truncation",
                               "max_tool_calls", "top_logprobs"]
    assert CODEC.read_request({"model": "m", "input": "x", "text": {
        "format": {"type": "json_object"}}}).output_format == OutputFormat("json_object")
    # store false, defaults and empty lists are no loss
    assert CODEC.read_request({"model": "m", "input": "x", "store": False, "include": [],
                               "truncation": "disabled", "text": {"format": {"type": "text"}}}
                              ).dropped == []


def test_tool_choice_allowed_tools_keeps_the_allowed_ones_only() -> None:
    tools = [{"type": "function", "name": name, "parameters": {}} for name in ("a", "b", "c")]
    request = CODEC.read_request({"model": "m", "input": "x", "tools": tools, "tool_choice": {
        "type": "allowed_tools", "mode": "auto",
        "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "c"}]}})
    assert [tool.name for tool in request.tools] == ["a", "c"]
    assert request.tool_choice == ToolChoice("auto")
    request = CODEC.read_request({"model": "m", "input": "x", "tools": tools, "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                                               "name": "b"}]}})
    assert request.tool_choice == ToolChoice("tool", "b")
    request = CODEC.read_request({"model": "m", "input": "x", "tools": tools,
                                  "tool_choice": {"type": "web_search_preview"}})
    assert request.tool_choice is None and request.dropped == ["tool_choice"]


def test_images_by_url_and_inline() -> None:
    request = CODEC.read_request({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"},
        {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ",
         "detail": "high"}]}]})
    assert request.turns == [Turn("user", [Text("what is this?"),
                                           Image(url="https://example.com/cat.png"),
                                           Image(data="/9j/4AAQ", media_type="image/jpeg")])]
    assert request.dropped == ["detail"]


@pytest.mark.parametrize(("payload", "field"), [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[].item_reference"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[].content[].input_file"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[].content[].file_id"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": [{"type": "compaction", "encrypted_content": "e"}]}, "input[compaction]"),
])
def test_what_would_change_the_conversation_is_refused(payload: dict, field: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        CODEC.read_request({"model": "m", **payload})
    assert refused.value.field == field


# ---- the caller's answer -------------------------------------------------------------------


def codex_request() -> Request:
    return CODEC.read_request(CODEX_REQUEST)


def test_a_chat_targets_answer_is_a_response_the_sdk_reads() -> None:
    """A reply as a chat target's reader gives it: reasoning_content, text, a function call
    and the custom tool called as a function of one string argument."""
    reply = Reply(id="chatcmpl-abc", model="qwen3", created=1700000000, stop="tool",
                  parts=[Thinking("Patch it."), Text("Applying the fix."),
                         ToolCall("call_1", "shell", '{"command":["ls"]}'),
                         ToolCall("call_2", "apply_patch",
                                  json.dumps({"input": "*** Begin Patch\n*** End Patch"}))],
                  usage=Usage(input_tokens=1000, output_tokens=50, cache_read_tokens=800,
                              reasoning_tokens=20))
    request = codex_request()
    written = CODEC.write_reply(reply, request)
    parsed = Response.model_validate(written)
    assert parsed.id == "resp_chatcmpl-abc"
    assert parsed.model == "gpt-5.1-codex"
    assert parsed.created_at == 1700000000
    assert parsed.status == "completed"
    assert parsed.output_text == "Applying the fix."
    kinds = [item.type for item in parsed.output]
    assert kinds == ["reasoning", "message", "function_call", "custom_tool_call"]
    reasoning, message, call, custom = parsed.output
    assert reasoning.id.startswith("rs_") and reasoning.summary[0].text == "Patch it."
    assert message.id.startswith("msg_") and message.status == "completed"
    assert call.id.startswith("fc_") and call.call_id == "call_1"
    assert (custom.call_id, custom.name, custom.input) == (
        "call_2", "apply_patch", "*** Begin Patch\n*** End Patch")
    assert written["usage"] == {
        "input_tokens": 1000, "input_tokens_details": {"cached_tokens": 800,
                                                       "cache_write_tokens": 0},
        "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 1050}
    assert [tool["type"] for tool in written["tools"]] == ["function", "custom"]


@pytest.mark.parametrize(("stop", "status", "reason"), [
    ("end", "completed", None), ("tool", "completed", None), ("stop_sequence", "completed", None),
    ("length", "incomplete", "max_output_tokens"), ("filter", "incomplete", "content_filter")])
def test_stop_reasons(stop: str, status: str, reason: str | None) -> None:
    written = CODEC.write_reply(Reply(id="resp_x", model="m", parts=[Text("t")], stop=stop),
                                Request(model="m", now=5))
    parsed = Response.model_validate(written)
    assert parsed.id == "resp_x" and parsed.created_at == 5
    assert parsed.status == status
    assert (parsed.incomplete_details.reason if parsed.incomplete_details else None) == reason
    # read back as a target's answer, the stop is the same
    back = CODEC.read_reply(written).stop
    assert back == (stop if stop in ("length", "filter") else "end")


def test_a_refusal_is_a_refusal_part() -> None:
    written = CODEC.write_reply(Reply(id="r", model="m", parts=[Refusal("I can't help.")],
                                      stop="refusal"), Request(model="m"))
    parsed = Response.model_validate(written)
    assert parsed.output[0].content[0].type == "refusal"
    assert parsed.output[0].content[0].refusal == "I can't help."


def test_an_anthropic_proof_comes_back_in_the_next_request() -> None:
    """Anthropic's thinking signature rides in encrypted_content: a stateless caller sends
    the reasoning item back and the form has the signature again (the Anthropic writer
    needs it before a tool result)."""
    parts = [Thinking("Let me think.", signature="EqQBCkgI"),
             Thinking("", signature="opaque-data", redacted=True),
             ToolCall("toolu_1", "shell", "{}")]
    written = CODEC.write_reply(Reply(id="msg_01", model="claude", parts=parts, stop="tool"),
                                Request(model="m"))
    Response.model_validate(written)
    encrypted = [item["encrypted_content"] for item in written["output"]
                 if item["type"] == "reasoning"]
    assert encrypted == ["signature:EqQBCkgI", "redacted:opaque-data"]
    again = CODEC.read_request({"model": "m", "input": written["output"]})
    assert again.turns == [Turn("assistant", parts)]


# ---- the caller's stream, as the SDK reads it ---------------------------------------------


def events_of(reply: Reply, *, interleave: bool = False, chunk: int = 3) -> list[Event]:
    """The events a target's reader would give for ``reply``: text cut in chunks; calls'
    arguments too, and, with ``interleave``, all calls begun first and their fragments
    round-robin (as a chat target may send them)."""
    out: list[Event] = [Begin(reply.id, reply.model, created=reply.created)]
    calls = [part for part in reply.parts if isinstance(part, ToolCall)]
    texts = thinking = 0
    for part in reply.parts:
        if isinstance(part, Text):
            out += [TextDelta(part.text[i:i + chunk], texts)
                    for i in range(0, len(part.text), chunk)] or [TextDelta("", texts)]
            texts += 1
        elif isinstance(part, Refusal):
            out.append(RefusalDelta(part.text))
        elif isinstance(part, Thinking):
            out.append(ThinkingDelta(part.text, index=thinking))
            if part.signature:
                out.append(ThinkingDelta(signature=part.signature, index=thinking))
            if part.encrypted:  # a Responses target says it as the item is done
                out.append(ThinkingDelta(encrypted=part.encrypted, index=thinking))
            thinking += 1
        elif isinstance(part, ToolCall) and not interleave:
            index = calls.index(part)
            out.append(ToolCallBegin(index, part.id, part.name, part.kind))
            out += [ToolArgumentsDelta(index, part.arguments[i:i + chunk])
                    for i in range(0, len(part.arguments), chunk)]
    if interleave:
        out += [ToolCallBegin(i, call.id, call.name, call.kind) for i, call in enumerate(calls)]
        pieces = [[c.arguments[i:i + chunk] for i in range(0, len(c.arguments), chunk)]
                  for c in calls]
        for step in range(max((len(p) for p in pieces), default=0)):
            out += [ToolArgumentsDelta(i, p[step]) for i, p in enumerate(pieces)
                    if step < len(p)]
    out.append(Finish(reply.stop, reply.usage))
    return out


def sdk_final(frames: bytes, request: Request) -> Response:
    """The final response as the SDK's stream helper accumulates it (its
    get_final_response wants response.completed: a cut one ends response.incomplete, whose
    response the helper fills from the items it saw)."""
    with sdk_client(frames).responses.stream(model=request.model, input="x") as stream:
        last = [event for event in stream if event.type in ("response.completed",
                                                            "response.incomplete")]
    assert len(last) == 1
    return last[0].response


def check_stream_matches_reply(reply: Reply, request: Request, *, interleave: bool) -> None:
    frames = write_stream(request, events_of(reply, interleave=interleave))
    events = sse_events(frames)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    # the SDK's own iterator reads every event as its type
    kinds = [event.type for event in
             sdk_client(frames).responses.create(model="m", input="x", stream=True)]
    assert kinds == [event["type"] for event in events]
    written = CODEC.write_reply(reply, request)
    # the stream's last event carries the very response the JSON answer is
    assert events[-1]["response"] == written
    got = sdk_final(frames, request)
    want = Response.model_validate(written)
    assert got.id == want.id and got.status == want.status
    assert got.output_text == want.output_text
    assert got.usage == want.usage
    assert [calls(item) for item in got.output] == [calls(item) for item in want.output]


def calls(item: object) -> tuple:
    kind = getattr(item, "type", None)
    if kind == "function_call":
        return (kind, item.call_id, item.name, item.arguments)  # type: ignore[attr-defined]
    if kind == "custom_tool_call":
        return (kind, item.call_id, item.name, item.input)  # type: ignore[attr-defined]
    return (kind, getattr(item, "id", None))


def test_a_codex_stream_from_a_chat_target_is_the_answer_the_sdk_reads() -> None:
    reply = Reply(id="chatcmpl-9", model="qwen3", created=17, stop="tool",
                  parts=[Thinking("First the tests."), Text("Running them."),
                         ToolCall("call_1", "shell", '{"command":["pytest"]}'),
                         ToolCall("call_2", "shell", '{"command":["ls","-la"]}'),
                         ToolCall("call_3", "apply_patch", json.dumps({"input": "*** Begin"}))],
                  usage=Usage(input_tokens=10, output_tokens=7, cache_read_tokens=4,
                              reasoning_tokens=2))
    for interleave in (False, True):
        check_stream_matches_reply(reply, codex_request(), interleave=interleave)


def test_a_stream_from_an_anthropic_target_keeps_the_signature_and_the_prompts_usage() -> None:
    request = codex_request()
    frames = write_stream(request, [
        Begin("msg_01", "claude", usage=Usage(input_tokens=500, cache_read_tokens=100)),
        ThinkingDelta("Hmm."), ThinkingDelta(signature="EqQB"), ThinkingDelta(signature="Cgo"),
        ToolCallBegin(0, "toolu_1", "apply_patch", "custom"),
        ToolArgumentsDelta(0, "*** Begin"), ToolArgumentsDelta(0, " Patch"),
        Finish("tool", Usage(output_tokens=30))])
    final = sdk_final(frames, request)
    reasoning, custom = final.output
    assert reasoning.encrypted_content == "signature:EqQBCgo"
    assert (custom.type, custom.input) == ("custom_tool_call", "*** Begin Patch")
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.input_tokens_details.cached_tokens,
            final.usage.output_tokens) == (500, 100, 30)
    kinds = [event["type"] for event in sse_events(frames)]
    assert kinds.count("response.custom_tool_call_input.delta") == 2


def test_a_cut_stream_is_incomplete() -> None:
    reply = Reply(id="c", model="m", parts=[Text("It was a dark and")], stop="length",
                  usage=Usage(input_tokens=3, output_tokens=5))
    check_stream_matches_reply(reply, Request(model="m"), interleave=False)
    frames = write_stream(Request(model="m"), events_of(reply))
    assert sse_events(frames)[-1]["type"] == "response.incomplete"


def test_a_failed_stream_ends_with_error_then_response_failed() -> None:
    writer = CODEC.stream_writer(Request(model="m"))
    frames = writer.write(Begin("x", "m")) + writer.write(TextDelta("half"))
    frames += writer.fail(502, "upstream_error", "upstream_stream_interrupted", "cut")
    events = sse_events(frames)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    error, failed = events[-2:]
    assert error == {"type": "error", "code": "upstream_stream_interrupted", "message": "cut",
                     "param": None, "sequence_number": len(events) - 2}
    assert failed["type"] == "response.failed"
    assert Response.model_validate(failed["response"]).error.code == "server_error"
    assert writer.write(TextDelta("more")) == b"" and writer.fail(500, "t", "c", "m") == b""
    # before anything was said: the error alone, numbered 0, as protocols/responses writes it
    early = sse_events(CODEC.stream_writer(Request(model="m")).fail(
        429, "insufficient_quota", "insufficient_quota", "spent"))
    assert early == [{"type": "error", "code": "insufficient_quota", "message": "spent",
                      "param": None, "sequence_number": 0}]
    # the target's own in-band failure
    target = sse_events(write_stream(Request(model="m"), [Begin("x", "m"),
                                                          Failure("overloaded", status=429)]))
    assert [event["type"] for event in target][-2:] == ["error", "response.failed"]
    assert target[-1]["response"]["error"]["code"] == "rate_limit_exceeded"


# ---- round trips ---------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
ids = st.from_regex(r"[A-Za-z0-9]{1,10}", fullmatch=True)  # made unique by position
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
arguments = st.dictionaries(names, st.integers() | words, max_size=3).map(json.dumps)


@st.composite
def tools(draw: st.DrawFn) -> list[Tool]:
    chosen = draw(st.lists(names, unique=True, max_size=4))
    return [draw(st.one_of(
        st.builds(Tool, st.just(name), st.none() | words,
                  st.just({"type": "object", "properties": {}}), st.just("function"),
                  st.booleans()),
        st.builds(Tool, st.just(name), st.none() | words, st.none(), st.just("custom"),
                  st.none(), st.none() | st.just(APPLY_PATCH_GRAMMAR))))
        for name in chosen]


@st.composite
def conversations(draw: st.DrawFn) -> Request:
    defined = draw(tools())
    turns: list[Turn] = [Turn("user", [Text(draw(words))])]
    for step in range(draw(st.integers(0, 3))):
        calls = [ToolCall(f"call_{step}_{n}_{draw(ids)}", tool.name,
                          draw(words) if tool.kind == "custom" else draw(arguments), tool.kind)
                 for n, tool in enumerate(draw(st.lists(st.sampled_from(defined), max_size=3)))
                 ] if defined else []
        said = draw(st.lists(st.one_of(
            st.builds(Text, words), st.builds(Refusal, words),
            st.builds(Thinking, words, encrypted=st.text("abcdefgh", min_size=1)),
            st.builds(Thinking, words, signature=st.text("xyz", min_size=1))),
            min_size=0 if calls else 1, max_size=2))
        turns.append(Turn("assistant", said + calls))
        if calls:
            turns.append(Turn("tool", [ToolResult(call.id, [Text(draw(words))], kind=call.kind)
                                       for call in calls]))
        turns.append(Turn("user", [draw(st.one_of(
            st.builds(Text, words), st.just(Image(url="https://example.com/a.png")),
            st.just(Image(data="aGk=", media_type="image/png"))))]))
    if draw(st.booleans()):
        turns.append(Turn("system", [Text(draw(words))]))
        turns.append(Turn("user", [Text(draw(words))]))
    choice = draw(st.none() | st.sampled_from([ToolChoice("auto"), ToolChoice("none"),
                                               ToolChoice("required")]))
    if defined and draw(st.booleans()):
        choice = ToolChoice("tool", draw(st.sampled_from(defined)).name)
    return Request(
        model="m", system=[Text(draw(words))] if draw(st.booleans()) else [], turns=turns,
        tools=defined, tool_choice=choice if defined else None,
        parallel_tool_calls=draw(st.none() | st.booleans()) if defined else None,
        max_output_tokens=draw(st.none() | st.integers(1, 10 ** 6)),
        temperature=draw(st.none() | st.sampled_from([0.0, 0.5, 1.0])),
        stream=draw(st.booleans()),
        reasoning=draw(st.none() | st.builds(Reasoning, st.sampled_from(["low", "high"]),
                                             summary=st.none() | st.just("auto"))),
        output_format=draw(st.none() | st.just(OutputFormat("json_object"))
                           | st.just(OutputFormat("json_schema", {"type": "object"}, "a",
                                                  True))),
        user=draw(st.none() | names), previous_response_id=draw(st.none() | st.just("resp_1")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_a_request_round_trips_through_the_responses_body(request: Request) -> None:
    body = CODEC.write_request(request, model="m")
    assert body["store"] is False
    back = CODEC.read_request(body)
    # the body says what the form said: messages, tools, calls with their ids, the rest
    system = "\n\n".join(part.text for part in request.system)
    assert back.system == ([Text(system)] if system else [])
    assert back.turns == request.turns
    assert back.tools == request.tools
    assert back.tool_choice == request.tool_choice
    assert (back.parallel_tool_calls, back.max_output_tokens, back.temperature, back.stream,
            back.output_format, back.user, back.previous_response_id) == (
        request.parallel_tool_calls, request.max_output_tokens, request.temperature,
        request.stream, request.output_format, request.user, request.previous_response_id)
    assert back.reasoning == request.reasoning
    assert request.dropped == [] and back.dropped == (
        ["include"] if request.reasoning is not None else [])
    # and the Responses body written again is the same body
    assert CODEC.write_request(back, model="m") == body


def one_refusal(parts: list) -> list:
    """Refusals side by side are one (as a stream, whose refusal deltas have no index)."""
    merged: list = []
    for part in parts:
        if isinstance(part, Refusal) and merged and isinstance(merged[-1], Refusal):
            merged[-1] = Refusal(merged[-1].text + part.text)
        else:
            merged.append(part)
    return merged


@st.composite
def replies(draw: st.DrawFn) -> tuple[Reply, Request]:
    defined = draw(tools())
    parts: list = draw(st.lists(st.one_of(
        st.builds(Text, words), st.builds(Refusal, words),
        st.builds(Thinking, words, encrypted=st.none() | st.text("abc", min_size=1))),
        max_size=4).map(one_refusal))
    calls = [ToolCall(f"call_{n}_{draw(ids)}", tool.name,
                      draw(words) if tool.kind == "custom" else draw(arguments), tool.kind)
             for n, tool in enumerate(draw(st.lists(st.sampled_from(defined), max_size=3)))] \
        if defined else []
    parts += calls
    stop = draw(st.sampled_from(["length", "filter"])) if draw(st.booleans()) \
        else ("tool" if calls else "end")
    usage = draw(st.none() | st.builds(
        Usage, st.integers(0, 10 ** 6), st.integers(0, 10 ** 5), st.integers(0, 1000),
        st.integers(0, 100), st.integers(0, 1000)))
    reply = Reply(id="resp_" + draw(names), model="target", parts=parts, stop=stop,
                  usage=usage, created=draw(st.integers(0, 2 ** 31)))
    return reply, Request(model="alias", tools=defined)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies())
def test_a_reply_round_trips_through_the_response_object(case: tuple[Reply, Request]) -> None:
    reply, request = case
    written = CODEC.write_reply(reply, request)
    Response.model_validate(written)
    back = CODEC.read_reply(written)
    assert (back.id, back.stop, back.usage, back.created) == (
        reply.id, reply.stop, reply.usage, reply.created)
    assert back.model == "alias"  # the caller's name for it
    assert back.parts == reply.parts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies(), st.booleans())
def test_any_stream_the_writer_writes_is_the_reply_the_sdk_reads(
        case: tuple[Reply, Request], interleave: bool) -> None:
    reply, request = case
    check_stream_matches_reply(reply, request, interleave=interleave)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies())
def test_a_stream_written_then_read_is_the_reply(case: tuple[Reply, Request]) -> None:
    """The writer's frames through the reader (a Responses target's stream): the same
    texts, thoughts, calls and usage, in order."""
    reply, request = case
    events = read_stream(sse_events(write_stream(request, events_of(reply))))
    assert isinstance(events[0], Begin) and events[0].id == reply.id
    assert events[-1] == Finish(reply.stop, reply.usage)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "".join(p.text for p in reply.parts if isinstance(p, Text))
    begun = [(e.id, e.name, e.kind) for e in events if isinstance(e, ToolCallBegin)]
    assert begun == [(p.id, p.name, p.kind) for p in reply.parts if isinstance(p, ToolCall)]
    for index, call in enumerate(p for p in reply.parts if isinstance(p, ToolCall)):
        assert "".join(e.fragment for e in events if isinstance(e, ToolArgumentsDelta)
                       and e.index == index) == call.arguments
