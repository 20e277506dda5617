"""The gemini codec: Google's documented examples as golden fixtures, what crosses and what
is refused, the fake's stream read as its JSON answer reads, the google-genai SDK's types
parsing what the writers write, and a round trip (gemini -> form -> gemini) of any body."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gateway.providers import PROFILES, PROTOCOLS
from llm_gateway.providers.gemini import read_gemini
from llm_gateway.testing.fake_upstream import DEFAULT_FAKE_API_KEY, FakeUpstream
from llm_gateway.translate import codec, target_protocol
from llm_gateway.translate.form import (
    Begin,
    Failure,
    Finish,
    Image,
    OutputFormat,
    Reasoning,
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

genai_types = pytest.importorskip("google.genai.types")
GEMINI = codec("gemini")

# ai.google.dev/gemini-api/docs/function-calling: the documented REST request and answer.
DOC_TOOLS = [{"functionDeclarations": [{
    "name": "get_current_temperature",
    "description": "Gets the current temperature for a given location.",
    "parametersJsonSchema": {"type": "object", "properties": {"location": {
        "type": "string", "description": "The city name, e.g. San Francisco"}},
        "required": ["location"]}}]}]
DOC_REQUEST = {"contents": [{"role": "user",
                             "parts": [{"text": "What's the temperature in London?"}]}],
               "tools": DOC_TOOLS}
DOC_ANSWER = {
    "candidates": [{"content": {"parts": [{"functionCall": {
        "name": "get_current_temperature", "args": {"location": "London"}}}], "role": "model"},
        "finishReason": "STOP", "index": 0}],
    "usageMetadata": {"promptTokenCount": 46, "candidatesTokenCount": 8, "totalTokenCount": 94,
                      "thoughtsTokenCount": 40, "cachedContentTokenCount": 20},
    "modelVersion": "gemini-2.5-flash", "responseId": "mTEEaaSqL9Cr1dkPmfLM4Q0"}
# ai.google.dev/api/generate-content#method:-models.streamgeneratecontent: a text answer
# streamed, the usage in every chunk, the finish reason in the last.
DOC_STREAM = [
    {"candidates": [{"content": {"parts": [{"text": "The"}], "role": "model"}, "index": 0}],
     "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
     "modelVersion": "gemini-2.5-flash", "responseId": "r1"},
    {"candidates": [{"content": {"parts": [{"text": " quick brown fox"}], "role": "model"},
                     "index": 0}],
     "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4, "totalTokenCount": 13},
     "modelVersion": "gemini-2.5-flash", "responseId": "r1"},
    {"candidates": [{"content": {"parts": [{"text": " jumps."}], "role": "model"},
                     "finishReason": "STOP", "index": 0}],
     "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 6,
                       "totalTokenCount": 35, "thoughtsTokenCount": 20},
     "modelVersion": "gemini-2.5-flash", "responseId": "r1"},
]


def sdk_checks(body: dict) -> None:
    """The google-genai SDK's models (extra fields forbidden) take every part of ``body``."""
    for content in body["contents"]:
        genai_types.Content.model_validate(content)
    if "systemInstruction" in body:
        genai_types.Content.model_validate(body["systemInstruction"])
    for tool in body.get("tools", ()):
        genai_types.Tool.model_validate(tool)
    if "toolConfig" in body:
        genai_types.ToolConfig.model_validate(body["toolConfig"])
    if "generationConfig" in body:
        genai_types.GenerationConfig.model_validate(body["generationConfig"])
    assert set(body) <= {"contents", "systemInstruction", "tools", "toolConfig",
                         "generationConfig"}


def fold(events: list) -> Reply:
    """A stream's events as the whole answer they make."""
    begin, finish = events[0], events[-1]
    assert isinstance(begin, Begin) and isinstance(finish, Finish)
    parts: list = []
    for event in events[1:-1]:
        if isinstance(event, TextDelta):
            if parts and isinstance(parts[-1], Text):
                parts[-1].text += event.text
            else:
                parts.append(Text(event.text))
        elif isinstance(event, ThinkingDelta):
            parts.append(Thinking(event.text, event.signature))
        elif isinstance(event, ToolCallBegin):
            parts.append(ToolCall(event.id, event.name, ""))
        elif isinstance(event, ToolArgumentsDelta):
            parts[-1].arguments += event.fragment
    return Reply(begin.id, begin.model, parts, finish.stop, usage=finish.usage)


