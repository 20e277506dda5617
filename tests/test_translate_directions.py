"""Translations ACROSS protocols, for each direction a caller's request is sent in: chat to
messages, messages to chat, responses to chat, responses to messages, and chat, messages and
responses to gemini. The codecs' own tests (tests/test_translate_<name>.py) round-trip one
protocol through the hub form; here each direction is checked end to end:

1. a conversation the caller sends, translated to the target's body and read back from it,
   keeps its system text, its turns' text, its tool calls (names, arguments as JSON, ids),
   its tool results (content, the ids of their calls) and its tools;
2. a target's answer streamed and translated event by event says to the caller what the
   same answer says translated whole: the same text, thinking, tool calls, stop reason and
   usage (each side accumulated as the caller's SDK does: the openai SDK's
   ChatCompletionStreamState, the anthropic SDK's accumulate_event, the Responses
   stream's ``response.completed``);
3. a documented provider example (tests/recorded/, and Google's in the Gemini test) through
   the Translation, a few key fields of the body and the answer asserted.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from llm_gateway.translate import Translation, codec
from llm_gateway.translate.form import (
    Begin,
    Event,
    Finish,
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
    Usage,
)
from tests.test_translate_gemini import DOC_ANSWER, DOC_STREAM

# Pure translation, no store: the second pass (Postgres and Redis) adds nothing.
pytestmark = pytest.mark.slow_once

RECORDED = Path(__file__).parent / "recorded"

# (caller, target): every direction a caller's request is translated in.
DIRECTIONS = [("chat", "messages"), ("messages", "chat"), ("responses", "chat"),
              ("responses", "messages"), ("chat", "gemini"), ("messages", "gemini"),
              ("responses", "gemini")]
IDS = [f"{caller}->{target}" for caller, target in DIRECTIONS]
FLAGS_ERRORS = {"messages", "gemini"}  # the protocols whose tool results say a call failed
FAST = settings(max_examples=40, deadline=None)

# ---- strategies: a conversation and an answer in the hub form -------------------------------

_text = st.text(st.sampled_from('aZ 9"\\\n\u00e9\u4e2d\U0001f600<>{}'), min_size=1,
                max_size=16).filter(str.strip)
_names = st.sampled_from(["get_weather", "run_shell", "read_file", "search"])
_scalar = (st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text)
_json_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(_text, inner, max_size=3), max_leaves=5)
_arguments = st.dictionaries(st.sampled_from(["path", "query", "n", "flags", "city"]),
                             _json_value, max_size=3).map(json.dumps)
_schema = st.builds(
    lambda props, required: {"type": "object", "properties": props,
                             **({"required": sorted(props)[:1]} if required and props else {})},
    st.dictionaries(st.sampled_from(["path", "query", "n", "city"]),
                    st.sampled_from([{"type": "string"}, {"type": "integer"},
                                     {"type": "boolean"},
                                     {"type": "array", "items": {"type": "string"}}]),
                    max_size=3),
    st.booleans())


# A tool's output: words, or a JSON object (which Gemini's functionResponse holds as one).
_result = _text | st.builds(json.dumps, st.dictionaries(_text, _scalar, min_size=1, max_size=2),
                           separators=st.sampled_from([(",", ":"), (", ", ": ")]),
                           ensure_ascii=st.booleans())


@st.composite
def conversations(draw: st.DrawFn, errors: bool, pieces: bool) -> Request:
    """A system text, a first user turn, then exchanges: the assistant's text (before or
    after its calls) and/or parallel tool calls (1-3, ids unique), the results of those
    calls, maybe the user's next words; function tools with simple schemas and a
    tool_choice among them. ``errors``: results may be failed calls (only Anthropic and
    Gemini have the flag; chat and Responses name it dropped, and their callers cannot say
    it). ``pieces``: a result may be several text blocks (a Responses caller's output is
    one string)."""
    names = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    tools = [Tool(name, draw(st.none() | _text), draw(_schema)) for name in names]
    words = st.lists(_text.map(Text), min_size=1, max_size=2)
    turns = [Turn("user", draw(words))]
    ordinal = 0
    for _ in range(draw(st.integers(0, 3))):
        calls = []
        for _ in range(draw(st.integers(0, 3))):
            calls.append(ToolCall(f"call_{ordinal:04d}", draw(st.sampled_from(names)),
                                  draw(_arguments)))
            ordinal += 1
        said = [Text(draw(_text))] if not calls or draw(st.booleans()) else []
        turns.append(Turn("assistant", said + calls if draw(st.booleans()) else calls + said))
        output = st.lists(_result.map(Text), min_size=1, max_size=2 if pieces else 1)
        if calls:
            turns.append(Turn("tool", [ToolResult(call.id, draw(output),
                                                  errors and draw(st.booleans()))
                                       for call in calls]))
        if not calls or draw(st.booleans()):
            turns.append(Turn("user", draw(words)))
    choice = draw(st.sampled_from([None, ToolChoice("auto"), ToolChoice("none"),
                                   ToolChoice("required"), ToolChoice("tool", names[0])]))
    system = draw(st.lists(_text.map(Text), max_size=2))
    return Request(model="caller-model", system=system, turns=turns, tools=tools,
                   tool_choice=choice, max_output_tokens=draw(st.integers(256, 8192)))


@st.composite
def replies(draw: st.DrawFn, thinking: bool) -> Reply:
    """An answer: maybe thinking (with a signature), text, tool calls, a stop reason that
    fits them, usage with cache and reasoning tokens."""
    parts: list = []
    if thinking and draw(st.booleans()):
        # base64, as Gemini's thoughtSignature is bytes (its writer leaves out one that is not)
        parts.append(Thinking(draw(_text), signature=draw(st.sampled_from(["c2lnLWFiYw==",
                                                                           None]))))
    if draw(st.booleans()):
        parts.append(Text(draw(_text)))
    calls = draw(st.integers(0, 3))
    parts += [ToolCall(f"call_{n}", draw(_names), draw(_arguments)) for n in range(calls)]
    if not parts or draw(st.booleans()):
        parts.append(Text(draw(_text)))
    stop = "tool" if calls else draw(st.sampled_from(["end", "length", "stop_sequence",
                                                      "filter"]))
    read, write = draw(st.integers(0, 5000)), draw(st.integers(0, 5000))
    output = draw(st.integers(1, 5000))
    usage = Usage(read + write + draw(st.integers(1, 5000)), output, read, write,
                  draw(st.integers(0, output)))
    return Reply("answer-1", "target-model", parts, stop,
                 "</end>" if stop == "stop_sequence" else None, usage)


def prompts(usage: Usage | None) -> st.SearchStrategy[Usage | None]:
    """What a target may say of the prompt at its stream's start (Anthropic's
    message_start): nothing, or the input's counts."""
    if usage is None:
        return st.none()
    return st.sampled_from([None, Usage(usage.input_tokens, 1, usage.cache_read_tokens,
                                        usage.cache_write_tokens)])


