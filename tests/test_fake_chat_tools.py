"""The fake's chat completions (venice and openai modes) call tools and reason as the providers
do, so that agents whose requests the gateway translates to chat can be driven through it:
tool calls (JSON and streamed), the turn answering a tool's result, reasoning_content, usage
in both modes, and the checks the real APIs make of a conversation with tool calls."""

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from llm_gateway.testing.fake_chat_reply import chat_call_id
from llm_gateway.testing.fake_content import fake_tool_arguments
from llm_gateway.testing.fake_upstream import (
    DEFAULT_FAKE_API_KEY,
    FAKE_THINKING_TEXT,
    THINKING_TOKENS,
    TOOL_CALL_HEADER,
    TOOL_CALL_TOKENS,
    WORDS_PER_CHUNK,
    FakeUpstream,
    fake_cost,
    fake_reply_chunk,
    fake_reply_text,
    running_fake_upstream,
)

# The fake upstream alone, no store: the second pass (Postgres and Redis) adds nothing.
pytestmark = pytest.mark.slow_once

AUTH = {"authorization": f"Bearer {DEFAULT_FAKE_API_KEY}"}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "days": {"type": "integer"}},
                  "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                            "parameters": WEATHER_SCHEMA}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris"}]  # 6 words
PROMPT_WORDS = 6
CHAT = {"model": "llama-3.3-70b", "messages": QUESTION, "tools": [WEATHER, CLOCK]}
CALL_WEATHER = {**AUTH, TOOL_CALL_HEADER: "get_weather"}
WEATHER_ARGUMENTS = json.dumps(fake_tool_arguments(WEATHER_SCHEMA))  # {"city": "fake"}


@pytest.fixture(scope="module")
def _venice_server() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream() as served:
        yield served


@pytest.fixture(scope="module")
def _openai_server() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="openai")) as served:
        yield served


@pytest.fixture
def venice(_venice_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    _venice_server[0].reset()
    return _venice_server


@pytest.fixture
def openai_mode(_openai_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    _openai_server[0].reset()
    return _openai_server


@pytest.fixture(params=["venice", "openai"])
def either(request: pytest.FixtureRequest, venice, openai_mode) -> tuple[FakeUpstream, str]:
    return venice if request.param == "venice" else openai_mode


def post(url: str, body: dict[str, object], headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers)


def stream_chunks(url: str, body: dict[str, object],
                  headers: dict[str, str] = AUTH) -> list[dict[str, object]]:
    """Every chunk of a chat stream, parsed, after checking that it ends with [DONE]."""
    response = post(url, {**body, "stream": True}, headers)
    assert response.status_code == 200, response.text
    frames = [frame.removeprefix("data: ") for frame in response.text.split("\n\n") if frame]
    assert frames[-1] == "[DONE]"
    return [json.loads(frame) for frame in frames[:-1]]


def deltas(chunks: list[dict[str, object]]) -> list[dict[str, object]]:
    return [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]  # type: ignore[index]


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=DEFAULT_FAKE_API_KEY, max_retries=0)


def answered(call_id: str, result: str = "sunny") -> list[dict[str, object]]:
    """The conversation after the weather call, answered."""
    call = {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": WEATHER_ARGUMENTS}}
    return [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result}]


# ---- tool calls -------------------------------------------------------------------------

def test_the_header_makes_a_json_answer_call_the_tool(venice):
    _, url = venice
    response = post(url, CHAT, CALL_WEATHER)
    assert response.status_code == 200, response.text
    completion = response.json()
    [choice] = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": chat_call_id(CHAT), "type": "function",
                        "function": {"name": "get_weather", "arguments": WEATHER_ARGUMENTS}}]}
    assert json.loads(WEATHER_ARGUMENTS) == {"city": "fake"}
    assert choice["message"]["tool_calls"][0]["id"].startswith("call_")
    assert completion["usage"] == {
        "prompt_tokens": PROMPT_WORDS, "completion_tokens": TOOL_CALL_TOKENS,
        "total_tokens": PROMPT_WORDS + TOOL_CALL_TOKENS,
        "cost": fake_cost(PROMPT_WORDS, TOOL_CALL_TOKENS)}


