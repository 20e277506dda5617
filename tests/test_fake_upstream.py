"""The fake upstream, exercised over real sockets with httpx and the official openai SDK."""

import base64
import hmac
import itertools
import json
import logging
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import httpx
import openai
import pytest

from llm_gateway.testing import fake_app, fake_upstream
from llm_gateway.testing.fake_errors import OPENAI_CHAT_FIELDS, VENICE_CHAT_FIELDS
from llm_gateway.testing.fake_upstream import (
    BILLING_SECRET,
    DEFAULT_FAKE_API_KEY,
    FAKE_MODELS,
    WORDS_PER_CHUNK,
    FakeUpstream,
    Fault,
    RecordedRequest,
    fake_cost,
    fake_reply_chunk,
    fake_reply_text,
    running_fake_upstream,
)

AUTH = {"authorization": f"Bearer {DEFAULT_FAKE_API_KEY}"}
CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Say hello to me"}]}
PROMPT_WORDS = 4  # "Say hello to me"


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
    """The shared venice-mode fake, with no faults or history left over from other tests."""
    _venice_server[0].reset()
    return _venice_server


@pytest.fixture
def openai_mode(_openai_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    _openai_server[0].reset()
    return _openai_server


def sdk_client(base_url: str) -> openai.OpenAI:
    # No retries: the SDK would otherwise retry injected 429/5xx faults and honour Retry-After.
    return openai.OpenAI(base_url=base_url, api_key=DEFAULT_FAKE_API_KEY, max_retries=0)


def sse_payloads(raw: str) -> list[str]:
    """The data of every SSE frame, in order."""
    frames = [frame for frame in raw.split("\n\n") if frame]
    assert all(frame.startswith("data: ") for frame in frames), frames
    return [frame.removeprefix("data: ") for frame in frames]


def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    give_up_at = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up_at:
            return False
        time.sleep(0.005)
    return True


# --- chat completions ------------------------------------------------------------------------


def test_json_completion_has_deterministic_content_usage_and_venice_cost(venice):
    _, base_url = venice
    response = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH)

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    completion = response.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]+", completion["id"])
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "llama-3.3-70b"
    assert isinstance(completion["created"], int)
    [choice] = completion["choices"]
    assert choice["message"] == {"role": "assistant", "content": fake_reply_text(8)}
    assert choice["finish_reason"] == "stop"
    assert completion["usage"] == {
        "prompt_tokens": PROMPT_WORDS,
        "completion_tokens": 8 * WORDS_PER_CHUNK,
        "total_tokens": PROMPT_WORDS + 8 * WORDS_PER_CHUNK,
        "cost": fake_cost(PROMPT_WORDS, 8 * WORDS_PER_CHUNK),
    }
    assert 0 < completion["usage"]["cost"]["usd"] < 0.01


def test_sdk_completion_in_openai_mode_has_no_cost(openai_mode):
    _, base_url = openai_mode
    completion = sdk_client(base_url).chat.completions.create(
        model="qwen3-4b", messages=[{"role": "user", "content": "one two"}]
    )
    assert completion.choices[0].message.content == fake_reply_text(8)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 2
    assert "cost" not in completion.usage.model_dump()


def test_stream_wire_format(venice):
    _, base_url = venice
    headers = {**AUTH, "x-fake-chunks": "3"}
    with httpx.stream(
        "POST", f"{base_url}/chat/completions", json={**CHAT, "stream": True}, headers=headers
    ) as response:
        raw = response.read().decode()

    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    role, *contents, finish, usage_chunk = (json.loads(payload) for payload in payloads[:-1])
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert [chunk["choices"][0]["delta"]["content"] for chunk in contents] == [
        fake_reply_chunk(index) for index in range(3)
    ]
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["cost"] == fake_cost(PROMPT_WORDS, 3 * WORDS_PER_CHUNK)
    every_chunk = [role, *contents, finish, usage_chunk]
    assert {chunk["id"] for chunk in every_chunk} == {role["id"]}
    assert {chunk["object"] for chunk in every_chunk} == {"chat.completion.chunk"}


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("usage_mode", ["venice", "openai"])
def test_sdk_stream_usage_by_mode(venice, openai_mode, usage_mode, include_usage):
    _, base_url = venice if usage_mode == "venice" else openai_mode
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = sdk_client(base_url).chat.completions.create(
        model="llama-3.3-70b", messages=CHAT["messages"], stream=True, **options
    )
    chunks = list(stream)

    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == fake_reply_text(8)
    usages = [chunk.usage for chunk in chunks if chunk.usage is not None]
    if usage_mode == "venice" or include_usage:
        [usage] = usages
        assert usage.completion_tokens == 8 * WORDS_PER_CHUNK
        assert usage.prompt_tokens == PROMPT_WORDS
        cost = usage.model_dump().get("cost")
        if usage_mode == "venice":
            assert cost == fake_cost(PROMPT_WORDS, 8 * WORDS_PER_CHUNK)
        else:
            assert cost is None
    else:
        assert usages == []