def fragments(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at ``cuts`` (positions, any order), no piece empty."""
    marks = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(marks) if b > a]


def events_of(reply: Reply, cuts: list[int], prompt: Usage | None) -> list[Event]:
    """The events a target's reader would say ``reply`` in, its text and arguments cut into
    fragments; the prompt's usage at the start, the whole usage at the end."""
    events: list[Event] = [Begin(reply.id, reply.model, prompt)]
    calls = 0
    for index, part in enumerate(reply.parts):
        if isinstance(part, Text):
            events += [TextDelta(piece, index) for piece in fragments(part.text, cuts)]
        elif isinstance(part, Thinking):
            events += [ThinkingDelta(piece, index=index) for piece in fragments(part.text, cuts)]
            if part.signature:
                events.append(ThinkingDelta(signature=part.signature, index=index))
        elif isinstance(part, ToolCall):
            events.append(ToolCallBegin(calls, part.id, part.name))
            events += [ToolArgumentsDelta(calls, piece)
                       for piece in fragments(part.arguments, cuts)]
            calls += 1
    events.append(Finish(reply.stop, reply.usage, reply.stop_sequence))
    return events


def payloads(raw: bytes) -> list[dict]:
    """The JSON of every SSE data line, in order (chat's ``[DONE]`` left out)."""
    return [json.loads(line[len("data: "):]) for line in raw.decode().split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


# ---- the normaliser: what a conversation says, in no protocol's spelling --------------------


def _output(result: ToolResult) -> object:
    """A tool result's text as one string (chat's tool message is one: its writer joins the
    blocks with a blank line), a JSON object as its value (Gemini's functionResponse holds
    the object, not its spelling)."""
    text = "\n\n".join(part.text for part in result.content if isinstance(part, Text))
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, dict) else text


def essence(request: Request, *, by_position: bool = False) -> dict:
    """What must survive a translation, with what protocols legitimately differ on made
    equal (and nothing else):

    - consecutive turns of one role are one turn, a tool turn a user's (Anthropic and
      Gemini merge them: a tool's results and the user's next words are one user message
      there, read back as two turns);
    - a turn's text is its Text parts' texts in order, apart from its tool calls (chat
      holds an assistant's text before its calls; a string or one text block is one Text);
    - the system text is its parts joined by a blank line (Responses' ``instructions`` is
      one string, written so);
    - a tool call's arguments and a JSON-object result compare as parsed JSON;
    - ``by_position``: a tool call's id is its ordinal in the conversation and a result's
      the ordinal of the call it answers (Gemini matches a result to its call by name and
      order, and a Gemini id may be made up: the ids are compared by position there).
    """
    ordinals: dict[str, int] = {}
    merged: list[dict] = []
    for turn in request.turns:
        role = "user" if turn.role == "tool" else turn.role
        if not merged or merged[-1]["role"] != role:
            merged.append({"role": role, "text": [], "calls": [], "results": []})
        into = merged[-1]
        for part in turn.parts:
            if isinstance(part, Text):
                into["text"].append(part.text)
            elif isinstance(part, ToolCall):
                ordinals.setdefault(part.id, len(ordinals))
                into["calls"].append((ordinals[part.id] if by_position else part.id,
                                      part.name, json.loads(part.arguments or "{}")))
            elif isinstance(part, ToolResult):
                into["results"].append((ordinals.get(part.call_id) if by_position
                                        else part.call_id, _output(part), part.is_error))
            else:
                into.setdefault("other", []).append(part)
    return {"system": "\n\n".join(text.text for text in request.system),
            "turns": merged,
            "tools": [(tool.name, tool.description, tool.parameters) for tool in request.tools],
            "tool_choice": request.tool_choice}


@pytest.mark.parametrize(("caller", "target"), DIRECTIONS, ids=IDS)
@FAST
@given(data=st.data())
def test_a_request_translated_there_and_back_keeps_messages_tools_and_calls(
        caller: str, target: str, data: st.DataObject) -> None:
    request = data.draw(conversations(errors={caller, target} <= FLAGS_ERRORS,
                                      pieces=caller != "responses"))
    by_position = target == "gemini"
    payload = codec(caller).write_request(request, model="caller-model")
    translation = Translation(caller, target, payload)
    assert translation.dropped == []
    said = essence(translation.request, by_position=by_position)
    assert said == essence(request, by_position=by_position)  # the caller's body says it all
    body = translation.payload("target-model")
    back = codec(target).read_request(body)
    assert essence(back, by_position=by_position) == said
    assert translation.dropped == []


# ---- the caller's answer, whole or accumulated from its stream ------------------------------


def chat_view(answer: dict) -> dict:
    message = answer["choices"][0]["message"]
    usage = answer.get("usage") or {}
    return {"text": message.get("content") or "",
            "thinking": message.get("reasoning_content") or "",
            "calls": [(call["id"], call["function"]["name"],
                       json.loads(call["function"]["arguments"] or "{}"))
                      for call in message.get("tool_calls") or ()],
            "stop": answer["choices"][0]["finish_reason"],
            "usage": (usage.get("prompt_tokens"), usage.get("completion_tokens"),
                      usage.get("total_tokens"),
                      (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                      (usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))}


def messages_view(answer: dict) -> dict:
    blocks = answer["content"]
    usage = answer["usage"]
    return {"text": "".join(b["text"] for b in blocks if b["type"] == "text"),
            "thinking": "".join(b["thinking"] for b in blocks if b["type"] == "thinking"),
            "signatures": [b["signature"] for b in blocks if b["type"] == "thinking"],
            "calls": [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"],
            "stop": (answer["stop_reason"], answer.get("stop_sequence")),
            "usage": tuple(usage.get(key) or 0 for key in (
                "input_tokens", "output_tokens", "cache_read_input_tokens",
                "cache_creation_input_tokens"))}


def responses_view(answer: dict) -> dict:
    items = answer["output"]
    usage = answer.get("usage") or {}
    return {"text": "".join(c["text"] for item in items if item["type"] == "message"
                            for c in item["content"] if c["type"] == "output_text"),
            "thinking": "".join(s["text"] for item in items if item["type"] == "reasoning"
                                for s in item.get("summary") or ()),
            "encrypted": [item.get("encrypted_content") for item in items
                          if item["type"] == "reasoning"],
            "calls": [(item["call_id"], item["name"], json.loads(item["arguments"] or "{}"))
                      for item in items if item["type"] == "function_call"],
            "stop": (answer["status"], (answer.get("incomplete_details") or {}).get("reason")),
            "usage": (usage.get("input_tokens"), usage.get("output_tokens"),
                      usage.get("total_tokens"),
                      (usage.get("input_tokens_details") or {}).get("cached_tokens"),
                      (usage.get("output_tokens_details") or {}).get("reasoning_tokens"))}


def chat_accumulated(frames: bytes) -> dict:
    state = ChatCompletionStreamState()
    for payload in payloads(frames):
        for _ in state.handle_chunk(ChatCompletionChunk.model_validate(payload)):
            pass
    # The snapshot, not get_final_completion: that one refuses a "length" finish.
    answer = state.current_completion_snapshot.model_dump()
    # The SDK keeps what its model does not name (Venice's and DeepSeek's
    # reasoning_content) only on the chunks: gathered here by hand.
    answer["choices"][0]["message"]["reasoning_content"] = "".join(
        choice["delta"].get("reasoning_content") or "" for payload in payloads(frames)
        for choice in payload.get("choices") or ())
    return answer


def messages_accumulated(frames: bytes) -> dict:
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for payload in payloads(frames):
        event = construct_type(type_=RawMessageStreamEvent, value=payload)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return snapshot.model_dump()


def responses_accumulated(frames: bytes) -> dict:
    events = payloads(frames)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] in ("response.completed", "response.incomplete"), last["type"]
    return last["response"]


VIEWS = {"chat": (chat_view, chat_accumulated), "messages": (messages_view, messages_accumulated),
         "responses": (responses_view, responses_accumulated)}


@pytest.mark.parametrize(("caller", "target"), DIRECTIONS, ids=IDS)
@FAST
@given(data=st.data(), cuts=st.lists(st.integers(0, 64), max_size=4))
def test_a_stream_translated_event_by_event_says_what_the_whole_answer_says(
        caller: str, target: str, data: st.DataObject, cuts: list[int]) -> None:
    reply = data.draw(replies(thinking=True))
    names = sorted({part.name for part in reply.parts if isinstance(part, ToolCall)})
    request = Request(model="caller-model", turns=[Turn("user", [Text("go")])],
                      tools=[Tool(name, None, {"type": "object"}) for name in names],
                      stream=True, stream_usage=True, max_output_tokens=8192)
    translation = Translation(caller, target,
                              codec(caller).write_request(request, model="caller-model"))
    target_codec = codec(target)
    # The target answers the body it was sent (a chat target streams its usage because the
    # translation asked for it).
    asked = target_codec.read_request(translation.payload("target-model"))
    whole = translation.reply(target_codec.write_reply(reply, asked))
    writer = target_codec.stream_writer(asked)
    events = events_of(reply, cuts, data.draw(prompts(reply.usage)))
    target_frames = b"".join(writer.write(event) for event in events)
    stream = translation.stream()
    frames = b"".join(stream.feed(payload) for payload in payloads(target_frames))
    frames += stream.end()
    view, accumulated = VIEWS[caller]
    said = view(whole)
    assert view(accumulated(frames)) == said
    # and neither lost what the target said
    assert said["text"] == "".join(p.text for p in reply.parts if isinstance(p, Text))
    assert said["thinking"] == "".join(p.text for p in reply.parts if isinstance(p, Thinking))
    assert [call[1:] for call in said["calls"]] == [
        (p.name, json.loads(p.arguments)) for p in reply.parts if isinstance(p, ToolCall)]


# ---- golden: documented examples through the Translation, one per direction ----------------


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


# OpenAI's API reference, "Create chat completion" (function calling): the request.
CHAT_REQUEST = {
    "model": "gpt-4.1",
    "messages": [{"role": "user", "content": "What is the weather like in Boston today?"}],
    "tools": [{"type": "function", "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string",
                         "description": "The city and state, e.g. San Francisco, CA"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}}],
    "tool_choice": "auto",
}
# Google's documented function-calling answer and text stream, as the Gemini codec's tests
# have them.
GEMINI_ANSWER, GEMINI_STREAM = DOC_ANSWER, DOC_STREAM


def streamed(translation: Translation, target_payloads: list[dict]) -> bytes:
    stream = translation.stream()
    return b"".join(stream.feed(payload) for payload in target_payloads) + stream.end()


def test_chat_to_messages_documented() -> None:
    translation = Translation("chat", "messages", CHAT_REQUEST)
    body = translation.payload("claude-opus-4-6")
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "What is the weather like in Boston today?"}]}]
    assert body["tools"][0]["name"] == "get_current_weather"
    assert body["tools"][0]["input_schema"]["required"] == ["location"]
    assert body["tool_choice"] == {"type": "auto"} and body["max_tokens"] > 0
    answer = translation.reply(recorded("anthropic_tool_use_message.json"))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == (
        "I'll check the current weather in San Francisco for you.")
    [call] = choice["message"]["tool_calls"]
    assert call["id"] == "toolu_01A09q90qw90lq917835lq9"
    assert json.loads(call["function"]["arguments"]) == {"location": "San Francisco, CA",
                                                         "unit": "celsius"}
    assert answer["usage"]["prompt_tokens"] == 384
    # Anthropic's recorded tool stream, as the openai SDK accumulates it
    frames = streamed(Translation("chat", "messages", {**CHAT_REQUEST, "stream": True}),
                      payloads((RECORDED / "anthropic_stream_tool_use.sse").read_bytes()))
    view = chat_view(chat_accumulated(frames))
    assert view["stop"] == "tool_calls" and view["calls"][0][1] == "get_weather"