def test_without_the_header_or_tools_the_reply_is_text(either):
    _, url = either
    plain = post(url, CHAT).json()["choices"][0]
    assert (plain["message"], plain["finish_reason"]) == (
        {"role": "assistant", "content": fake_reply_text(8)}, "stop")
    unknown = post(url, CHAT, {**AUTH, TOOL_CALL_HEADER: "get_stock"})
    assert unknown.status_code == 400
    assert "get_stock" in json.dumps(unknown.json())


def test_call_ids_are_the_requests_own_and_one_per_choice(venice):
    _, url = venice
    again = [post(url, CHAT, CALL_WEATHER).json()["choices"][0]["message"]["tool_calls"][0]["id"]
             for _ in range(2)]
    assert again == [chat_call_id(CHAT)] * 2
    body = {**CHAT, "n": 2}
    ids = [choice["message"]["tool_calls"][0]["id"]
           for choice in post(url, body, CALL_WEATHER).json()["choices"]]
    assert ids == [chat_call_id(body, 0), chat_call_id(body, 1)] and len(set(ids)) == 2
    assert chat_call_id(body) != chat_call_id(CHAT)


def test_a_tool_call_and_its_answer_through_the_sdk(either):
    """An agent's loop: the call, its result sent back, and a text answer that ends the turn
    although the header still asks for the tool."""
    fake, url = either
    client = sdk(url)
    first = client.chat.completions.create(
        model="llama-3.3-70b", messages=QUESTION, tools=[WEATHER, CLOCK],  # type: ignore[arg-type,list-item]
        extra_headers={TOOL_CALL_HEADER: "get_weather"})
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content is None
    assert (call.type, call.function.name) == ("function", "get_weather")  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "fake"}  # type: ignore[union-attr]

    second = client.chat.completions.create(
        model="llama-3.3-70b", messages=answered(call.id), tools=[WEATHER, CLOCK],  # type: ignore[arg-type,list-item]
        extra_headers={TOOL_CALL_HEADER: "get_weather"})
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == fake_reply_text(8)
    assert not second.choices[0].message.tool_calls
    # The prompt counts the call's arguments and the result: 6 + 2 + 1 words.
    assert second.usage is not None and second.usage.prompt_tokens == PROMPT_WORDS + 3
    assert fake.requests[-1].json["messages"][-1]["tool_call_id"] == call.id


@pytest.mark.parametrize(("choice", "headers", "called"), [
    ("required", AUTH, "get_weather"),  # forced: the first tool
    ("required", {**AUTH, TOOL_CALL_HEADER: "get_time"}, "get_time"),
    ({"type": "function", "function": {"name": "get_time"}}, AUTH, "get_time"),
    ({"type": "function", "function": {"name": "get_time"}}, CALL_WEATHER, "get_time"),
    ("none", CALL_WEATHER, None),
    ("auto", CALL_WEATHER, "get_weather"),
    ("auto", AUTH, None),
])
def test_tool_choice_forces_names_or_forbids_a_call(either, choice, headers, called):
    _, url = either
    message = post(url, {**CHAT, "tool_choice": choice}, headers).json()["choices"][0]["message"]
    names = [call["function"]["name"] for call in message.get("tool_calls", [])]
    assert names == ([called] if called else [])
    if called == "get_time":
        arguments = message["tool_calls"][0]["function"]["arguments"]
        assert json.loads(arguments) == {"zone": "UTC"}  # no required: every property