def test_cached_tokens_are_reported_only_when_asked(venice, openai_mode):
    """``x-fake-cached-tokens`` makes usage say so as OpenAI and Venice do; never more than
    the prompt, and without the header no details at all."""
    for _, base_url in (venice, openai_mode):
        client = sdk_client(base_url)
        plain = client.chat.completions.create(model="llama-3.3-70b", messages=CHAT["messages"])
        assert plain.usage is not None and plain.usage.prompt_tokens_details is None
        cached = client.chat.completions.create(
            model="llama-3.3-70b", messages=CHAT["messages"],
            extra_headers={"x-fake-cached-tokens": "3"})
        assert cached.usage is not None and cached.usage.prompt_tokens_details is not None
        assert cached.usage.prompt_tokens_details.cached_tokens == 3
        stream = client.chat.completions.create(
            model="llama-3.3-70b", messages=CHAT["messages"], stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-fake-cached-tokens": "1000"})
        [usage] = [chunk.usage for chunk in stream if chunk.usage is not None]
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == PROMPT_WORDS
    refused = httpx.post(f"{venice[1]}/chat/completions", json=CHAT,
                         headers={**AUTH, "x-fake-cached-tokens": "-1"})
    assert refused.status_code == 400


@pytest.mark.parametrize("configured_by", ["header", "constructor"])
def test_chunk_delay_spaces_content_chunks(venice, configured_by):
    fake, base_url = venice
    delay = 0.03
    headers = {**AUTH, "x-fake-chunks": "4"}
    if configured_by == "header":
        headers["x-fake-chunk-delay-ms"] = "30"
    else:
        fake.chunk_delay = delay
    try:
        with httpx.stream(
            "POST", f"{base_url}/chat/completions", json={**CHAT, "stream": True}, headers=headers
        ) as response:
            arrivals = [time.monotonic() for line in response.iter_lines() if "chunk " in line]
    finally:
        fake.chunk_delay = 0.0

    sent_at = fake.requests[-1].chunk_sent_at
    assert len(sent_at) == len(arrivals) == 4
    assert all(later - earlier >= delay for earlier, later in itertools.pairwise(sent_at))
    # Streamed, not held back: the first chunk was read before the last was sent. (The
    # client's reads themselves bunch up on a loaded host: CI once saw 0.061 s between the
    # first and last arrival of chunks sent 30 ms apart.)
    assert arrivals[0] < sent_at[-1]


def test_non_stream_answer_takes_the_generation_time(venice):
    _, base_url = venice
    headers = {**AUTH, "x-fake-chunks": "3", "x-fake-chunk-delay-ms": "20"}
    started = time.monotonic()
    response = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.06


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"model": "llama-3.3-70b"},
        {"model": 7, "messages": []},
        {"model": "llama-3.3-70b", "messages": "hi"},
    ],
)
def test_invalid_chat_request_is_rejected_venice_style(venice, body):
    _, base_url = venice
    response = httpx.post(f"{base_url}/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400
    assert response.json()["error"] == "Invalid request"
    assert response.json()["issues"]


def test_non_json_chat_body_is_rejected(venice):
    _, base_url = venice
    response = httpx.post(f"{base_url}/chat/completions", content=b"model=x", headers=AUTH)
    assert response.status_code == 400


def test_wrong_method_on_an_endpoint(venice):
    _, base_url = venice
    response = httpx.get(f"{base_url}/chat/completions", headers=AUTH)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


# The fields Venice documents for a chat completion (docs.venice.ai, ChatCompletionRequest).
VENICE_DOCUMENTED = {
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "user", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "logprobs", "top_logprobs", "min_p", "top_k", "min_temp", "max_temp",
    "venice_parameters", "stop_token_ids", "reasoning", "reasoning_effort", "prompt_cache_key",
    "prompt_cache_retention", "verbosity", "text", "include", "metadata", "store", "fallbacks",
}


def test_venice_refuses_an_unknown_top_level_chat_field_like_zod(venice):
    fake, base_url = venice
    body = {**CHAT, "extra": 1, "temperature": 0.5, "foo": None}
    response = httpx.post(f"{base_url}/chat/completions", json=body, headers=AUTH)

    assert response.status_code == 400
    message = "Unrecognized key(s) in object: 'extra', 'foo'"
    assert response.json() == {
        "error": "Invalid request parameters",
        "details": {"_errors": [message]},
        "issues": [
            {"code": "unrecognized_keys", "keys": ["extra", "foo"], "path": [], "message": message}
        ],
    }
    assert fake.requests[-1].json == body  # still recorded


def test_venice_accepts_every_field_it_documents(venice):
    _, base_url = venice
    assert VENICE_CHAT_FIELDS == VENICE_DOCUMENTED
    body = {name: None for name in VENICE_CHAT_FIELDS} | {**CHAT, "stream": False}
    response = httpx.post(f"{base_url}/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == fake_reply_text(8)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"top_k": 40}, "Unrecognized request argument supplied: top_k"),
        (
            {"venice_parameters": {}, "min_p": 0.1},
            "Unrecognized request arguments supplied: min_p, venice_parameters",
        ),
    ],
)
def test_openai_refuses_unknown_arguments_like_openai(openai_mode, extra, message):
    _, base_url = openai_mode
    response = httpx.post(f"{base_url}/chat/completions", json={**CHAT, **extra}, headers=AUTH)
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    with pytest.raises(openai.BadRequestError, match=re.escape(message)):
        sdk_client(base_url).chat.completions.create(
            model="gpt-4o", messages=CHAT["messages"], extra_body=extra
        )


