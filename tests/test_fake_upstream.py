"""The fake upstream, exercised over real sockets with httpx and the official openai SDK."""

import base64
import itertools
import json
import logging
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

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
    assert arrivals[-1] - arrivals[0] >= 3 * delay * 0.9  # they really arrive spread out


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
    ("method", "path"), [("GET", "/billing/usage"), ("POST", "/api_keys"), ("GET", "")]
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