def test_a_forced_call_answers_even_a_tool_result(either):
    _, url = either
    body = {**CHAT, "messages": answered("call_1"), "tool_choice": "required"}
    message = post(url, body).json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_streamed_tool_call_is_openais_shape(openai_mode):
    fake, url = openai_mode
    body = {**CHAT, "stream_options": {"include_usage": True}}
    chunks = stream_chunks(url, body, CALL_WEATHER)
    call_id = chat_call_id({**body, "stream": True})
    first, *fragments, finish = deltas(chunks)
    assert first == {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": call_id, "type": "function",
         "function": {"name": "get_weather", "arguments": ""}}]}
    assert len(fragments) >= 2
    assert all(list(delta) == ["tool_calls"] and delta["tool_calls"][0]["index"] == 0
               and set(delta["tool_calls"][0]) == {"index", "function"} for delta in fragments)
    assert "".join(delta["tool_calls"][0]["function"]["arguments"]
                   for delta in fragments) == WEATHER_ARGUMENTS
    assert finish == {}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": PROMPT_WORDS, "completion_tokens": TOOL_CALL_TOKENS,
        "total_tokens": PROMPT_WORDS + TOOL_CALL_TOKENS}
    assert len({chunk["id"] for chunk in chunks}) == 1
    # The call's first delta and each fragment are paced as content chunks.
    assert len(fake.requests[-1].chunk_sent_at) == 1 + len(fragments)


@pytest.mark.parametrize(("mode", "include_usage", "usage_expected"), [
    ("venice", False, True), ("openai", False, False), ("openai", True, True)])
def test_a_streamed_call_ends_with_usage_by_the_modes_rules(venice, openai_mode, mode,
                                                           include_usage, usage_expected):
    _, url = venice if mode == "venice" else openai_mode
    body = {**CHAT, "stream_options": {"include_usage": include_usage}}
    chunks = stream_chunks(url, body, CALL_WEATHER)
    usage = [chunk["usage"] for chunk in chunks if "usage" in chunk]
    assert bool(usage) is usage_expected
    if usage and mode == "venice":
        assert usage[0]["cost"] == fake_cost(PROMPT_WORDS, TOOL_CALL_TOKENS)


def test_the_sdk_reassembles_a_streamed_call(either):
    _, url = either
    client = sdk(url)
    with client.chat.completions.stream(
        model="llama-3.3-70b", messages=QUESTION, tools=[WEATHER],  # type: ignore[arg-type,list-item]
        extra_headers={TOOL_CALL_HEADER: "get_weather"},
    ) as stream:
        completion = stream.get_final_completion()
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == WEATHER_ARGUMENTS  # type: ignore[union-attr]
    assert call.id.startswith("call_")


def test_every_choice_streams_its_own_call(venice):
    _, url = venice
    body = {**CHAT, "n": 2}
    chunks = stream_chunks(url, body, CALL_WEATHER)
    heads = {chunk["choices"][0]["index"]: chunk["choices"][0]["delta"]["tool_calls"][0]["id"]
             for chunk in chunks if chunk["choices"]
             and "id" in chunk["choices"][0]["delta"].get("tool_calls", [{}])[0]}
    streamed = {**body, "stream": True}
    assert heads == {0: chat_call_id(streamed, 0), 1: chat_call_id(streamed, 1)}
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 2 * TOOL_CALL_TOKENS


def test_max_tokens_below_a_tool_call_leaves_it_out(either):
    _, url = either
    choice = post(url, {**CHAT, "max_tokens": TOOL_CALL_TOKENS - 1},
                  CALL_WEATHER).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": ""}
    fits = post(url, {**CHAT, "max_completion_tokens": TOOL_CALL_TOKENS}, CALL_WEATHER).json()
    assert fits["choices"][0]["finish_reason"] == "tool_calls"
    assert fits["usage"]["completion_tokens"] == TOOL_CALL_TOKENS


def test_a_cap_cutting_plain_text_keeps_the_fakes_stop(either):
    _, url = either
    completion = post(url, {**CHAT, "max_tokens": 3 * WORDS_PER_CHUNK}).json()
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["choices"][0]["message"]["content"] == fake_reply_text(3)
    assert completion["usage"]["completion_tokens"] == 3 * WORDS_PER_CHUNK