def test_each_mode_knows_its_own_provider_fields(venice, openai_mode):
    _, venice_url = venice
    _, openai_url = openai_mode
    openai_only = {"logit_bias": {"50256": -100}, "service_tier": "auto"}
    venice_only = {"venice_parameters": {"include_venice_system_prompt": False}, "top_k": 40}

    def status(url: str, extra: dict[str, object]) -> int:
        body = {**CHAT, **extra}
        return httpx.post(f"{url}/chat/completions", json=body, headers=AUTH).status_code

    assert (status(venice_url, venice_only), status(venice_url, openai_only)) == (200, 400)
    assert (status(openai_url, openai_only), status(openai_url, venice_only)) == (200, 400)
    assert "logit_bias" in OPENAI_CHAT_FIELDS


def test_sdk_stream_with_every_sampling_option_in_both_modes(venice, openai_mode):
    for (_, base_url), usage_expected in ((venice, True), (openai_mode, False)):
        stream = sdk_client(base_url).chat.completions.create(
            model="llama-3.3-70b", messages=CHAT["messages"], stream=True, temperature=0.2,
            top_p=0.9, max_completion_tokens=50, stop=["\n"], seed=7, user="u-1", n=1,
        )
        chunks = list(stream)
        assert any(chunk.usage is not None for chunk in chunks) is usage_expected


