"""The fake upstream's agent protocols, driven with the official SDKs pointed straight at it:
Anthropic's Messages API (anthropic mode) and OpenAI's Responses API (openai mode), asserting
what the real APIs guarantee."""

import asyncio
import json
import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from llm_gateway.testing.fake_upstream import (
    BILLING_SECRET,
    DEFAULT_FAKE_API_KEY,
    FAKE_CLAUDE_MODELS,
    FAKE_THINKING_TEXT,
    THINKING_TOKENS,
    TOOL_CALL_TOKENS,
    WORDS_PER_CHUNK,
    FakeUpstream,
    Fault,
    fake_reply_chunk,
    fake_reply_text,
    running_fake_upstream,
)

KEY = DEFAULT_FAKE_API_KEY
SECOND_KEY = "sk-fake-second-project"
CLAUDE = "claude-sonnet-5-5"
HELLO = [{"role": "user", "content": "Say hello to me"}]
PROMPT_WORDS = 4  # "Say hello to me"
FULL_REPLY_TOKENS = 8 * WORDS_PER_CHUNK
ANTHROPIC_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
OPENAI_AUTH = {"authorization": f"Bearer {KEY}"}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                      "unit": {"type": "string"}},
                     "required": ["city"]},
}
WEATHER_FUNCTION = {
    "type": "function", "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}


@pytest.fixture(scope="module")
def _anthropic_server() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="anthropic")) as served:
        yield served


@pytest.fixture(scope="module")
def _openai_server() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream(usage_mode="openai", extra_api_keys=[SECOND_KEY])
    with running_fake_upstream(fake) as served:
        yield served


@pytest.fixture
def claude(_anthropic_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    """The shared anthropic-mode fake (reset) and its URL (with the /v1 prefix)."""
    _anthropic_server[0].reset()
    _anthropic_server[0].max_request_bytes = 32 * 1024 * 1024
    return _anthropic_server


@pytest.fixture
def responses_api(_openai_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    _openai_server[0].reset()
    return _openai_server


def anthropic_client(url: str, api_key: str = KEY) -> anthropic.Anthropic:
    # The SDK adds /v1 itself; no retries, so injected faults surface at once.
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=api_key, max_retries=0)


def openai_client(url: str, api_key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0)


def named_events(raw: str) -> list[tuple[str, dict[str, object]]]:
    """Every SSE frame as (event name, parsed data); each frame must carry both."""
    events = []
    for frame in (frame for frame in raw.split("\n\n") if frame):
        name_line, data_line = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), frame
        events.append((name_line.removeprefix("event: "), json.loads(data_line[6:])))
    return events


# --- Anthropic: messages ------------------------------------------------------------------------


def test_sdk_message_has_the_reply_usage_and_a_request_id(claude):
    fake, url = claude
    raw = anthropic_client(url).messages.with_raw_response.create(
        model=CLAUDE, max_tokens=1024, messages=HELLO)
    message = raw.parse()

    assert re.fullmatch(r"msg_01\w{22}", message.id)
    assert (message.type, message.role, message.model) == ("message", "assistant", CLAUDE)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == fake_reply_text(8)
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == (PROMPT_WORDS, FULL_REPLY_TOKENS)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (0, 0)
    assert usage.cache_creation is not None
    assert usage.cache_creation.ephemeral_5m_input_tokens == 0
    assert usage.cache_creation.ephemeral_1h_input_tokens == 0
    assert usage.service_tier == "standard"
    assert re.fullmatch(r"req_011\w{21}", raw.headers["request-id"])
    assert "x-request-id" not in raw.headers  # that is OpenAI's name for it
    seen = fake.requests[-1]
    assert seen.path == "/v1/messages"
    # The SDK of API version 2026-10-21 sends the key as a Bearer token.
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["anthropic-version"] == "2026-10-21"


