"""The gateway over a real socket: every error status, relaying, and usage records."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from tests.support import free_port, roomy_window

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}


def post(url: str, key: str | None, body: object = CHAT, **kwargs: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + "/v1/chat/completions", content=content,
                      headers={**headers, "content-type": "application/json"},
                      timeout=10, **kwargs)  # type: ignore[arg-type]


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    return error


def test_health_and_ready(gw) -> None:
    assert httpx.get(gw.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(gw.url + "/readyz").status_code == 200


def test_chat_completion_relayed_with_usage_record(gw, fake: FakeUpstream) -> None:
    record, key = gw.key_with_record(name="alice")
    response = post(gw.url, key)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"].startswith("This is chunk 0")
    assert response.headers["x-ratelimit-limit-requests"] == "60"
    assert response.headers["x-ratelimit-remaining-requests"] == "59"
    assert response.headers["x-ratelimit-reset-requests"].endswith("s")
    [seen] = fake.requests
    assert seen.headers["authorization"] == "Bearer sk-fake-upstream"
    [usage] = gw.records()
    assert usage.key_id == record.id and usage.status == 200 and usage.error_code is None
    assert usage.total_tokens == response.json()["usage"]["total_tokens"] > 0
    assert float(usage.provider_cost_usd) == response.json()["usage"]["cost"]["usd"]
    assert usage.response_id == response.json()["id"]
    assert usage.finish_reasons == ["stop"]


@pytest.mark.parametrize("authorization", [
    None, "Bearer", "Basic abc", "Bearer llmg_short", "Bearer sk-fake-upstream",
])
def test_401_without_a_valid_key(gw, fake: FakeUpstream, authorization: str | None) -> None:
    headers = {"authorization": authorization} if authorization else {}
    response = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers)
    error = assert_error(response, 401, "invalid_api_key")
    assert "sk-fake-upstream" not in response.text
    assert error["type"] == "authentication_error"
    assert fake.requests == []


def test_401_for_a_mistyped_key_never_reaches_the_store(gw, fake: FakeUpstream) -> None:
    key = gw.key()
    flipped = key[:20] + ("A" if key[20] != "A" else "B") + key[21:]
    assert_error(post(gw.url, flipped), 401, "invalid_api_key")
    assert key not in post(gw.url, flipped).text and flipped not in post(gw.url, flipped).text


def test_401_for_revoked_and_expired_keys(gw, fake: FakeUpstream) -> None:
    import asyncio

    record, key = gw.key_with_record()
    assert post(gw.url, key).status_code == 200

    async def revoke() -> None:
        from llm_gateway.stores import open_store

        store = open_store(gw.database_url)
        await store.revoke_key(record.id, time.time())
        await store.close()

    asyncio.run(revoke())
    error = assert_error(post(gw.url, key), 401, "invalid_api_key")
    assert "revoked" in error["message"]
    _, expired = gw.key_with_record(expires_at=time.time() - 1)
    assert "expired" in assert_error(post(gw.url, expired), 401, "invalid_api_key")["message"]
    assert len(fake.requests) == 1


def test_403_model_not_allowed(gw, fake: FakeUpstream) -> None:
    key = gw.key(allowed_models=("qwen3-4b",))
    error = assert_error(post(gw.url, key), 403, "model_not_allowed")
    assert error["type"] == "permission_error"
    assert fake.requests == []
    assert post(gw.url, key, {**CHAT, "model": "qwen3-4b"}).status_code == 200


def test_models_list_filtered_by_allowed_models(gw, fake: FakeUpstream) -> None:
    key = gw.key(allowed_models=("qwen3-4b", "text-embedding-bge-m3"))
    response = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["qwen3-4b", "text-embedding-bge-m3"]
    everything = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {gw.key()}"})
    assert len(everything.json()["data"]) == 4


@pytest.mark.parametrize(("body", "code"), [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_request_body"),
    ({"messages": [{"role": "user", "content": "x"}]}, "invalid_request_body"),
    ({"model": "", "messages": [{"role": "user", "content": "x"}]}, "invalid_request_body"),
    ({"model": "m", "messages": []}, "invalid_request_body"),
    ({"model": "m", "messages": [{"content": "no role"}]}, "invalid_request_body"),
    ({"model": "m", "messages": [{"role": "user"}], "stream": "yes"}, "invalid_request_body"),
])
def test_400_bad_body(gw, fake: FakeUpstream, body: object, code: str) -> None:
    response = post(gw.url, gw.key(), body)
    assert_error(response, 400, code)
    assert fake.requests == []


def test_413_body_over_limit(start_gateway, fake: FakeUpstream) -> None:
    gw = start_gateway(request_body_limit_bytes=1000)
    key = gw.key()
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    assert_error(post(gw.url, key, big), 413, "request_too_large")

    # Chunked upload without Content-Length: the limit holds while reading.
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(20):
            yield b" " * 100

    response = httpx.post(gw.url + "/v1/chat/completions", content=chunks(),
                          headers={"authorization": f"Bearer {key}"})
    assert_error(response, 413, "request_too_large")
    assert fake.requests == []


def test_429_with_retry_after_and_headers(gw, fake: FakeUpstream) -> None:
    window = roomy_window()  # it must not roll over before the fourth request
    key = gw.key(rate_limit_requests=3, rate_limit_window_seconds=window)
    statuses = [post(gw.url, key).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    limited = post(gw.url, key)
    error = assert_error(limited, 429, "rate_limit_exceeded")
    assert error["type"] == "rate_limit_error"
    assert 1 <= int(limited.headers["retry-after"]) <= window
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
    assert limited.headers["x-ratelimit-limit-requests"] == "3"
    assert len(fake.requests) == 3
    # Another key has its own window.
    assert post(gw.url, gw.key()).status_code == 200


def test_502_upstream_unreachable(start_gateway, fake: FakeUpstream) -> None:
    dead_port = free_port()
    gw = start_gateway(f"http://127.0.0.1:{dead_port}/api/v1", venice_max_retries=1)
    _record, key = gw.key_with_record()
    error = assert_error(post(gw.url, key), 502, "upstream_unreachable")
    assert error["type"] == "upstream_error"
    [usage] = gw.records()
    assert (usage.status, usage.error_code, usage.attempts) == (502, "upstream_unreachable", 2)


def test_504_upstream_timeout(start_gateway, fake: FakeUpstream) -> None:
    gw = start_gateway(request_timeout_seconds=0.3)
    key = gw.key()
    fake.push_fault(Fault(delay=1.5))
    assert_error(post(gw.url, key), 504, "upstream_timeout")
    [usage] = gw.records()
    assert (usage.status, usage.error_code) == (504, "upstream_timeout")


def test_provider_paths_outside_the_gateway_are_not_served(gw, fake: FakeUpstream) -> None:
    key = gw.key()
    for path in ("/v1/billing/usage", "/v1/api_keys"):
        response = httpx.get(gw.url + path, headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert fake.requests == []


def test_upstream_error_in_openai_shape_passes_unchanged(gw, fake: FakeUpstream) -> None:
    fake.push_fault(Fault(status=400, shape="openai", message="max_tokens is too large"))
    response = post(gw.url, gw.key())
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "max_tokens is too large"


def test_venice_error_shape_is_wrapped_with_message_verbatim(gw, fake: FakeUpstream) -> None:
    fake.push_fault(Fault(status=402, shape="venice", message="Insufficient USD or Diem balance"))
    response = post(gw.url, gw.key())
    assert response.status_code == 402
    error = response.json()["error"]
    assert error["message"] == "Insufficient USD or Diem balance"
    assert set(error) == {"message", "type", "code"}
    [usage] = gw.records()
    assert (usage.status, usage.error_code) == (402, "upstream_error")


def test_retryable_status_is_retried_then_succeeds(gw, fake: FakeUpstream) -> None:
    fake.push_fault(Fault(status=503, retry_after="0"))
    response = post(gw.url, gw.key())
    assert response.status_code == 200
    assert len(fake.requests) == 2
    [usage] = gw.records()
    assert usage.attempts == 2 and usage.status == 200


def test_retries_exhausted_keep_the_upstream_status(start_gateway, fake: FakeUpstream) -> None:
    gw = start_gateway(venice_max_retries=1)
    fake.push_fault(Fault(status=429, retry_after="0", message="Rate limit exceeded", times=2))
    response = post(gw.url, gw.key())
    assert response.status_code == 429
    assert response.json()["error"]["message"] == "Rate limit exceeded"
    assert len(fake.requests) == 2


def stream_body(gw_url: str, key: str, headers: dict[str, str] | None = None,
                **fields: object) -> bytes:
    with httpx.stream("POST", gw_url + "/v1/chat/completions",
                      json={**CHAT, "stream": True, **fields}, timeout=10,
                      headers={"authorization": f"Bearer {key}", **(headers or {})}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return b"".join(response.iter_raw())


def test_stream_is_relayed_byte_for_byte_and_metered(gw, fake: FakeUpstream) -> None:
    """Venice sends its usage chunk asked or not; a client that asked gets it, exactly once."""
    body = stream_body(gw.url, gw.key(), {"x-fake-chunks": "5"},
                       stream_options={"include_usage": True})
    assert body.endswith(b"data: [DONE]\n\n")
    payloads = [json.loads(line[6:]) for line in body.split(b"\n\n")
                if line.startswith(b"data: {")]
    assert [p for p in payloads if "usage" in p] == [payloads[-1]]
    [usage] = gw.records()
    assert usage.stream and usage.status == 200 and usage.error_code is None
    assert usage.completion_tokens == payloads[-1]["usage"]["completion_tokens"]
    assert float(usage.provider_cost_diem) == payloads[-1]["usage"]["cost"]["diem"]
    assert usage.response_id == payloads[0]["id"]
    assert usage.finish_reasons == ["stop"]
    assert usage.first_chunk_ms is not None and usage.ttfb_ms is not None


def test_inband_stream_error_is_relayed_and_recorded_as_failed(gw, fake: FakeUpstream) -> None:
    fake.push_fault(Fault(inband_error="Model is overloaded, please retry"))
    body = stream_body(gw.url, gw.key())
    frames = body.strip().split(b"\n\n")
    assert json.loads(frames[-2].removeprefix(b"data: ")) == {
        "error": "Model is overloaded, please retry"
    }
    assert frames[-1] == b"data: [DONE]"
    [usage] = gw.records()
    assert (usage.status, usage.error_code) == (200, "upstream_inband_error")


def test_stream_cut_by_upstream_ends_with_an_error_event(gw, fake: FakeUpstream) -> None:
    fake.push_fault(Fault(cut_after_chunks=2))
    body = stream_body(gw.url, gw.key())
    *_, error, done = body.strip().split(b"\n\n")
    assert json.loads(error[6:])["error"]["code"] == "upstream_stream_interrupted"
    assert done == b"data: [DONE]"
    [usage] = gw.records()
    assert usage.error_code == "upstream_stream_interrupted"


def test_client_disconnect_mid_stream_still_writes_a_record(
    start_gateway, fake: FakeUpstream
) -> None:
    gw = start_gateway()
    key = gw.key()
    request = json.dumps({**CHAT, "stream": True}).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {key}\r\ncontent-length: {len(request)}\r\n".encode()
            + b"x-fake-chunks: 50\r\nx-fake-chunk-delay-ms: 50\r\n\r\n" + request
        )
        assert b"200" in sock.recv(4096)
    gw.finished.wait_for(1)
    [usage] = gw.records()
    assert usage.error_code == "client_disconnected"
    assert usage.stream and usage.duration_ms < 2000


def test_embeddings(gw, fake: FakeUpstream) -> None:
    response = httpx.post(gw.url + "/v1/embeddings",
                          json={"model": "text-embedding-bge-m3", "input": ["a b", "c"]},
                          headers={"authorization": f"Bearer {gw.key()}"})
    assert response.status_code == 200
    assert len(response.json()["data"]) == 2
    [usage] = gw.records()
    assert usage.endpoint == "embeddings" and usage.prompt_tokens > 0