def test_unknown_fields_pass_when_strictness_is_off():
    fake = FakeUpstream(strict_fields=False)
    with running_fake_upstream(fake) as (_, base_url):
        body = {**CHAT, "extra": 1, "logit_bias": {}}
        response = httpx.post(f"{base_url}/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200


# --- faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "expected_body"),
    [
        (
            Fault(status=429, message="Too many requests, slow down", retry_after="7"),
            {"error": "Too many requests, slow down"},
        ),
        (
            Fault(status=503, shape="openai", message="The engine is overloaded", retry_after="1"),
            {
                "error": {
                    "message": "The engine is overloaded",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
    ],
)
def test_status_fault_in_both_shapes(venice, fault, expected_body):
    fake, base_url = venice
    fake.push_fault(fault)
    failed = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH)
    assert failed.status_code == fault.status
    assert failed.headers["content-type"] == "application/json"
    assert failed.headers["retry-after"] == fault.retry_after
    assert failed.json() == expected_body
    # Used up: the next request succeeds.
    assert httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH).status_code == 200
    assert fake.pending_faults == []


def test_fault_headers_ride_along_with_the_error(venice):
    fake, base_url = venice
    fake.push_fault(
        Fault(
            status=429,
            retry_after="30",
            headers={"x-ratelimit-reset-requests": "30s", "X-Request-Id": "req_123"},
        )
    )
    failed = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH)
    assert failed.status_code == 429
    assert failed.headers["retry-after"] == "30"
    assert failed.headers["x-ratelimit-reset-requests"] == "30s"
    assert failed.headers["x-request-id"] == "req_123"
    assert failed.headers["content-type"] == "application/json"
    assert failed.json() == {"error": "Upstream failure injected by the fake"}


def test_fault_body_is_sent_verbatim(venice):
    fake, base_url = venice
    # An upstream that echoes the credentials it was given: a gateway must not pass that on.
    echo = f'{{"error":"invalid key {AUTH["authorization"]}"}}'.encode()
    fake.push_fault(Fault(status=401, body=echo))
    failed = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH)
    assert (failed.status_code, failed.content) == (401, echo)
    assert failed.headers["content-type"] == "application/json"
    assert failed.headers["content-length"] == str(len(echo))

    html = b"<html><body>502 Bad Gateway</body></html>"
    fake.push_fault(Fault(status=502, body=html, headers={"Content-Type": "text/html"}))
    failed = httpx.get(f"{base_url}/models", headers=AUTH)
    assert (failed.status_code, failed.content) == (502, html)
    assert failed.headers.get_list("content-type") == ["text/html"]


@pytest.mark.parametrize(
    "options",
    [
        {"headers": {"x-a": "1"}},
        {"body": b"{}"},
        {"status": 500, "headers": {"Content-Length": "3"}},
    ],
)
def test_fault_dressing_needs_a_status_and_leaves_the_length_alone(options):
    with pytest.raises(ValueError):
        Fault(**options)


def test_sdk_raises_with_the_fault_message(venice):
    fake, base_url = venice
    client = sdk_client(base_url)

    fake.push_fault(Fault(status=429, shape="openai", message="Rate limit reached for model"))
    with pytest.raises(openai.RateLimitError, match="Rate limit reached for model") as raised:
        client.chat.completions.create(model="llama-3.3-70b", messages=CHAT["messages"])
    assert raised.value.status_code == 429
    assert raised.value.code == "rate_limit_exceeded"

    fake.push_fault(Fault(status=500, message="Venice is down"))
    with pytest.raises(openai.InternalServerError) as raised_venice:
        client.chat.completions.create(model="llama-3.3-70b", messages=CHAT["messages"])
    assert raised_venice.value.body == "Venice is down"  # Venice's error is a bare string


def test_fault_path_filter_and_times(venice):
    fake, base_url = venice
    fake.push_fault(Fault(status=502, path="/embeddings", times=2))
    embed = {"model": "text-embedding-bge-m3", "input": "x"}

    assert httpx.get(f"{base_url}/models", headers=AUTH).status_code == 200
    statuses = [
        httpx.post(f"{base_url}/embeddings", json=embed, headers=AUTH).status_code for _ in range(3)
    ]
    assert statuses == [502, 502, 200]


def test_delay_fault_delays_the_response(venice):
    fake, base_url = venice
    fake.push_fault(Fault(delay=0.15))
    started = time.monotonic()
    response = httpx.get(f"{base_url}/models", headers=AUTH)
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.15


def test_delay_fault_times_out_a_client_and_notices_the_hang_up(venice):
    fake, base_url = venice
    fake.push_fault(Fault(delay=5.0))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH, timeout=0.2)
    # The fake stops waiting once the client is gone instead of holding the request for 5 s.
    assert wait_until(lambda: fake.requests[-1].client_hung_up)