def test_stream_is_the_exact_event_sequence(claude):
    _, url = claude
    body = {"model": CLAUDE, "max_tokens": 1024, "messages": HELLO, "stream": True}
    headers = {**ANTHROPIC_HEADERS, "x-fake-chunks": "3"}
    response = httpx.post(f"{url}/messages", json=body, headers=headers)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = named_events(response.text)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == PROMPT_WORDS
    assert start["usage"]["output_tokens"] == 1  # a placeholder; message_delta has the count
    assert start["usage"]["cache_read_input_tokens"] == 0
    assert events[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    assert [data["delta"] for _, data in events[3:6]] == [
        {"type": "text_delta", "text": fake_reply_chunk(index)} for index in range(3)]
    delta = events[7][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3 * WORDS_PER_CHUNK
    assert delta["usage"]["input_tokens"] == PROMPT_WORDS


def test_sdk_stream_helper_and_raw_stream(claude):
    _, url = claude
    client = anthropic_client(url)
    with client.messages.stream(model=CLAUDE, max_tokens=1024, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == fake_reply_text(8) == final.content[0].text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (PROMPT_WORDS,
                                                                     FULL_REPLY_TOKENS)
    assert final.stop_reason == "end_turn"

    events = list(client.messages.create(model=CLAUDE, max_tokens=1024, messages=HELLO,
                                         stream=True))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    assert events[-2].type == "message_delta"


def test_async_client_creates_and_streams(claude):
    _, url = claude

    async def converse() -> tuple[str, str, int]:
        client = anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=KEY,
                                          max_retries=0)
        message = await client.messages.create(model=CLAUDE, max_tokens=1024, messages=HELLO)
        async with client.messages.stream(model=CLAUDE, max_tokens=1024,
                                          messages=HELLO) as stream:
            streamed = "".join([text async for text in stream.text_stream])
            usage = (await stream.get_final_message()).usage
        await client.close()
        return message.content[0].text, streamed, usage.output_tokens

    text, streamed, output_tokens = asyncio.run(converse())
    assert text == streamed == fake_reply_text(8)
    assert output_tokens == FULL_REPLY_TOKENS


def test_input_tokens_exclude_the_cached_ones(claude):
    _, url = claude
    client = anthropic_client(url)
    system = [{"type": "text", "text": "You are a terse assistant", "cache_control":
               {"type": "ephemeral"}}]  # 5 words, so a prompt of 9
    headers = {"x-fake-cache-read-tokens": "3", "x-fake-cache-write-tokens": "2",
               "x-fake-cache-write-1h-tokens": "1"}
    message = client.messages.create(model=CLAUDE, max_tokens=1024, system=system,
                                     messages=HELLO, extra_headers=headers)
    usage = message.usage
    assert usage.cache_read_input_tokens == 3
    assert usage.cache_creation_input_tokens == 3
    assert usage.cache_creation is not None
    assert (usage.cache_creation.ephemeral_5m_input_tokens,
            usage.cache_creation.ephemeral_1h_input_tokens) == (2, 1)
    assert usage.input_tokens == 9 - 3 - 3  # the prompt is input + cache reads + cache writes

    with client.messages.stream(model=CLAUDE, max_tokens=1024, system=system, messages=HELLO,
                                extra_headers={"x-fake-cache-read-tokens": "1000"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(event for event in events if event.type == "message_start")
    assert start.message.usage.cache_read_input_tokens == 9  # never more than the prompt
    assert start.message.usage.input_tokens == 0
    assert final.usage.cache_read_input_tokens == 9 and final.usage.input_tokens == 0

    refused = httpx.post(f"{url}/messages", json={"model": CLAUDE, "max_tokens": 5,
                                                  "messages": HELLO},
                         headers={**ANTHROPIC_HEADERS, "x-fake-cache-read-tokens": "-1"})
    assert refused.status_code == 400


def test_a_tool_call_and_its_result(claude):
    fake, url = claude
    client = anthropic_client(url)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = client.messages.create(model=CLAUDE, max_tokens=1024, messages=question,
                                  tools=[WEATHER_TOOL],
                                  extra_headers={"x-fake-tool-call": "get_weather"})
    [tool_use] = call.content
    assert tool_use.type == "tool_use"
    assert re.fullmatch(r"toolu_01\w{22}", tool_use.id)
    assert (tool_use.name, tool_use.input) == ("get_weather", {"city": "fake"})
    assert call.stop_reason == "tool_use"
    assert call.usage.output_tokens == TOOL_CALL_TOKENS

    with client.messages.stream(model=CLAUDE, max_tokens=1024, messages=question,
                                tools=[WEATHER_TOOL],
                                extra_headers={"x-fake-tool-call": "get_weather"}) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    pieces = [event.delta.partial_json for event in events
              if event.type == "content_block_delta"]
    assert pieces[0] == "" and json.loads("".join(pieces)) == {"city": "fake"}
    assert streamed.content[0].input == {"city": "fake"}  # the SDK put the pieces together
    assert streamed.stop_reason == "tool_use"

    answered = [*question, {"role": "assistant", "content": call.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                              "content": "sunny and warm"}]}]
    reply = client.messages.create(model=CLAUDE, max_tokens=1024, messages=answered,
                                   tools=[WEATHER_TOOL],
                                   extra_headers={"x-fake-tool-call": "get_weather"})
    assert reply.content[0].type == "text" and reply.stop_reason == "end_turn"
    # 6 words asked, the call's input as JSON ('{"city":' '"fake"}'), 3 words of result
    assert reply.usage.input_tokens == 6 + 2 + 3
    assert fake.requests[-1].json["messages"][-1]["content"][0]["type"] == "tool_result"


def test_tool_choice_forces_or_forbids_a_call(claude):
    _, url = claude
    client = anthropic_client(url)
    forced = client.messages.create(model=CLAUDE, max_tokens=1024, messages=HELLO,
                                    tools=[WEATHER_TOOL],
                                    tool_choice={"type": "tool", "name": "get_weather"})
    assert forced.content[0].type == "tool_use"
    any_tool = client.messages.create(model=CLAUDE, max_tokens=1024, messages=HELLO,
                                      tools=[WEATHER_TOOL], tool_choice={"type": "any"})
    assert any_tool.stop_reason == "tool_use"
    forbidden = client.messages.create(model=CLAUDE, max_tokens=1024, messages=HELLO,
                                       tools=[WEATHER_TOOL], tool_choice={"type": "none"},
                                       extra_headers={"x-fake-tool-call": "get_weather"})
    assert forbidden.content[0].type == "text"
    with pytest.raises(anthropic.BadRequestError, match="x-fake-tool-call"):
        client.messages.create(model=CLAUDE, max_tokens=1024, messages=HELLO,
                               tools=[WEATHER_TOOL], extra_headers={"x-fake-tool-call": "nope"})


def test_thinking_blocks_come_first(claude):
    _, url = claude
    client = anthropic_client(url)
    thought = client.messages.create(model=CLAUDE, max_tokens=4096, messages=HELLO,
                                     thinking={"type": "enabled", "budget_tokens": 2048})
    assert [block.type for block in thought.content] == ["thinking", "text"]
    assert thought.content[0].thinking == FAKE_THINKING_TEXT
    assert thought.content[0].signature
    assert thought.usage.output_tokens == THINKING_TOKENS + FULL_REPLY_TOKENS

    with client.messages.stream(model=CLAUDE, max_tokens=4096, messages=HELLO,
                                thinking={"type": "enabled", "budget_tokens": 2048}) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
    assert deltas[:2] == ["thinking_delta", "signature_delta"]
    assert set(deltas[2:]) == {"text_delta"}

    # Claude Code's setting: adaptive thinking, its text omitted but signed.
    with client.messages.stream(model=CLAUDE, max_tokens=4096, messages=HELLO,
                                thinking={"type": "adaptive", "display": "omitted"}) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" not in deltas and deltas[0] == "signature_delta"
    assert final.content[0].type == "thinking"
    assert final.content[0].thinking == "" and final.content[0].signature


def test_max_tokens_is_honoured(claude):
    _, url = claude
    client = anthropic_client(url)
    cut = client.messages.create(model=CLAUDE, max_tokens=20, messages=HELLO)
    assert cut.content[0].text == fake_reply_text(2)
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 16)
    with client.messages.stream(model=CLAUDE, max_tokens=20, messages=HELLO) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 16)
    warm_up = client.messages.create(model=CLAUDE, max_tokens=0, messages=HELLO)
    assert (warm_up.content, warm_up.stop_reason, warm_up.usage.output_tokens) == (
        [], "max_tokens", 0)

    missing = httpx.post(f"{url}/messages", json={"model": CLAUDE, "messages": HELLO},
                         headers=ANTHROPIC_HEADERS)
    assert missing.status_code == 400
    assert missing.json()["error"] == {"type": "invalid_request_error",
                                       "message": "max_tokens: Field required"}


