"""A misbehaving provider must not cost the gateway its memory or its secrets: answers
that echo the provider key, compression bombs, bodies and SSE lines without end, more
bytes than a Content-Length says. Against real `serve` and reverse-sidecar processes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.conftest import make_settings
from tests.process_support import KINDS, gateway_kind
from tests.support import create_key, free_port

PROVIDER_KEY = "sk-hostile-provider-key-0123456789abcdef"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


@functools.cache
def bomb() -> bytes:
    return gzip.compress(b"{" + b" " * (200 * 1024 * 1024) + b"}")  # 200 MiB from ~200 KiB


@functools.cache
def stream_bomb() -> bytes:
    return gzip.compress(b"data: " + b"y" * (200 * 1024 * 1024) + b"\n\n")


async def _echo_key(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": f"bad credentials: "
                                        f"{request.headers.get('authorization')}"}}, status=401)


async def _echo_key_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "x-echo": request.headers["authorization"]})
    await response.prepare(request)
    frame = {"choices": [{"index": 0, "delta": {"content": request.headers["authorization"]}}]}
    await response.write(b"data: " + json.dumps(frame).encode() + b"\n\ndata: [DONE]\n\n")
    return response


async def _bomb(request: web.Request) -> web.Response:
    return web.Response(body=bomb(), headers={"content-type": "application/json",
                                           "content-encoding": "gzip"})


async def _endless_json(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "application/json"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        for _ in range(200):  # 200 MiB, never whole
            await response.write(b" " * (1024 * 1024))
    return response


async def _endless_line(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(b"data: ")
        for _ in range(200):
            await response.write(b"x" * (1024 * 1024))
    return response


async def _stream_bomb(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "content-encoding": "gzip"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(stream_bomb())
    return response


FIREHOSE_FRAMES = 100_000  # of about 1 KiB each: 100 MiB, as fast as the gateway takes them
FIREHOSE_SENT: list[int] = []  # frames the last firehose got written


async def _firehose(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    frame = b"data: " + json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "z" * 1000}}]}).encode() + b"\n\n"
    FIREHOSE_SENT[:] = [0]
    with contextlib.suppress(ConnectionError):
        for _ in range(FIREHOSE_FRAMES):
            await response.write(frame)  # waits while the gateway reads nothing
            FIREHOSE_SENT[0] += 1
    return response


async def _too_long(request: web.Request) -> web.StreamResponse:
    """Says 2 bytes, sends more: the extra must not poison the connection's next answer."""
    body = json.dumps({"id": "x", "choices": []}).encode()
    response = web.StreamResponse(headers={"content-type": "application/json",
                                           "content-length": str(len(body))})
    await response.prepare(request)
    await response.write(body + b"garbage after the body")
    return response


# What reached the address a redirect named: nothing may (it would carry the key there).
CAUGHT: list[dict[str, str]] = []


async def _redirect(request: web.Request) -> web.Response:
    """A provider (or something in front of it) sending the call elsewhere."""
    target = f"http://localhost:{request.url.port}/catch/api/v1/chat/completions"
    return web.Response(status=307, headers={"location": target})


async def _catch(request: web.Request) -> web.Response:
    CAUGHT.append(dict(request.headers))
    return web.json_response({"id": "caught", "choices": []})


ROUTES = {"echo-key": _echo_key, "echo-key-stream": _echo_key_stream, "bomb": _bomb,
          "endless-json": _endless_json, "endless-line": _endless_line,
          "stream-bomb": _stream_bomb, "too-long": _too_long, "redirect": _redirect,
          "catch": _catch, "firehose": _firehose}


@contextlib.contextmanager
def hostile_upstream() -> Iterator[str]:
    """Answers /<behaviour>/api/v1/chat/completions as that behaviour says."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    for name, handler in ROUTES.items():
        app.router.add_post(f"/{name}/api/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    # Compressed before any gateway waits on them: on a busy machine, compressing 200 MiB
    # inside the handler could outlast the gateway's first-byte timeout.
    bomb(), stream_bomb()
    with hostile_upstream() as url:
        yield url


@pytest.fixture(params=KINDS)
def gateway(request: pytest.FixtureRequest, tmp_path: Path,
            upstream: str) -> Iterator[tuple[str, int, str]]:
    """(base URL for /v1, pid, gateway key), for a gateway whose routes send alias
    <behaviour> to the hostile upstream's path for it."""
    settings = make_settings(tmp_path, upstream)
    key = create_key(settings.database_url, rate_limit_requests=1000)[1]
    config = tmp_path / "gateway.yaml"
    providers = {name: {"base_url": f"{upstream}/{name}/api/v1", "api_key_env": "HOSTILE_KEY",
                        "profile": "generic",
                        "timeouts": {"connect": 2, "first_byte": 5, "read": 5, "stream_idle": 5}}
                 for name in ROUTES}
    models = {name: {"targets": [{"provider": name, "model": "m"}]} for name in ROUTES}
    config.write_text(json.dumps({"providers": providers, "models": models,
                                  "routing": {"max_attempts": 1}}))
    env = {"DATABASE_URL": settings.database_url, "HOSTILE_KEY": PROVIDER_KEY,
           "LLM_GATEWAY_CONFIG": str(config), "REDIS_URL": settings.redis_url or "",
           "REDIS_NAMESPACE": settings.redis_namespace}
    with gateway_kind(request.param, tmp_path, env) as (base, pid):
        yield base, pid, key