def test_cut_after_chunks_breaks_the_stream(venice, caplog):
    fake, base_url = venice
    fake.push_fault(Fault(cut_after_chunks=2))
    received: list[str] = []
    with (
        caplog.at_level(logging.ERROR),
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST", f"{base_url}/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as response,
    ):
        assert response.status_code == 200
        received.extend(line for line in response.iter_lines() if line)

    content = [line for line in received if "fake reply" in line]
    assert len(content) == 2
    assert "data: [DONE]" not in received
    assert len(fake.requests[-1].chunk_sent_at) == 2
    # The deliberate abort does not spill a traceback into the logs.
    assert not any("Exception in ASGI" in record.getMessage() for record in caplog.records)
    # The server survives it.
    assert httpx.get(f"{base_url}/models", headers=AUTH).status_code == 200


def test_cut_fault_on_a_json_response_truncates_the_body(venice):
    fake, base_url = venice
    fake.push_fault(Fault(cut_after_chunks=0))
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=AUTH)


def test_malformed_frame_mid_stream(venice):
    fake, base_url = venice
    fake.push_fault(Fault(malformed_frame=True))
    response = httpx.post(
        f"{base_url}/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
    )
    payloads = sse_payloads(response.text)

    malformed_at = payloads.index("{not json")
    content_positions = [index for index, data in enumerate(payloads) if "fake reply" in data]
    assert content_positions[0] < malformed_at < content_positions[-1]
    assert len(content_positions) == 8
    assert payloads[-1] == "[DONE]"


def test_inband_error_after_200(venice):
    fake, base_url = venice
    fake.push_fault(Fault(inband_error="Model is at capacity"))
    response = httpx.post(
        f"{base_url}/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
    )
    assert response.status_code == 200
    assert response.text == 'data: {"error":"Model is at capacity"}\n\ndata: [DONE]\n\n'

    fake.push_fault(Fault(inband_error="Model is at capacity"))
    stream = sdk_client(base_url).chat.completions.create(
        model="llama-3.3-70b", messages=CHAT["messages"], stream=True
    )
    with pytest.raises(openai.APIError):
        list(stream)


# --- auth, other endpoints -------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer sk-wrong", "sk-fake-upstream"])
def test_bad_credentials_are_rejected_and_still_recorded(venice, authorization):
    fake, base_url = venice
    headers = {"authorization": authorization} if authorization else {}
    response = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 401
    assert response.json() == {"error": "Authentication failed"}
    assert fake.requests[-1].path == "/api/v1/chat/completions"


def test_bad_credentials_in_openai_mode(openai_mode):
    _, base_url = openai_mode
    client = openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        client.models.list()
    assert raised.value.code == "invalid_api_key"


def test_the_scheme_is_case_insensitive_and_the_key_is_not():
    key = "sk-MiXeD-Case-Key"
    with running_fake_upstream(FakeUpstream(api_key=key)) as (_, base_url):

        def status(authorization: str) -> int:
            headers = {"authorization": authorization}
            return httpx.get(f"{base_url}/models", headers=headers).status_code

        for scheme in ("Bearer", "bearer", "BEARER"):
            assert status(f"{scheme} {key}") == 200
        for wrong in (key.lower(), key.upper(), key + "x", key[:-1]):
            assert status(f"Bearer {wrong}") == 401
        assert status(f"Basic {key}") == 401
        assert status(key) == 401
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        assert client.models.list().data


def test_the_key_is_compared_in_constant_time(venice, monkeypatch):
    _, base_url = venice
    compared: list[tuple[bytes, bytes]] = []

    def spy(presented: bytes, expected: bytes) -> bool:
        compared.append((presented, expected))
        return hmac.compare_digest(presented, expected)

    monkeypatch.setattr(fake_app, "hmac", SimpleNamespace(compare_digest=spy))
    assert httpx.get(f"{base_url}/models", headers=AUTH).status_code == 200
    assert compared == [(DEFAULT_FAKE_API_KEY.encode(), DEFAULT_FAKE_API_KEY.encode())]