def read_stream(chunks: list[dict]) -> list:
    reader = GEMINI.stream_reader()
    events = [event for chunk in chunks for event in reader.feed(chunk)]
    return events + reader.end()


# ---- golden: Google's examples ---------------------------------------------------------------


def test_the_documented_function_call_answer_reads_as_a_tool_stop() -> None:
    reply = GEMINI.read_reply(DOC_ANSWER)
    assert reply == Reply("mTEEaaSqL9Cr1dkPmfLM4Q0", "gemini-2.5-flash", [ToolCall(
        "gcall_mTEEaaSqL9Cr1dkPmfLM4Q0_0", "get_current_temperature",
        '{"location": "London"}')], "tool",
        usage=Usage(46, 48, cache_read_tokens=20, reasoning_tokens=40))


def test_the_documented_request_reads_and_writes_back_as_it_was() -> None:
    request = GEMINI.read_request(DOC_REQUEST)
    assert request.tools == [Tool("get_current_temperature",
                                  "Gets the current temperature for a given location.",
                                  DOC_TOOLS[0]["functionDeclarations"][0]["parametersJsonSchema"])]
    assert GEMINI.write_request(request, model="gemini-2.5-flash") == DOC_REQUEST


def test_the_next_turn_answers_the_call_by_its_name_without_an_id_gemini_never_gave() -> None:
    call = GEMINI.read_reply(DOC_ANSWER).parts[0]
    request = Request("m", turns=[Turn("user", [Text("What's the temperature in London?")]),
                                  Turn("assistant", [call]),
                                  Turn("tool", [ToolResult(call.id, [Text('{"temp": 12}')])]),
                                  Turn("tool", [ToolResult(call.id, [Text("again")])])])
    body = GEMINI.write_request(request, model="gemini-2.5-flash")
    assert body["contents"][1:] == [
        {"role": "model", "parts": [{"functionCall": {"name": "get_current_temperature",
                                                      "args": {"location": "London"}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "get_current_temperature", "response": {"temp": 12}}},
            {"functionResponse": {"name": "get_current_temperature",
                                  "response": {"output": "again"}}}]}]
    sdk_checks(body)


def test_the_documented_stream_reads_as_its_whole_answer() -> None:
    events = read_stream(DOC_STREAM)
    assert events[0] == Begin("r1", "gemini-2.5-flash", Usage(input_tokens=9))
    assert events[-1] == Finish("end", Usage(9, 26, reasoning_tokens=20))
    assert fold(events).parts == [Text("The quick brown fox jumps.")]
    assert [event.index for event in events if isinstance(event, TextDelta)] == [0, 0, 0]


# ---- what crosses -----------------------------------------------------------------------------