def test_claude_codes_own_request_is_accepted(claude):
    fake, url = claude
    # The body and headers Claude Code 2.1 sends (/work/shared/reference/agents-wire.md).
    beta = ("claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
            "effort-2025-11-24")
    headers = {"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01",
               "anthropic-beta": beta, "anthropic-dangerous-direct-browser-access": "true",
               "x-claude-code-session-id": "b6f5c3c2-0000-4000-8000-000000000000"}
    body = {
        "model": CLAUDE,
        "max_tokens": 128000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328"},
            {"type": "text", "text": "You are Claude Code", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Work carefully", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>"},
                                         {"type": "text", "text": "Say hello to me"}]},
            {"role": "system", "content": "The session continues."},
        ],
        "tools": [WEATHER_TOOL, {**WEATHER_TOOL, "name": "Bash"}],
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
    }
    response = httpx.post(f"{url}/messages?beta=true", json=body, headers=headers)
    assert response.status_code == 200, response.text
    names = [name for name, _ in named_events(response.text)]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert fake.requests[-1].headers["anthropic-beta"] == beta
    assert fake.requests[-1].query == "beta=true"


def test_an_unknown_top_level_field_is_refused_as_anthropic_words_it(claude):
    _, url = claude
    body = {"model": CLAUDE, "max_tokens": 10, "messages": HELLO, "response_format": {}}
    response = httpx.post(f"{url}/messages", json=body, headers=ANTHROPIC_HEADERS)
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error",
                  "message": "response_format: Extra inputs are not permitted"},
        "request_id": response.headers["request-id"],
    }
    with pytest.raises(anthropic.BadRequestError, match="Extra inputs are not permitted"):
        anthropic_client(url).messages.create(model=CLAUDE, max_tokens=10, messages=HELLO,
                                              extra_body={"response_format": {}})