@pytest.mark.parametrize("auth_header", ["api-key", "X-Api-Key"])
def test_the_key_in_another_header(auth_header):
    key = "Azure-Key-0123"
    name = auth_header.lower()
    fake = FakeUpstream(api_key=key, auth_header=auth_header, usage_mode="openai")
    with running_fake_upstream(fake) as (_, base_url):
        ok = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers={name: key})
        assert ok.status_code == 200
        assert fake.requests[-1].headers[name] == key
        assert "authorization" not in fake.requests[-1].headers

        refused = [
            {"authorization": f"Bearer {key}"},  # only the usual header: not where it is expected
            {name: f"Bearer {key}"},  # this header carries the bare key
            {name: key.lower()},
            {},
        ]
        for headers in refused:
            response = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 401, headers
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert fake.requests[-1].headers.items() >= headers.items()  # recorded as sent

        # The SDK always sends Authorization too; the record shows which header held the key.
        client = openai.OpenAI(
            base_url=base_url, api_key="not-this-one", default_headers={name: key}, max_retries=0
        )
        client.chat.completions.create(model="gpt-4o", messages=CHAT["messages"])
        seen = fake.requests[-1].headers
        assert (seen[name], seen["authorization"]) == (key, "Bearer not-this-one")


@pytest.mark.parametrize("auth_header", ["", "api key", "x-key:"])
def test_auth_header_must_be_a_header_name(auth_header):
    with pytest.raises(ValueError, match="auth_header"):
        FakeUpstream(auth_header=auth_header)


def test_a_fault_is_not_used_up_by_an_unauthenticated_request(venice):
    fake, base_url = venice
    fake.push_fault(Fault(status=500))
    assert httpx.get(f"{base_url}/models").status_code == 401
    assert httpx.get(f"{base_url}/models", headers=AUTH).status_code == 500


def test_embeddings_via_sdk_and_httpx_agree(venice):
    _, base_url = venice
    client = sdk_client(base_url)
    # The SDK asks for base64 by default; the fake must answer in kind.
    via_sdk = client.embeddings.create(model="text-embedding-bge-m3", input=["alpha", "beta gamma"])
    assert [item.index for item in via_sdk.data] == [0, 1]
    assert all(len(item.embedding) == 8 for item in via_sdk.data)
    assert via_sdk.usage.prompt_tokens == 3
    assert via_sdk.usage.total_tokens == 3

    as_floats = httpx.post(
        f"{base_url}/embeddings",
        json={"model": "text-embedding-bge-m3", "input": "alpha", "encoding_format": "float"},
        headers=AUTH,
    ).json()
    assert as_floats["object"] == "list"
    assert as_floats["model"] == "text-embedding-bge-m3"
    [item] = as_floats["data"]
    assert item["object"] == "embedding"
    assert item["embedding"] == pytest.approx(via_sdk.data[0].embedding, abs=1e-6)
    assert sum(component**2 for component in item["embedding"]) == pytest.approx(1, abs=1e-4)