# ---- reasoning --------------------------------------------------------------------------

def test_venice_reasons_when_asked_with_reasoning_content(venice):
    _, url = venice
    body = {**CHAT, "reasoning_effort": "medium"}
    completion = post(url, body).json()
    [choice] = completion["choices"]
    assert choice["message"] == {"role": "assistant", "content": fake_reply_text(8),
                                 "reasoning_content": FAKE_THINKING_TEXT}
    completion_tokens = THINKING_TOKENS + 8 * WORDS_PER_CHUNK
    assert completion["usage"] == {
        "prompt_tokens": PROMPT_WORDS, "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_WORDS + completion_tokens,
        "cost": fake_cost(PROMPT_WORDS, completion_tokens),
        "completion_tokens_details": {"reasoning_tokens": THINKING_TOKENS}}
    as_object = post(url, {**CHAT, "reasoning": {"effort": "low"}}).json()
    assert as_object["choices"][0]["message"]["reasoning_content"] == FAKE_THINKING_TEXT


def test_venice_streams_reasoning_before_the_content(venice):
    fake, url = venice
    chunks = stream_chunks(url, {**CHAT, "reasoning_effort": "high"},
                           {**AUTH, "x-fake-chunks": "2"})
    role, *paced, finish = deltas(chunks)
    assert role == {"role": "assistant", "content": ""}
    reasoning = [delta["reasoning_content"] for delta in paced if "reasoning_content" in delta]
    assert "".join(reasoning) == FAKE_THINKING_TEXT and len(reasoning) == 2
    assert paced[len(reasoning):] == [{"content": fake_reply_chunk(0)},
                                      {"content": fake_reply_chunk(1)}]
    assert finish == {} and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": THINKING_TOKENS}
    assert chunks[-1]["usage"]["completion_tokens"] == THINKING_TOKENS + 2 * WORDS_PER_CHUNK
    assert len(fake.requests[-1].chunk_sent_at) == 4


def test_reasoning_then_a_tool_call(venice):
    _, url = venice
    body = {**CHAT, "reasoning_effort": "low"}
    message = post(url, body, CALL_WEATHER).json()["choices"][0]["message"]
    assert message["reasoning_content"] == FAKE_THINKING_TEXT
    assert message["content"] is None and message["tool_calls"][0]["id"] == chat_call_id(body)
    streamed = deltas(stream_chunks(url, body, CALL_WEATHER))
    assert streamed[0] == {"role": "assistant", "content": None}
    kinds = [next(iter(delta)) for delta in streamed[1:-1]]
    assert kinds[:2] == ["reasoning_content"] * 2 and set(kinds[2:]) == {"tool_calls"}
    assert streamed[3]["tool_calls"][0]["id"] == chat_call_id({**body, "stream": True})


def test_the_sdk_reads_venices_reasoning_content(venice):
    _, url = venice
    completion = sdk(url).chat.completions.create(
        model="llama-3.3-70b", messages=QUESTION, reasoning_effort="low")  # type: ignore[arg-type]
    assert completion.choices[0].message.model_extra == {"reasoning_content": FAKE_THINKING_TEXT}
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == THINKING_TOKENS


@pytest.mark.parametrize(("extra", "reasoning_tokens"), [
    ({}, None),
    ({"reasoning_effort": "none"}, None),
    ({"reasoning_effort": "low", "venice_parameters": {"disable_thinking": True}}, None),
    ({"reasoning_effort": "low", "venice_parameters": {"strip_thinking_response": True}},
     THINKING_TOKENS),
])
def test_venice_reasoning_off_or_stripped(venice, extra, reasoning_tokens):
    """No reasoning unless asked; disable_thinking forbids it; strip_thinking_response keeps
    the tokens and drops the text."""
    _, url = venice
    completion = post(url, {**CHAT, **extra}).json()
    assert completion["choices"][0]["message"] == {"role": "assistant",
                                                   "content": fake_reply_text(8)}
    details = completion["usage"].get("completion_tokens_details")
    assert details == (None if reasoning_tokens is None
                       else {"reasoning_tokens": reasoning_tokens})
    assert completion["usage"]["completion_tokens"] == (
        (reasoning_tokens or 0) + 8 * WORDS_PER_CHUNK)