def test_sampling_parameters_depend_on_the_api_version(claude):
    _, url = claude
    body = {"model": CLAUDE, "max_tokens": 10, "messages": HELLO, "temperature": 1.0}
    old = httpx.post(f"{url}/messages", json=body, headers=ANTHROPIC_HEADERS)
    assert old.status_code == 200
    new = httpx.post(f"{url}/messages", json=body,
                     headers={**ANTHROPIC_HEADERS, "anthropic-version": "2026-10-21"})
    assert new.status_code == 400
    assert new.json()["error"]["message"] == "temperature: Extra inputs are not permitted"


@pytest.mark.parametrize(("version", "message"), [
    (None, "anthropic-version: header is required"),
    ("2024-01-01", 'anthropic-version: "2024-01-01" is not a valid version'),
])
def test_anthropic_version_is_required(claude, version, message):
    _, url = claude
    headers = {"x-api-key": KEY} | ({"anthropic-version": version} if version else {})
    response = httpx.get(f"{url}/models", headers=headers)
    assert response.status_code == 400
    assert response.json()["error"] == {"type": "invalid_request_error", "message": message}


def test_anthropic_authentication(claude):
    _, url = claude
    version = {"anthropic-version": "2023-06-01"}

    def answer(headers: dict[str, str]) -> httpx.Response:
        return httpx.get(f"{url}/models", headers={**version, **headers})

    assert answer({"x-api-key": KEY}).status_code == 200
    assert answer({"authorization": f"Bearer {KEY}"}).status_code == 200
    # With both, x-api-key counts.
    assert answer({"x-api-key": "wrong", "authorization": f"Bearer {KEY}"}).status_code == 401
    missing = answer({})
    assert missing.status_code == 401
    assert missing.json()["error"] == {"type": "authentication_error",
                                       "message": "x-api-key header is required"}
    assert missing.json()["request_id"] == missing.headers["request-id"]
    assert answer({"x-api-key": "wrong"}).json()["error"]["message"] == "invalid x-api-key"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(url, api_key="sk-wrong").models.list()


def test_count_tokens(claude):
    _, url = claude
    client = anthropic_client(url)
    counted = client.messages.count_tokens(model=CLAUDE, system="Be brief", messages=HELLO,
                                           tools=[WEATHER_TOOL])
    assert counted.input_tokens == 2 + PROMPT_WORDS
    message = client.messages.create(model=CLAUDE, max_tokens=10, system="Be brief",
                                     messages=HELLO)
    assert message.usage.input_tokens == counted.input_tokens
    refused = httpx.post(f"{url}/messages/count_tokens",
                         json={"model": CLAUDE, "messages": HELLO, "max_tokens": 10},
                         headers=ANTHROPIC_HEADERS)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "max_tokens: Extra inputs are not permitted"


def test_models_list_and_retrieve(claude):
    _, url = claude
    client = anthropic_client(url)
    every = [model.id for model in client.models.list()]
    assert every == [model.id for model in FAKE_CLAUDE_MODELS]
    assert [model.id for model in client.models.list(limit=2)] == every  # pages via after_id
    page = httpx.get(f"{url}/models?limit=2", headers=ANTHROPIC_HEADERS).json()
    assert page["has_more"] is True
    assert (page["first_id"], page["last_id"]) == (every[0], every[1])
    assert {model["type"] for model in page["data"]} == {"model"}
    assert all(model["display_name"] and model["created_at"].endswith("Z")
               for model in page["data"])
    assert client.models.retrieve(CLAUDE).display_name == "Claude Sonnet 5.5"
    with pytest.raises(anthropic.NotFoundError) as raised:
        client.models.retrieve("claude-nonexistent")
    assert raised.value.type == "not_found_error"


# --- Anthropic: errors and faults --------------------------------------------------------------