def test_messages_to_chat_documented() -> None:
    translation = Translation("messages", "chat", recorded("anthropic_tool_use_request.json"))
    body = translation.payload("gpt-4o-mini")
    assert [message["role"] for message in body["messages"]] == ["user", "assistant", "tool"]
    assert body["messages"][1]["tool_calls"][0]["id"] == "toolu_01A09q90qw90lq917835lq9"
    assert body["messages"][2] == {"role": "tool", "content": "15 degrees",
                                   "tool_call_id": "toolu_01A09q90qw90lq917835lq9"}
    assert body["tools"][0]["function"]["name"] == "get_weather"
    answer = translation.reply(recorded("openai_chat_completion.json"))
    assert answer["content"] == [{"type": "text", "text": "Hello!"}]
    assert answer["stop_reason"] == "end_turn"
    assert (answer["usage"]["input_tokens"], answer["usage"]["output_tokens"]) == (9, 2)
    frames = streamed(translation, payloads((RECORDED / "openai_stream_with_usage.sse")
                                            .read_bytes()))
    view = messages_view(messages_accumulated(frames))
    assert view["stop"] == ("end_turn", None) and view["text"]


def test_responses_to_chat_documented() -> None:
    documented = recorded("openai_responses_function_call.json")
    translation = Translation("responses", "chat", documented["request"])
    body = translation.payload("gpt-4o-mini")
    assert body["messages"] == [{"role": "user",
                                 "content": "What is the weather like in Paris today?"}]
    assert body["tools"][0]["function"]["strict"] is True
    answer = translation.reply(recorded("openai_chat_completion.json"))
    assert responses_view(answer)["text"] == "Hello!"
    assert answer["status"] == "completed" and answer["usage"]["total_tokens"] == 11