def agent_request() -> Request:
    """What a chat or Messages caller's reader makes of an agent's turn."""
    return Request(
        "alias", system=[Text("You are terse.")],
        turns=[Turn("user", [Text("Look"), Image(data="iVBORw0KGgo=", media_type=None)]),
               Turn("system", [Text("Mind the tools.")]),
               Turn("assistant", [Thinking("I should call both.", signature="c2lnLTE="),
                                  ToolCall("toolu_1", "read", '{"path": "a"}'),
                                  ToolCall("toolu_2", "apply_patch", "*** Begin Patch",
                                           kind="custom")]),
               Turn("tool", [ToolResult("toolu_1", [Text("contents")]),
                             ToolResult("toolu_2", [Text("failed")], is_error=True,
                                        kind="custom")]),
               Turn("user", [Text("go on")])],
        tools=[Tool("read", "Reads a file", {"type": "object", "additionalProperties": False,
                                             "properties": {"path": {"type": "string"}}}),
               Tool("apply_patch", "Patches", kind="custom")],
        tool_choice=ToolChoice("tool", "read"), parallel_tool_calls=False,
        max_output_tokens=4096, temperature=0.2, top_p=0.9, stop=["END"],
        reasoning=Reasoning(effort="high"), output_format=OutputFormat(
            "json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}}),
        user="end-user-1")


def test_an_agents_request_keeps_what_gemini_can_say_and_names_what_it_drops() -> None:
    request = agent_request()
    body = GEMINI.write_request(request, model="gemini-2.5-pro")
    sdk_checks(body)
    assert body["systemInstruction"] == {"parts": [{"text": "You are terse."},
                                                   {"text": "Mind the tools."}]}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Look"}, {"inlineData": {
            "mimeType": "image/png", "data": "iVBORw0KGgo="}}]},
        {"role": "model", "parts": [
            {"text": "I should call both.", "thought": True, "thoughtSignature": "c2lnLTE="},
            {"functionCall": {"name": "read", "args": {"path": "a"}, "id": "toolu_1"}},
            {"functionCall": {"name": "apply_patch", "args": {"input": "*** Begin Patch"},
                              "id": "toolu_2"}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "read", "response": {"output": "contents"},
                                  "id": "toolu_1"}},
            {"functionResponse": {"name": "apply_patch", "response": {"error": "failed"},
                                  "id": "toolu_2"}},
            {"text": "go on"}]}]
    declarations = body["tools"][0]["functionDeclarations"]
    assert declarations[1] == {"name": "apply_patch", "description": "Patches",
                               "parametersJsonSchema": {
                                   "type": "object", "properties": {"input": {"type": "string"}},
                                   "required": ["input"]}}
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY",
                                                            "allowedFunctionNames": ["read"]}}
    assert body["generationConfig"] == {
        "maxOutputTokens": 4096, "temperature": 0.2, "topP": 0.9, "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "thinkingConfig": {"thinkingBudget": 4095, "includeThoughts": True}}  # below the cap
    assert request.dropped == ["user", "parallel_tool_calls"]
    GEMINI.write_request(request, model="gemini-2.5-pro")
    assert request.dropped == ["user", "parallel_tool_calls"]  # each name once


@pytest.mark.parametrize(("reasoning", "config"), [
    (Reasoning(enabled=False), {"thinkingBudget": 0}),
    (Reasoning(budget_tokens=3000), {"thinkingBudget": 3000, "includeThoughts": True}),
    (Reasoning(), {"thinkingBudget": -1, "includeThoughts": True}),
])
def test_thinking_budgets(reasoning: Reasoning, config: dict) -> None:
    body = GEMINI.write_request(Request("m", turns=[Turn("user", [Text("x")])],
                                        reasoning=reasoning), model="m")
    assert body["generationConfig"]["thinkingConfig"] == config


@pytest.mark.parametrize(("request_", "field"), [
    (Request("m", turns=[Turn("user", [Image(url="https://example.com/cat.png")])]),
     "image_url"),
    (Request("m", turns=[Turn("tool", [ToolResult("nope", [Text("x")])])]), "tool_result"),
    (Request("m", turns=[Turn("user", [Text("x")])], previous_response_id="resp_1"),
     "previous_response_id"),
])
def test_what_would_change_the_conversation_is_refused(request_: Request, field: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        GEMINI.write_request(request_, model="m")
    assert refused.value.field == field


def test_gemini_files_go_as_file_data() -> None:
    url = "https://generativelanguage.googleapis.com/v1beta/files/abc"
    body = GEMINI.write_request(Request("m", turns=[Turn("user", [
        Image(url=url, media_type="image/jpeg")])]), model="m")
    assert body["contents"][0]["parts"] == [{"fileData": {"mimeType": "image/jpeg",
                                                          "fileUri": url}}]


@pytest.mark.parametrize(("reason", "stop"), [
    ("STOP", "end"), ("MAX_TOKENS", "length"), ("SAFETY", "filter"), ("RECITATION", "filter"),
    ("PROHIBITED_CONTENT", "filter"), ("MALFORMED_FUNCTION_CALL", "end")])
def test_finish_reasons(reason: str, stop: str) -> None:
    body = {"candidates": [{"content": {"parts": [{"text": "x"}], "role": "model"},
                            "finishReason": reason}]}
    assert GEMINI.read_reply(body).stop == stop


def test_a_blocked_prompt_is_a_filter_stop() -> None:
    body = {"promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 5}}
    assert GEMINI.read_reply(body).stop == "filter"
    assert read_stream([body])[-1] == Finish("filter", Usage(input_tokens=5))


@pytest.mark.parametrize(("status", "code", "kind"), [
    ("RESOURCE_EXHAUSTED", 429, "rate_limit_error"), ("UNAVAILABLE", 503, "service_unavailable"),
    ("INVALID_ARGUMENT", 400, "invalid_request_error")])
def test_an_error_in_the_stream_is_a_failure(status: str, code: int, kind: str) -> None:
    reader = GEMINI.stream_reader()
    assert reader.feed({"error": {"code": code, "message": "no", "status": status}}) == [
        Failure("no", kind, code)]


def test_parallel_calls_stream_whole_with_the_signature_before_the_first() -> None:
    chunk = {"responseId": "R", "modelVersion": "gemini-3-pro", "candidates": [{"content": {
        "role": "model", "parts": [
            {"functionCall": {"name": "a", "args": {"x": 1}}, "thoughtSignature": "U0lH"},
            {"functionCall": {"name": "b", "args": {}}}]}, "finishReason": "STOP"}]}
    events = read_stream([chunk])
    assert events[1:-1] == [ThinkingDelta("", "U0lH", 0), ToolCallBegin(0, "gcall_R_0", "a"),
                            ToolArgumentsDelta(0, '{"x": 1}'),
                            ToolCallBegin(1, "gcall_R_1", "b"), ToolArgumentsDelta(1, "{}")]
    assert events[-1].stop == "tool"
    assert fold(events).parts == GEMINI.read_reply(chunk).parts
    # and back: the signature rides on the first call again, no made-up id goes with it
    assert GEMINI.write_reply(fold(events), Request("m"))["candidates"][0]["content"][
        "parts"] == chunk["candidates"][0]["content"]["parts"]


# ---- the writers' output as the SDK reads it ------------------------------------------------


def test_a_written_answer_and_stream_parse_with_the_sdk() -> None:
    reply = Reply("R", "gemini-2.5-flash", [Thinking("hm", "U0lH"), Text("Hello"),
                                            ToolCall("gcall_R_0", "f", '{"a": 1}')], "tool",
                  usage=Usage(10, 7, cache_read_tokens=4, reasoning_tokens=3))
    body = GEMINI.write_reply(reply, Request("m"))
    parsed = genai_types.GenerateContentResponse.model_validate(body)
    assert parsed.text == "Hello" and parsed.function_calls[0].args == {"a": 1}
    assert parsed.usage_metadata.thoughts_token_count == 3
    assert GEMINI.read_reply(body) == reply
    writer = GEMINI.stream_writer(Request("m"))
    frames = b"".join(writer.write(event) for event in [
        Begin("R", "gemini-2.5-flash"), ThinkingDelta("hm", "U0lH"), TextDelta("Hel"),
        TextDelta("lo"), ToolCallBegin(0, "gcall_R_0", "f"), ToolArgumentsDelta(0, '{"a"'),
        ToolArgumentsDelta(0, ": 1}"), Finish("tool", reply.usage)])
    chunks = [json.loads(frame[6:]) for frame in frames.split(b"\n\n") if frame]
    for chunk in chunks:
        genai_types.GenerateContentResponse.model_validate(chunk)
    assert fold(read_stream(chunks)) == reply
    failed = writer.fail(503, "service_unavailable", "upstream_stream_interrupted", "cut")
    assert json.loads(failed[6:]) == {"error": {"code": 503, "message": "cut",
                                                "status": "UNAVAILABLE"}}


# ---- the fake's stream equals its JSON answer ------------------------------------------------


def fake_answers(body: dict, headers: dict[str, str]) -> tuple[dict, list[dict]]:
    async def both() -> tuple[dict, list[dict]]:
        fake = FakeUpstream(usage_mode="gemini", chunk_count=3)
        transport = httpx.ASGITransport(app=fake)
        async with httpx.AsyncClient(transport=transport, base_url="http://f/v1beta") as client:
            sent = {"x-goog-api-key": DEFAULT_FAKE_API_KEY, **headers}
            whole = await client.post("/models/gemini-2.5-flash:generateContent", json=body,
                                      headers=sent)
            streamed = await client.post("/models/gemini-2.5-flash:streamGenerateContent",
                                         params={"alt": "sse"}, json=body, headers=sent)
        chunks = [json.loads(line[6:]) for line in streamed.text.split("\n\n") if line]
        return whole.json(), chunks

    return asyncio.run(both())


@pytest.mark.parametrize("headers", [{}, {"x-fake-tool-call": "get_current_temperature"}])
def test_the_fakes_stream_reads_as_its_json_answer(headers: dict[str, str]) -> None:
    request = agent_request()
    request.output_format = None
    request.tool_choice = None
    request.tools = [Tool("get_current_temperature", None, DOC_TOOLS[0]["functionDeclarations"][
        0]["parametersJsonSchema"])]
    request.turns = [Turn("user", [Text("What's the temperature in London?")])]
    body = GEMINI.write_request(request, model="gemini-2.5-flash")
    whole, chunks = fake_answers(body, headers)
    reply, streamed = GEMINI.read_reply(whole), fold(read_stream(chunks))
    for answer in (reply, streamed):  # the two answers' ids differ; nothing else may
        answer.id = ""
        for part in answer.parts:
            if isinstance(part, ToolCall):
                part.id = part.id.rsplit("_", 1)[-1]
    assert streamed == reply
    assert any(isinstance(part, Thinking) and part.text for part in reply.parts)
    assert reply.stop == ("tool" if headers else "end")
    facts = Facts()
    for chunk in chunks:
        read_gemini(facts, chunk)
    assert facts.done and facts.usage == PROFILES["gemini"].usage(whole)


class Facts:
    def __init__(self) -> None:
        self.response_id = self.model = self.error = self.usage = None
        self.finish_reasons: list[str] = []
        self.text_chars = 0
        self.done = False


def test_the_profile_and_its_protocol() -> None:
    profile = PROFILES["gemini"]
    assert "gemini" in PROTOCOLS and profile.protocols == frozenset({"gemini"})
    assert target_protocol("messages", profile.protocols) == "gemini"
    usage = profile.usage(DOC_ANSWER)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens,
            usage.cache_read_tokens, usage.reasoning_tokens) == (46, 48, 94, 20, 40)
    error = b'{"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}'
    assert json.loads(profile.error_body(error, 429)) == {"error": {
        "message": "Quota exceeded", "type": "rate_limit_error", "code": "RESOURCE_EXHAUSTED"}}
    assert profile.error_in(json.loads(error))["code"] == "RESOURCE_EXHAUSTED"


# ---- a round trip of any Gemini body ----------------------------------------------------------

_words = st.text(st.characters(codec="ascii", categories=("L", "N", "Zs")), min_size=1,
                 max_size=12)
_names = st.sampled_from(["read", "write", "search"])
_signature = st.none() | st.sampled_from(["c2ln", "c2lnMg=="])


def _with_signature(part: dict, signature: str | None) -> dict:
    return {**part, "thoughtSignature": signature} if signature else part


@st.composite
def _model_turn(draw: st.DrawFn) -> list[dict]:
    parts: list[dict] = []
    if draw(st.booleans()):
        parts.append(_with_signature({"text": draw(_words), "thought": True},
                                     draw(_signature)))
    for _ in range(draw(st.integers(0, 3))):
        call = {"name": draw(_names), "args": draw(st.dictionaries(
            _names, _words | st.integers(), max_size=2))}
        parts.append(_with_signature({"functionCall": call}, draw(_signature)))
    if not parts or draw(st.booleans()):
        parts.append(_with_signature({"text": draw(_words)}, draw(_signature)))
    return parts


_response = st.fixed_dictionaries({"output": _words}) | st.fixed_dictionaries(
    {"error": _words}) | st.dictionaries(st.sampled_from(["a", "b", "c"]), _words, min_size=2)


@st.composite
def gemini_bodies(draw: st.DrawFn) -> dict:
    contents: list[dict] = [{"role": "user", "parts": [{"text": draw(_words)}]}]
    for _ in range(draw(st.integers(0, 3))):
        model = draw(_model_turn())
        contents.append({"role": "model", "parts": model})
        user = [{"functionResponse": {"name": part["functionCall"]["name"],
                                      "response": draw(_response)}}
                for part in model if "functionCall" in part]
        if not user or draw(st.booleans()):
            user.append({"text": draw(_words)} if draw(st.booleans()) else {
                "inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}})
        contents.append({"role": "user", "parts": user})
    tools = [{"functionDeclarations": [
        {"name": name, "parametersJsonSchema": {"type": "object", "properties": {
            "a": {"type": "string"}}}} for name in ("read", "write", "search")]}]
    return {"contents": contents, "tools": tools,
            "systemInstruction": {"parts": [{"text": draw(_words)}]}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gemini_bodies())
def test_a_gemini_body_survives_the_form(body: dict) -> None:
    request = GEMINI.read_request(body)
    assert request.dropped == []
    written = GEMINI.write_request(request, model="gemini-2.5-flash")
    assert written == body
    sdk_checks(written)