@pytest.mark.parametrize(("status", "error_type", "error_class"), [
    (400, "invalid_request_error", anthropic.BadRequestError),
    (401, "authentication_error", anthropic.AuthenticationError),
    (403, "permission_error", anthropic.PermissionDeniedError),
    (404, "not_found_error", anthropic.NotFoundError),
    (413, "request_too_large", anthropic.ContentTooLargeError),
    (429, "rate_limit_error", anthropic.RateLimitError),
    (500, "api_error", anthropic.InternalServerError),
    (529, "overloaded_error", anthropic.OverloadedError),
])
def test_faults_take_anthropics_shape_and_status(claude, status, error_type, error_class):
    fake, url = claude
    fake.push_fault(Fault(status=status, message="Injected"))
    with pytest.raises(error_class) as raised:
        anthropic_client(url).messages.create(model=CLAUDE, max_tokens=10, messages=HELLO)
    error = raised.value
    assert error.status_code == status
    assert error.body == {"type": "error", "error": {"type": error_type, "message": "Injected"},
                          "request_id": error.request_id}
    assert error.request_id and error.request_id.startswith("req_011")


def test_overloaded_is_an_internal_server_error_to_the_sdk(claude):
    fake, url = claude
    fake.push_fault(Fault(status=529, message="Overloaded"))
    with pytest.raises(anthropic.InternalServerError):
        anthropic_client(url).messages.create(model=CLAUDE, max_tokens=10, messages=HELLO)


def test_a_429_says_when_to_come_back(claude):
    fake, url = claude
    fake.push_fault(Fault(status=429, message="Number of request tokens has exceeded your "
                          "per-minute rate limit"))
    response = httpx.post(f"{url}/messages", json={"model": CLAUDE, "max_tokens": 5,
                                                   "messages": HELLO},
                          headers=ANTHROPIC_HEADERS)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "30"
    assert response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert response.headers["anthropic-ratelimit-input-tokens-limit"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                        response.headers["anthropic-ratelimit-tokens-reset"])
    fake.push_fault(Fault(status=429, retry_after="7"))
    assert httpx.get(f"{url}/models", headers=ANTHROPIC_HEADERS).headers["retry-after"] == "7"


def test_an_overload_inside_the_stream(claude):
    fake, url = claude
    fake.push_fault(Fault(inband_error="Overloaded"))
    body = {"model": CLAUDE, "max_tokens": 1024, "messages": HELLO, "stream": True}
    response = httpx.post(f"{url}/messages", json=body, headers=ANTHROPIC_HEADERS)
    assert response.status_code == 200
    events = named_events(response.text)
    assert [name for name, _ in events] == ["message_start", "error"]
    assert events[1][1]["error"] == {"type": "overloaded_error", "message": "Overloaded"}

    fake.push_fault(Fault(inband_error="Overloaded"))
    with pytest.raises(anthropic.APIStatusError) as raised, anthropic_client(url).messages.stream(
            model=CLAUDE, max_tokens=1024, messages=HELLO) as stream:
        list(stream)
    assert raised.value.type == "overloaded_error"

    # Without a stream: the error body, still after a 200.
    fake.push_fault(Fault(inband_error="Overloaded"))
    answer = httpx.post(f"{url}/messages", json={**body, "stream": False},
                        headers=ANTHROPIC_HEADERS)
    assert answer.status_code == 200
    assert answer.json() == {"type": "error", "request_id": answer.headers["request-id"],
                             "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_a_cut_stream(claude):
    fake, url = claude
    fake.push_fault(Fault(cut_after_chunks=2))
    body = {"model": CLAUDE, "max_tokens": 1024, "messages": HELLO, "stream": True}
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
            "POST", f"{url}/messages", json=body, headers=ANTHROPIC_HEADERS) as response:
        received.extend(line for line in response.iter_lines() if line)
    assert sum("text_delta" in line for line in received) == 2
    assert "event: message_stop" not in received
    assert len(fake.requests[-1].chunk_sent_at) == 2