def test_responses_to_messages_documented() -> None:
    documented = recorded("openai_responses_function_call.json")
    translation = Translation("responses", "messages", documented["request"])
    body = translation.payload("claude-opus-4-6")
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "What is the weather like in Paris today?"}]
    assert body["tools"][0]["input_schema"]["additionalProperties"] is False
    answer = translation.reply(recorded("anthropic_tool_use_message.json"))
    view = responses_view(answer)
    assert view["text"] == "I'll check the current weather in San Francisco for you."
    assert view["calls"] == [("toolu_01A09q90qw90lq917835lq9", "get_weather",
                              {"location": "San Francisco, CA", "unit": "celsius"})]
    assert answer["usage"]["input_tokens"] == 384


def test_chat_to_gemini_documented() -> None:
    translation = Translation("chat", "gemini", CHAT_REQUEST)
    body = translation.payload("gemini-2.5-flash")
    assert body["contents"] == [{"role": "user", "parts": [
        {"text": "What is the weather like in Boston today?"}]}]
    declaration = body["tools"][0]["functionDeclarations"][0]
    assert declaration["name"] == "get_current_weather"
    assert declaration["parametersJsonSchema"]["required"] == ["location"]
    answer = translation.reply(GEMINI_ANSWER)
    [call] = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_current_temperature" and call["id"]
    assert json.loads(call["function"]["arguments"]) == {"location": "London"}
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    # prompt 46 (20 of them cached), output: 8 said and 40 thought
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (46, 48)
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == 40