def chat(gateway: tuple[str, int, str], model: str, **extra: object) -> httpx.Response:
    base, _, key = gateway
    return httpx.post(base + "/chat/completions", json={**CHAT, "model": model, **extra},
                      headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_the_provider_key_is_masked_in_what_is_relayed(gateway: tuple[str, int, str]) -> None:
    echoed = chat(gateway, "echo-key")
    assert echoed.status_code == 401 and PROVIDER_KEY not in echoed.text
    assert "bad credentials: Bearer sk-h" in echoed.json()["error"]["message"]
    streamed = chat(gateway, "echo-key-stream", stream=True)
    assert streamed.status_code == 200 and PROVIDER_KEY not in streamed.text
    assert "Bearer sk-h" in streamed.text  # the frame came through, masked
    assert all(PROVIDER_KEY not in value for value in streamed.headers.values())
    assert streamed.headers["x-echo"].startswith("Bearer sk-h...")


@pytest.mark.parametrize("model", ["bomb", "endless-json"])
def test_a_body_past_the_limit_is_a_502_not_a_buffer(gateway: tuple[str, int, str],
                                                     model: str) -> None:
    before = rss_peak_kib(gateway[1])
    response = chat(gateway, model)
    assert (response.status_code, response.json()["error"]["code"]) == (
        502, "upstream_response_too_large")
    growth = (rss_peak_kib(gateway[1]) - before) / 1024
    assert growth < 50, f"peak RSS grew by {growth:.0f} MiB"


@pytest.mark.parametrize("model", ["endless-line", "stream-bomb"])
def test_an_sse_event_without_end_ends_the_stream_in_band(gateway: tuple[str, int, str],
                                                         model: str) -> None:
    before = rss_peak_kib(gateway[1])
    response = chat(gateway, model, stream=True)
    *_, error, done = response.text.strip().split("\n\n")
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == (
        "upstream_response_too_large")
    assert done == "data: [DONE]"
    growth = (rss_peak_kib(gateway[1]) - before) / 1024
    assert growth < 50, f"peak RSS grew by {growth:.0f} MiB"


def test_a_client_that_stops_reading_stops_the_upstream_not_fills_memory(
    gateway: tuple[str, int, str],
) -> None:
    """The gateway waits while the client's socket is full, and so stops reading the
    provider: a 100 MiB stream to a client that reads nothing costs a few socket buffers."""
    base, pid, key = gateway
    before = rss_peak_kib(pid)
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", base + "/chat/completions", headers={"authorization": f"Bearer {key}"},
            json={**CHAT, "model": "firehose", "stream": True}) as response:
        assert response.status_code == 200
        time.sleep(3)  # reads nothing
        sent = FIREHOSE_SENT[0]
        assert sent < FIREHOSE_FRAMES / 4, f"{sent} frames sent to a client reading nothing"
    growth = (rss_peak_kib(pid) - before) / 1024
    assert growth < 30, f"peak RSS grew by {growth:.0f} MiB"


def test_more_bytes_than_the_content_length_do_not_poison_the_next_answer(
    gateway: tuple[str, int, str],
) -> None:
    started = time.monotonic()
    for _ in range(3):
        response = chat(gateway, "too-long")
        assert response.status_code == 200, response.text
        assert response.headers["x-llm-gateway-attempts"] == "1"
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("stream", [False, True])
def test_a_redirect_is_not_followed_with_the_key(gateway: tuple[str, int, str],
                                                  stream: bool) -> None:
    """Neither followed (the provider key would go where it points) nor relayed (the
    client would send its prompt there, past the gateway): an OpenAI-shaped 502."""
    CAUGHT.clear()
    response = chat(gateway, "redirect", stream=stream)
    assert CAUGHT == []
    assert response.status_code == 502 and "location" not in response.headers
    error = response.json()["error"]
    assert error["code"] == "upstream_broken_response"
    assert "answered with a redirect (307)" in error["message"]
    assert PROVIDER_KEY not in response.text