def test_a_body_over_the_size_limit_is_request_too_large(claude):
    fake, url = claude
    fake.max_request_bytes = 1000
    with pytest.raises(anthropic.ContentTooLargeError) as raised:
        anthropic_client(url).messages.create(
            model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": "word " * 300}])
    assert raised.value.type == "request_too_large"


def test_paths_outside_and_unknown_to_the_api(claude):
    _, url = claude
    outside = httpx.get(url.removesuffix("/v1") + "/api/v1/models", headers=ANTHROPIC_HEADERS)
    assert outside.status_code == 404
    assert outside.json()["error"]["type"] == "not_found_error"
    assert outside.json()["request_id"] == outside.headers["request-id"]
    # OpenAI's paths are not Anthropic's: like any other path, the "billing" answer.
    chat = httpx.post(f"{url}/chat/completions", json={}, headers=ANTHROPIC_HEADERS)
    assert chat.json()["secret"] == BILLING_SECRET
    wrong_method = httpx.get(f"{url}/messages", headers=ANTHROPIC_HEADERS)
    assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")


# --- OpenAI: the Responses API -----------------------------------------------------------------


def test_sdk_response_has_the_reply_and_usage(responses_api):
    fake, url = responses_api
    raw = openai_client(url).responses.with_raw_response.create(model="gpt-5.5",
                                                                input="Say hello to me")
    response = raw.parse()
    assert re.fullmatch(r"resp_[0-9a-f]{48}", response.id)
    assert (response.object, response.status) == ("response", "completed")
    assert response.output_text == fake_reply_text(8)
    [message] = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (PROMPT_WORDS, FULL_REPLY_TOKENS)
    assert usage.total_tokens == PROMPT_WORDS + FULL_REPLY_TOKENS
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert raw.headers["x-request-id"].startswith("req_")
    assert fake.requests[-1].path == "/api/v1/responses"


def test_stream_events_are_numbered_from_zero(responses_api):
    _, url = responses_api
    events = list(openai_client(url).responses.create(
        model="gpt-5.5", input="Say hello to me", stream=True,
        extra_headers={"x-fake-chunks": "3"}))
    assert [event.type for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress"
    assert [event.delta for event in events[4:7]] == [fake_reply_chunk(i) for i in range(3)]
    assert events[7].text == fake_reply_text(3)
    completed = events[-1].response
    assert completed.status == "completed" and completed.usage is not None
    assert completed.usage.output_tokens == 3 * WORDS_PER_CHUNK
    assert completed.id == events[0].response.id


def test_stream_wire_format_names_every_event(responses_api):
    _, url = responses_api
    body = {"model": "gpt-5.5", "input": "Say hello to me", "stream": True}
    response = httpx.post(f"{url}/responses", json=body, headers=OPENAI_AUTH)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = named_events(response.text)  # no "data: [DONE]": every frame is a named event
    assert all(data["type"] == name for name, data in events)
    assert events[-1][0] == "response.completed"


def test_sdk_stream_helper(responses_api):
    _, url = responses_api
    with openai_client(url).responses.stream(model="gpt-5.5", input="Say hello to me") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == fake_reply_text(8)


def test_stored_responses_retrieve_list_and_delete(responses_api):
    _, url = responses_api
    client = openai_client(url)
    created = client.responses.create(model="gpt-5.5", input="Say hello to me")
    retrieved = client.responses.retrieve(created.id)
    assert (retrieved.id, retrieved.output_text, retrieved.store) == (
        created.id, created.output_text, True)
    [item] = client.responses.input_items.list(created.id)
    assert (item.type, item.role) == ("message", "user")
    assert item.content[0].text == "Say hello to me"

    deleted = httpx.delete(f"{url}/responses/{created.id}", headers=OPENAI_AUTH)
    assert deleted.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="gpt-5.5", input="Again", previous_response_id=created.id)
    assert raised.value.code == "previous_response_not_found"
    assert raised.value.param == "previous_response_id"
    assert raised.value.status_code == 400
    assert raised.value.body["message"] == f"Previous response with id '{created.id}' not found."


def test_input_items_order_and_pages(responses_api):
    _, url = responses_api
    client = openai_client(url)
    created = client.responses.create(model="gpt-5.5", input=[
        {"role": "developer", "content": "Be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"role": "user", "content": "two"},
    ])
    newest_first = list(client.responses.input_items.list(created.id))
    assert [item.content[0].text for item in newest_first] == ["two", "one", "Be brief"]
    oldest_first = list(client.responses.input_items.list(created.id, order="asc", limit=1))
    assert [item.content[0].text for item in oldest_first] == ["Be brief", "one", "two"]


def test_previous_response_id_carries_the_conversation(responses_api):
    _, url = responses_api
    client = openai_client(url)
    first = client.responses.create(model="gpt-5.5", input="one two three",
                                    instructions="Be very brief")
    assert first.usage is not None and first.usage.input_tokens == 3 + 3
    second = client.responses.create(model="gpt-5.5", input="four five",
                                     previous_response_id=first.id)
    # Instructions are not carried over; the previous input and output are.
    assert second.usage is not None
    assert second.usage.input_tokens == 3 + FULL_REPLY_TOKENS + 2
    assert second.previous_response_id == first.id
    counted = client.responses.input_tokens.count(model="gpt-5.5", input="four five",
                                                  previous_response_id=first.id)
    assert (counted.object, counted.input_tokens) == ("response.input_tokens",
                                                      second.usage.input_tokens)


def test_unstored_responses_cannot_be_found(responses_api):
    _, url = responses_api
    client = openai_client(url)
    unstored = client.responses.create(model="gpt-5.5", input="hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="gpt-5.5", input="x", previous_response_id=unstored.id)
    assert raised.value.code == "previous_response_not_found"


def test_each_key_has_its_own_responses(responses_api):
    _, url = responses_api
    mine = openai_client(url).responses.create(model="gpt-5.5", input="hi")
    theirs = openai_client(url, api_key=SECOND_KEY)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(mine.id)
    with pytest.raises(openai.BadRequestError) as raised:
        theirs.responses.create(model="gpt-5.5", input="x", previous_response_id=mine.id)
    assert raised.value.code == "previous_response_not_found"
    assert theirs.responses.create(model="gpt-5.5", input="x").status == "completed"


def test_function_calls_and_their_outputs(responses_api):
    _, url = responses_api
    client = openai_client(url)
    call = client.responses.create(model="gpt-5.5", input="Weather in Paris?",
                                   tools=[WEATHER_FUNCTION],
                                   extra_headers={"x-fake-tool-call": "get_weather"})
    [item] = call.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments) == {"city": "fake"}
    assert item.call_id.startswith("call_")
    assert call.usage is not None and call.usage.output_tokens == TOOL_CALL_TOKENS

    events = list(client.responses.create(model="gpt-5.5", input="Weather in Paris?",
                                          tools=[WEATHER_FUNCTION], stream=True,
                                          tool_choice={"type": "function",
                                                       "name": "get_weather"}))
    deltas = [event.delta for event in events
              if event.type == "response.function_call_arguments.delta"]
    [done] = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert "".join(deltas) == done.arguments == item.arguments

    answered = client.responses.create(
        model="gpt-5.5", previous_response_id=call.id, tools=[WEATHER_FUNCTION],
        input=[{"type": "function_call_output", "call_id": item.call_id,
                "output": "sunny and warm"}],
        extra_headers={"x-fake-tool-call": "get_weather"})
    assert answered.output_text == fake_reply_text(8)


def test_reasoning_items(responses_api):
    _, url = responses_api
    client = openai_client(url)
    response = client.responses.create(model="gpt-5.5", input="Say hello to me",
                                       reasoning={"effort": "medium", "summary": "auto"},
                                       include=["reasoning.encrypted_content"])
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.summary[0].text == FAKE_THINKING_TEXT
    assert reasoning.encrypted_content
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == THINKING_TOKENS
    assert response.usage.output_tokens == THINKING_TOKENS + FULL_REPLY_TOKENS
    events = [event.type for event in client.responses.create(
        model="gpt-5.5", input="hi", reasoning={"effort": "low", "summary": "auto"},
        stream=True)]
    assert "response.reasoning_summary_text.delta" in events
    plain = client.responses.create(model="gpt-5.5", input="hi", reasoning={"effort": "low"})
    assert plain.output[0].type == "reasoning" and plain.output[0].summary == []
    assert plain.output[0].encrypted_content is None


def test_max_output_tokens_makes_it_incomplete(responses_api):
    _, url = responses_api
    client = openai_client(url)
    cut = client.responses.create(model="gpt-5.5", input="Say hello to me",
                                  max_output_tokens=20)
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == fake_reply_text(2)
    assert cut.usage is not None and cut.usage.output_tokens == 16
    events = list(client.responses.create(model="gpt-5.5", input="hi", max_output_tokens=20,
                                          stream=True))
    assert events[-1].type == "response.incomplete"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="gpt-5.5", input="hi", max_output_tokens=10)
    assert raised.value.param == "max_output_tokens"


def test_max_tokens_is_an_unknown_parameter_to_responses(responses_api):
    _, url = responses_api
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(url).responses.create(model="gpt-5.5", input="hi",
                                            extra_body={"max_tokens": 100})
    assert raised.value.code == "unknown_parameter"
    assert raised.value.param == "max_tokens"
    assert raised.value.body["message"] == "Unknown parameter: 'max_tokens'."


def test_codex_clis_own_request_is_accepted(responses_api):
    fake, url = responses_api
    # The body Codex CLI 0.169 sends (/work/shared/reference/agents-wire.md).
    body = {
        "model": "gpt-5.5",
        "stream": True,
        "store": False,
        "instructions": "You are Codex",
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "Sandbox: workspace-write"}]},
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "Be careful"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Say hello to me"}]},
        ],
        "tools": [
            {**WEATHER_FUNCTION, "name": "shell"},
            {"type": "custom", "name": "apply_patch", "description": "Patch files",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
            {"type": "tool_search", "execution": "client"},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-thread",
        "text": {"verbosity": "low"},
        "client_metadata": {"x-codex-installation-id": "c0dex"},
    }
    headers = {**OPENAI_AUTH, "originator": "codex_exec", "session-id": "s",
               "x-codex-beta-features": "remote_compaction_v2"}
    response = httpx.post(f"{url}/responses", json=body, headers=headers)
    assert response.status_code == 200, response.text
    events = named_events(response.text)
    completed = events[-1][1]["response"]
    assert events[-1][0] == "response.completed"
    assert [item["type"] for item in completed["output"]] == ["reasoning", "message"]
    assert completed["output"][0]["encrypted_content"]
    assert completed["store"] is False and completed["text"]["verbosity"] == "low"
    # instructions 3, developer messages 2 + 2, the environment 1, the question 4
    assert completed["usage"]["input_tokens"] == 3 + 2 + 2 + 1 + PROMPT_WORDS
    assert fake.response_store.ids(KEY) == []  # store: false keeps nothing

    patch = httpx.post(f"{url}/responses", json={**body, "stream": False},
                       headers={**headers, "x-fake-tool-call": "apply_patch"}).json()
    call = patch["output"][-1]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert isinstance(call["input"], str)


def test_compact_answers_a_compaction(responses_api):
    _, url = responses_api
    client = openai_client(url)
    first = client.responses.create(model="gpt-5.5", input="one two three")
    compacted = client.responses.compact(model="gpt-5.5", previous_response_id=first.id,
                                         input=[{"role": "user", "content": "four"}])
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    assert compacted.output[-1].encrypted_content
    assert compacted.usage.input_tokens == 3 + FULL_REPLY_TOKENS + 1


def test_only_background_responses_can_be_cancelled(responses_api):
    _, url = responses_api
    client = openai_client(url)
    foreground = client.responses.create(model="gpt-5.5", input="hi")
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(foreground.id)

    slow = {"x-fake-chunk-delay-ms": "2000"}  # 8 chunks: 16 s of generation
    queued = client.responses.create(model="gpt-5.5", input="hi", background=True,
                                     extra_headers=slow)
    assert (queued.status, queued.output) == ("queued", [])
    assert client.responses.retrieve(queued.id).status == "in_progress"
    assert client.responses.cancel(queued.id).status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"

    quick = client.responses.create(model="gpt-5.5", input="hi", background=True)
    done = client.responses.retrieve(quick.id)
    assert (done.status, done.output_text) == ("completed", fake_reply_text(8))
    assert client.responses.cancel(quick.id).status == "completed"  # done already: unchanged


def test_faults_in_the_responses_api(responses_api):
    fake, url = responses_api
    client = openai_client(url)
    fake.push_fault(Fault(status=429, shape="openai", message="Rate limit reached"))
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="gpt-5.5", input="hi")

    fake.push_fault(Fault(inband_error="The server had an error"))
    events = list(client.responses.create(model="gpt-5.5", input="hi", stream=True))
    assert [event.type for event in events] == [
        "response.created", "response.in_progress", "error", "response.failed"]
    assert events[2].message == "The server had an error"
    assert events[3].response.status == "failed"
    assert events[3].response.error is not None
    assert events[3].response.error.code == "server_error"

    fake.push_fault(Fault(inband_error="The server had an error"))
    failed = client.responses.create(model="gpt-5.5", input="hi")
    assert failed.status == "failed"

    fake.push_fault(Fault(cut_after_chunks=2))
    body = {"model": "gpt-5.5", "input": "hi", "stream": True}
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
            "POST", f"{url}/responses", json=body, headers=OPENAI_AUTH) as response:
        received.extend(line for line in response.iter_lines() if line)
    assert sum(line == "event: response.output_text.delta" for line in received) == 2
    assert "event: response.completed" not in received