def test_openai_bills_reasoning_without_sending_it(openai_mode):
    _, url = openai_mode
    body = {**CHAT, "reasoning_effort": "low", "stream_options": {"include_usage": True}}
    completion = post(url, body).json()
    assert completion["choices"][0]["message"] == {"role": "assistant",
                                                   "content": fake_reply_text(8)}
    assert completion["usage"]["completion_tokens"] == THINKING_TOKENS + 8 * WORDS_PER_CHUNK
    assert completion["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": THINKING_TOKENS}
    chunks = stream_chunks(url, body)
    assert not any("reasoning_content" in delta for delta in deltas(chunks))
    assert chunks[-1]["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": THINKING_TOKENS}


def test_max_tokens_counts_reasoning_first(either):
    _, url = either
    nothing = post(url, {**CHAT, "reasoning_effort": "low",
                         "max_tokens": THINKING_TOKENS - 1}).json()
    assert nothing["choices"][0]["finish_reason"] == "length"
    assert nothing["choices"][0]["message"] == {"role": "assistant", "content": ""}
    assert nothing["usage"]["completion_tokens"] == 0
    some = post(url, {**CHAT, "reasoning_effort": "low",
                      "max_tokens": THINKING_TOKENS + 2 * WORDS_PER_CHUNK}).json()
    assert some["choices"][0]["finish_reason"] == "length"
    assert some["choices"][0]["message"]["content"] == fake_reply_text(2)
    assert some["usage"]["completion_tokens"] == THINKING_TOKENS + 2 * WORDS_PER_CHUNK
    no_call = post(url, {**CHAT, "reasoning_effort": "low",
                         "max_tokens": THINKING_TOKENS + TOOL_CALL_TOKENS - 1},
                   CALL_WEATHER).json()
    assert no_call["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in no_call["choices"][0]["message"]


# ---- strictness and validation ----------------------------------------------------------

def test_the_agent_fields_are_taken_in_both_modes(either):
    _, url = either
    body = {**CHAT, "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning_effort": "low", "stream_options": {"include_usage": True},
            "response_format": {"type": "text"}, "stop": ["\n\n"], "user": "agent-1",
            "max_completion_tokens": 1000}
    assert post(url, body).status_code == 200
    assert post(url, {**body, "stream": True}).status_code == 200


def test_each_mode_refuses_the_others_reasoning_fields(venice, openai_mode):
    _, venice_url = venice
    _, openai_url = openai_mode
    assert post(venice_url, {**CHAT, "reasoning": {"effort": "low"}}).status_code == 200
    refused = post(openai_url, {**CHAT, "reasoning": {"effort": "low"}})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "Unrecognized request argument supplied: reasoning"
    assert post(openai_url, {**CHAT, "venice_parameters": {}}).status_code == 400


def test_an_unknown_effort_is_refused(venice, openai_mode):
    _, venice_url = venice
    _, openai_url = openai_mode
    openai_refusal = post(openai_url, {**CHAT, "reasoning_effort": "max"})
    assert openai_refusal.status_code == 400
    assert openai_refusal.json()["error"] == {
        "message": "Invalid value: 'max'. Supported values are: 'none', 'minimal', 'low', "
                   "'medium', 'high', and 'xhigh'.",
        "type": "invalid_request_error", "param": "reasoning_effort", "code": "invalid_value"}
    assert post(venice_url, {**CHAT, "reasoning_effort": "max"}).status_code == 200
    venice_refusal = post(venice_url, {**CHAT, "reasoning_effort": "extreme"})
    assert venice_refusal.status_code == 400
    [issue] = venice_refusal.json()["issues"]
    assert (issue["code"], issue["path"]) == ("invalid_enum_value", ["reasoning_effort"])


def test_a_tool_message_must_answer_a_preceding_call(venice, openai_mode):
    _, venice_url = venice
    _, openai_url = openai_mode
    stray = [*QUESTION, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    message = ("Invalid parameter: messages with role 'tool' must be a response to a "
               "preceeding message with 'tool_calls'.")
    refused = post(openai_url, {**CHAT, "messages": stray})
    assert refused.status_code == 400
    assert refused.json() == {"error": {"message": message, "type": "invalid_request_error",
                                        "param": "messages.[1].role", "code": None}}
    with pytest.raises(openai.BadRequestError, match="preceeding message"):
        sdk(openai_url).chat.completions.create(model="gpt-4o", messages=stray)  # type: ignore[arg-type]
    venice_refused = post(venice_url, {**CHAT, "messages": stray})
    assert venice_refused.status_code == 400
    assert venice_refused.json() == {"error": message}

    # A user message between the call and the result breaks the run of tool messages.
    interrupted = answered("call_1")
    interrupted.insert(2, {"role": "user", "content": "and?"})
    assert post(venice_url, {**CHAT, "messages": interrupted}).status_code == 400


def test_a_tool_message_must_name_a_call_of_that_message(either):
    fake, url = either
    wrong = answered("call_1")
    wrong[-1] = {**wrong[-1], "tool_call_id": "call_2"}
    refused = post(url, {**CHAT, "messages": wrong})
    assert refused.status_code == 400
    message = ("Invalid parameter: 'tool_call_id' of 'call_2' not found in 'tool_calls' of "
               "previous message.")
    if fake.usage_mode == "openai":
        assert refused.json()["error"]["message"] == message
        assert refused.json()["error"]["param"] == "messages.[2].tool_call_id"
    else:
        assert refused.json() == {"error": message}


@pytest.mark.parametrize(("call", "missing"), [
    ({"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}, "id"),
    ({"id": "call_1", "type": "function"}, "function"),
    ({"id": "call_1", "type": "function", "function": {"arguments": "{}"}}, "function.name"),
])
def test_an_assistant_call_needs_its_id_and_function(venice, openai_mode, call, missing):
    _, venice_url = venice
    _, openai_url = openai_mode
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]
    refused = post(openai_url, {**CHAT, "messages": messages})
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": f"Missing required parameter: 'messages[1].tool_calls[0].{missing}'.",
        "type": "invalid_request_error", "param": f"messages.[1].tool_calls.[0].{missing}",
        "code": "missing_required_parameter"}
    venice_refused = post(venice_url, {**CHAT, "messages": messages})
    assert venice_refused.status_code == 400
    [issue] = venice_refused.json()["issues"]
    assert issue["path"] == ["messages", 1, "tool_calls", 0, *missing.split(".")]


def test_openai_wants_every_call_answered(venice, openai_mode):
    _, venice_url = venice
    _, openai_url = openai_mode
    unanswered = [*answered("call_1")[:2], {"role": "user", "content": "never mind"}]
    refused = post(openai_url, {**CHAT, "messages": unanswered})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].endswith(
        "The following tool_call_ids did not have response messages: call_1")
    assert refused.json()["error"]["param"] == "messages.[1].role"
    assert post(venice_url, {**CHAT, "messages": unanswered}).status_code == 200
    assert post(openai_url, {**CHAT, "messages": answered("call_1")}).status_code == 200


def test_openai_refuses_tool_choice_without_tools(openai_mode):
    _, url = openai_mode
    body = {"model": "gpt-4o", "messages": QUESTION, "tool_choice": "auto"}
    refused = post(url, body)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tool_choice"
    assert post(url, {**body, "tool_choice": None}).status_code == 200