def test_messages_to_gemini_documented() -> None:
    translation = Translation("messages", "gemini", recorded("anthropic_tool_use_request.json"))
    body = translation.payload("gemini-2.5-flash")
    assert [content["role"] for content in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][1]["parts"][1]["functionCall"]["args"] == {
        "location": "San Francisco, CA", "unit": "celsius"}
    assert body["contents"][2]["parts"][0]["functionResponse"]["name"] == "get_weather"
    assert body["contents"][2]["parts"][0]["functionResponse"]["response"] == {
        "output": "15 degrees"}
    view = messages_view(messages_accumulated(streamed(translation, GEMINI_STREAM)))
    assert view["text"] == "The quick brown fox jumps."
    assert view["stop"] == ("end_turn", None)
    assert view["usage"][:2] == (9, 26)


def test_responses_to_gemini_documented() -> None:
    documented = recorded("openai_responses_function_call.json")
    translation = Translation("responses", "gemini", documented["request"])
    body = translation.payload("gemini-2.5-flash")
    assert body["contents"][0]["parts"] == [{"text": "What is the weather like in Paris today?"}]
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    answer = translation.reply(GEMINI_ANSWER)
    [(call_id, name, arguments)] = responses_view(answer)["calls"]
    assert call_id  # Gemini said none: the reader made one
    assert (name, arguments) == ("get_current_temperature", {"location": "London"})
    assert answer["usage"]["output_tokens_details"]["reasoning_tokens"] == 40