def test_responses_refuse_unknown_ids_and_methods(responses_api):
    _, url = responses_api
    missing = httpx.get(f"{url}/responses/resp_nope", headers=OPENAI_AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Response with id 'resp_nope' not found."
    listing = httpx.get(f"{url}/responses", headers=OPENAI_AUTH)
    assert (listing.status_code, listing.headers["allow"]) == (405, "POST")
    item = httpx.put(f"{url}/responses/resp_x", headers=OPENAI_AUTH)
    assert (item.status_code, item.headers["allow"]) == (405, "GET, DELETE")


# --- the existing modes -------------------------------------------------------------------------


def test_venice_mode_serves_no_responses_api():
    # Venice's own beta /responses is stateless and not imitated: the path is unimplemented, and
    # the fake answers it as any path it does not implement.
    with running_fake_upstream() as (_, url):
        answer = httpx.post(f"{url}/responses", json={"model": "m", "input": "hi"},
                            headers=OPENAI_AUTH)
        assert answer.json() == {"object": "billing", "secret": BILLING_SECRET}
        assert httpx.post(f"{url}/messages", json={}, headers=OPENAI_AUTH).json()["secret"]


def test_openai_mode_chat_completions_are_as_before(responses_api):
    _, url = responses_api
    assert url.endswith("/api/v1")  # the prefix it always had
    completion = openai_client(url).chat.completions.create(model="gpt-5.5", messages=HELLO)
    assert completion.choices[0].message.content == fake_reply_text(8)
    assert completion.usage is not None and completion.usage.prompt_tokens == PROMPT_WORDS