def test_embedding_dimensions_and_base64(venice):
    _, base_url = venice
    body = {
        "model": "text-embedding-bge-m3",
        "input": "alpha",
        "dimensions": 3,
        "encoding_format": "base64",
    }
    encoded = httpx.post(f"{base_url}/embeddings", json=body, headers=AUTH).json()
    vector = struct.unpack("<3f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert len(vector) == 3

    rejected = httpx.post(
        f"{base_url}/embeddings", json={"model": "text-embedding-bge-m3"}, headers=AUTH
    )
    assert rejected.status_code == 400


def test_models(venice):
    _, base_url = venice
    models = sdk_client(base_url).models.list()
    assert [model.id for model in models.data] == [
        "llama-3.3-70b",
        "venice-uncensored",
        "qwen3-4b",
        "text-embedding-bge-m3",
    ]
    raw = httpx.get(f"{base_url}/models", headers=AUTH).json()
    assert raw["object"] == "list"
    assert {model["owned_by"] for model in raw["data"]} == {"venice.ai"}
    assert {model["id"]: model["type"] for model in raw["data"]} == {
        model.id: model.type for model in FAKE_MODELS
    }
    embedding_only = httpx.get(f"{base_url}/models?type=embedding", headers=AUTH).json()
    assert [model["id"] for model in embedding_only["data"]] == ["text-embedding-bge-m3"]


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/billing/balance"), ("POST", "/api_keys"), ("GET", "")]
)
def test_any_other_path_under_the_prefix_reveals_the_billing_secret(venice, method, path):
    _, base_url = venice
    response = httpx.request(method, f"{base_url}{path}", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {"object": "billing", "secret": BILLING_SECRET}


def test_paths_outside_the_prefix_are_not_found(venice):
    _, base_url = venice
    origin = base_url.removesuffix("/api/v1")
    for path in ("/v1/models", "/api/v10/models", "/"):
        assert httpx.get(f"{origin}{path}", headers=AUTH).status_code == 404


# --- bookkeeping -----------------------------------------------------------------------------


def test_connections_are_counted(venice):
    fake, base_url = venice
    with httpx.Client(headers=AUTH) as client:
        for _ in range(3):
            client.get(f"{base_url}/models")
    assert fake.connections == 1  # keep-alive reuses one connection
    httpx.get(f"{base_url}/models", headers=AUTH)
    assert fake.connections == 2

    fake.reset()
    assert (fake.connections, fake.requests) == (0, [])


def test_request_log(venice):
    fake, base_url = venice
    before = time.monotonic()
    body = json.dumps(CHAT).encode()
    httpx.post(
        f"{base_url}/chat/completions?trace=1",
        content=body,
        headers={**AUTH, "Content-Type": "application/json", "X-Custom-Thing": "Value"},
    )

    [recorded] = fake.requests
    assert isinstance(recorded, RecordedRequest)
    assert (recorded.method, recorded.path, recorded.query) == (
        "POST",
        "/api/v1/chat/completions",
        "trace=1",
    )
    assert recorded.headers["x-custom-thing"] == "Value"
    assert recorded.headers["authorization"] == AUTH["authorization"]
    assert all(name == name.lower() for name in recorded.headers)
    assert recorded.body == body
    assert recorded.json == CHAT
    assert before <= recorded.received_at <= time.monotonic()
    assert recorded.chunk_sent_at == []  # not a stream


def test_recording_can_be_switched_off():
    with running_fake_upstream(FakeUpstream(api_key="k", record=False)) as (fake, base_url):
        response = httpx.get(f"{base_url}/models", headers={"authorization": "Bearer k"})
        assert response.status_code == 200
        assert fake.requests == []
        assert fake.connections == 1


def test_command_line_entry_point():
    command = [
        sys.executable,
        "-m",
        "llm_gateway.testing.fake_upstream",
        "--port",
        "0",
        "--api-key",
        "sk-cli",
        "--chunks",
        "2",
        "--usage-mode",
        "openai",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        announcement = process.stderr.readline()
        match = re.search(r"(http://\S+)", announcement)
        assert match, announcement
        completion = httpx.post(
            f"{match.group(1)}/chat/completions",
            json=CHAT,
            headers={"authorization": "Bearer sk-cli"},
        ).json()
        assert completion["choices"][0]["message"]["content"] == fake_reply_text(2)
        assert "cost" not in completion["usage"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_every_public_name_imports_from_fake_upstream():
    exported = {name: getattr(fake_upstream, name) for name in fake_upstream.__all__}
    assert exported["FakeUpstream"] is FakeUpstream
    assert exported["Fault"] is Fault
    assert len(exported) == 22


def test_command_line_key_in_another_header():
    command = [
        sys.executable,
        "-m",
        "llm_gateway.testing.fake_upstream",
        "--port",
        "0",
        "--api-key",
        "Key-CLI",
        "--auth-header",
        "x-api-key",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        match = re.search(r"(http://\S+)", process.stderr.readline())
        assert match
        models_url = f"{match.group(1)}/models"
        assert httpx.get(models_url, headers={"x-api-key": "Key-CLI"}).status_code == 200
        assert httpx.get(models_url, headers={"authorization": "Bearer Key-CLI"}).status_code == 401
    finally:
        process.terminate()
        process.wait(timeout=10)
