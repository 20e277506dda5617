"""The in-process transport: an app's own openai SDK calls, governed by the engine in its
process and charged to the inbound caller who caused them (GatewayMiddleware with
govern_outbound), sync in a worker thread, async, and streaming."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from asgi_middleware import GatewayMiddleware
from llm_gateway.adapters.identity import Identity, inbound_identity
from llm_gateway.adapters.inprocess import stop_engine
from llm_gateway.engine import Gateway
from llm_gateway.httpx import GatewayError, GatewayTransport, acting_as
from llm_gateway.keys import KeyRecord
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import (
    REPO,
    assert_stream_not_buffered,
    create_key,
    free_port,
    serve_in_thread,
    stop_process,
    usage_records,
    wait_until_up,
)

BASE_URL = "http://llm-gateway/v1"
PROVIDER_KEY = "sk-fake-upstream"
CHAT: dict[str, Any] = {"model": "llama-3.3-70b",
                        "messages": [{"role": "user", "content": "Hello"}]}
PACED = {"x-fake-chunks": "3", "x-fake-chunk-delay-ms": "300"}


@dataclass
class Engine:
    gateway: Gateway
    finished: RecordedUsage
    database_url: str

    def key(self, **options: object) -> tuple[KeyRecord, str]:
        return create_key(self.database_url, **options)

    def sync_client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(api_key="unused", base_url=BASE_URL, max_retries=0,
                             http_client=httpx.Client(
                                 transport=GatewayTransport(self.gateway, key=key)))

    def async_client(self, key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key="unused", base_url=BASE_URL, max_retries=0,
                                  http_client=httpx.AsyncClient(
                                      transport=GatewayTransport(self.gateway, key=key)))


@pytest.fixture
def engine(tmp_path: Path, fake_url: str) -> Iterator[Engine]:
    settings = make_settings(tmp_path, fake_url)
    gateway = build_gateway(settings, key_cache_seconds=0)
    finished = RecordedUsage()
    gateway.add_record_sink(finished)
    yield Engine(gateway, finished, settings.database_url)
    stop_engine(gateway)  # when a sync call gave it a loop of its own


# ---- the app: its handlers call the SDK themselves, with one client of each kind -------

async def answer(work: Awaitable[dict[str, Any]]) -> Response:
    """What the handler makes of the SDK's outcome, as its caller sees it."""
    try:
        return JSONResponse(await work)
    except openai.RateLimitError as exc:
        return JSONResponse({"error": "rate_limited", "message": exc.message}, 429)
    except GatewayError as exc:
        return JSONResponse({"error": "refused", "message": str(exc)}, 403)
    except AssertionError as exc:
        return JSONResponse({"error": "assertion", "message": str(exc)}, 500)


async def first_content_before_second_chunk(client: openai.AsyncOpenAI,
                                            fake: FakeUpstream) -> dict[str, Any]:
    """assert_stream_not_buffered, for the async client."""
    stream = await client.chat.completions.create(**CHAT, stream=True, extra_headers=PACED)
    first_content_at = None
    async for chunk in stream:
        if first_content_at is None and chunk.choices and chunk.choices[0].delta.content:
            first_content_at = time.monotonic()
    [seen] = fake.requests
    assert first_content_at is not None and len(seen.chunk_sent_at) == 3
    assert seen.chunk_sent_at[0] <= first_content_at < seen.chunk_sent_at[1]
    return {"unbuffered": True}


def governed_app(engine: Engine, fake: FakeUpstream) -> tuple[GatewayMiddleware, openai.OpenAI]:
    sync_client, async_client = engine.sync_client(), engine.async_client()

    def ask_sync() -> dict[str, Any]:
        completion = sync_client.chat.completions.create(**CHAT)
        return {"content": completion.choices[0].message.content}

    async def ask_async() -> dict[str, Any]:
        completion = await async_client.chat.completions.create(**CHAT)
        return {"content": completion.choices[0].message.content}

    async def sync_route(request: Request) -> Response:
        return await answer(run_in_threadpool(ask_sync))

    async def async_route(request: Request) -> Response:
        return await answer(ask_async())

    async def blocking_route(request: Request) -> Response:
        async def on_the_loop() -> dict[str, Any]:
            return ask_sync()  # the sync client on the server's loop: refused, not hung

        return await answer(on_the_loop())

    async def stream_route(request: Request) -> Response:
        stream = await async_client.chat.completions.create(**CHAT, stream=True)

        async def relay() -> Any:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content.encode()

        return StreamingResponse(relay(), media_type="text/plain")

    async def unbuffered_sync(request: Request) -> Response:
        async def check() -> dict[str, Any]:
            await run_in_threadpool(assert_stream_not_buffered, sync_client, fake)
            return {"unbuffered": True}

        return await answer(check())

    async def unbuffered_async(request: Request) -> Response:
        return await answer(first_content_before_second_chunk(async_client, fake))

    async def as_subject(request: Request) -> Response:
        with acting_as(subject=request.path_params["subject"]):
            return await answer(ask_async())

    routes = [Route("/sync", sync_route), Route("/async", async_route),
              Route("/blocking", blocking_route), Route("/stream", stream_route),
              Route("/unbuffered/sync", unbuffered_sync),
              Route("/unbuffered/async", unbuffered_async),
              Route("/as/{subject}", as_subject)]
    app = GatewayMiddleware(Starlette(routes=routes), engine.gateway, govern_outbound=True,
                            identity_header="x-gateway-key")
    return app, sync_client


@pytest.fixture
def served(engine: Engine, fake: FakeUpstream) -> Iterator[tuple[str, openai.OpenAI]]:
    app, sync_client = governed_app(engine, fake)
    with serve_in_thread(app) as url:
        yield url, sync_client


def as_caller(key: str | None) -> dict[str, str]:
    return {"x-gateway-key": key} if key else {}


# ---- acceptance 1: sync, async, streaming; provider key upstream only; the caller pays ----

def test_the_apps_own_calls_are_charged_to_the_inbound_caller(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    url, sync_client = served
    record, key = engine.key(name="alice")
    for path in ("/sync", "/async"):
        response = httpx.get(url + path, headers=as_caller(key))
        assert response.status_code == 200 and response.json()["content"], response.text
    streamed = httpx.get(url + "/stream", headers=as_caller(key))
    assert streamed.status_code == 200 and streamed.text.startswith("This is chunk 0")

    assert len(fake.requests) == 3
    for seen in fake.requests:
        assert seen.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
        assert key not in json.dumps(seen.headers)
    finished = engine.finished.wait_for(3)
    assert [(r.key_id, r.subject_id, r.adapter, r.status, r.error_code) for r in finished] == [
        (record.id, "alice", "httpx", 200, None)] * 3
    assert [r.stream for r in finished] == [False, False, True]
    # The app's SDK objects never held the provider key (nor the caller's).
    assert sync_client.api_key == "unused"
    held = repr(sync_client.default_headers) + repr(sync_client._client.headers)
    assert PROVIDER_KEY not in held and key not in held


def test_the_stream_reaches_the_app_chunk_by_chunk(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    url, _ = served
    _, key = engine.key()
    for path in ("/unbuffered/sync", "/unbuffered/async"):
        fake.reset()
        response = httpx.get(url + path, headers=as_caller(key), timeout=10)
        assert response.json() == {"unbuffered": True}, response.text


# ---- acceptance 2: two callers, one SDK client, separate limits ---------------------------

def test_two_callers_are_limited_separately_through_one_client(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    url, _ = served
    limited, limited_key = engine.key(name="limited", rate_limit_requests=2)
    roomy, roomy_key = engine.key(name="roomy", rate_limit_requests=100)
    statuses = [httpx.get(url + path, headers=as_caller(limited_key)).status_code
                for path in ("/async", "/sync", "/async", "/sync")]
    assert statuses == [200, 200, 429, 429]
    refused = httpx.get(url + "/async", headers=as_caller(limited_key)).json()
    assert refused["error"] == "rate_limited" and "2 requests per 60s" in refused["message"]
    # The other caller is unaffected, on the same clients.
    assert httpx.get(url + "/sync", headers=as_caller(roomy_key)).status_code == 200
    assert httpx.get(url + "/async", headers=as_caller(roomy_key)).status_code == 200
    assert len(fake.requests) == 4  # the refused calls never left the process
    finished = engine.finished.wait_for(4)
    assert sorted(r.key_id for r in finished) == sorted([limited.id] * 2 + [roomy.id] * 2)


# ---- acceptance 3: nobody to charge, nothing sent ---------------------------------------

def test_a_call_with_no_identity_and_no_key_is_refused_before_the_upstream(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    url, sync_client = served
    for path in ("/sync", "/async"):
        refused = httpx.get(url + path)  # no x-gateway-key, and the clients have no key
        assert refused.status_code == 403 and refused.json()["error"] == "refused"
        assert "acting_as" in refused.json()["message"]
    with pytest.raises(GatewayError):
        sync_client.models.list()  # outside any request: nothing bound either
    assert fake.requests == []
    assert engine.finished.records == []


def test_identity_order_bound_caller_then_the_transports_key(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    alice, alice_key = engine.key(name="alice")
    service, service_key = engine.key(name="service")
    client = engine.sync_client(key=service_key)
    client.chat.completions.create(**CHAT)
    with acting_as(key=alice_key):
        client.chat.completions.create(**CHAT)
    with acting_as(subject="user-7"):
        client.chat.completions.create(**CHAT)
    finished = engine.finished.wait_for(3)
    assert [r.key_id for r in finished] == [service.id, alice.id, "subject:user-7"]


def test_acting_as_a_subject_charges_that_subject(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    url, _ = served
    _, key = engine.key(name="alice")
    # Bound by the app inside a request whose caller sent a key: the innermost wins.
    for headers in ({}, as_caller(key)):
        assert httpx.get(url + "/as/user-42", headers=headers).status_code == 200
    finished = engine.finished.wait_for(2)
    assert [(r.key_id, r.subject_id, r.key_prefix) for r in finished] == [
        ("subject:user-42", "user-42", "")] * 2


def test_an_unknown_credential_is_the_sdks_authentication_error(
    engine: Engine, fake: FakeUpstream
) -> None:
    with pytest.raises(openai.AuthenticationError):
        engine.sync_client(key="llmg_not-a-key").chat.completions.create(**CHAT)
    with pytest.raises(openai.NotFoundError) as not_served:  # a path the engine does not serve
        engine.sync_client(key="llmg_x").files.list()
    assert not_served.value.response.headers["x-request-id"]
    assert fake.requests == []


# ---- failures, early closes and loops ----------------------------------------------------

def test_an_engine_failure_is_an_openai_shaped_500(
    engine: Engine, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, key = engine.key()

    async def broken(exchange: object) -> object:
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(engine.gateway, "respond", broken)
    with pytest.raises(openai.InternalServerError) as raised:
        engine.sync_client(key=key).chat.completions.create(**CHAT)
    assert raised.value.code == "gateway_error" and "bug" not in str(raised.value)
    [record] = engine.finished.wait_for(1)
    assert (record.status, record.error_code) == (500, "gateway_error")


def test_a_stream_closed_early_is_recorded_as_the_caller_leaving(
    engine: Engine, fake: FakeUpstream
) -> None:
    _, key = engine.key()
    paced = {"x-fake-chunks": "6", "x-fake-chunk-delay-ms": "50"}
    with engine.sync_client(key=key).chat.completions.create(
            **CHAT, stream=True, extra_headers=paced) as stream:
        next(iter(stream))
    [record] = engine.finished.wait_for(1)
    assert (record.status, record.error_code) == (499, "client_disconnected")


def test_async_calls_on_another_loop_are_handed_to_the_engines(
    engine: Engine, fake: FakeUpstream
) -> None:
    _, key = engine.key()
    engine.sync_client(key=key).chat.completions.create(**CHAT)  # the engine's own thread

    async def elsewhere() -> None:
        client = engine.async_client(key=key)
        completion = await client.chat.completions.create(**CHAT)
        assert completion.choices[0].message.content
        stream = await client.chat.completions.create(**CHAT, stream=True)
        assert len([chunk async for chunk in stream]) > 2

    asyncio.run(elsewhere())
    finished = engine.finished.wait_for(3)
    assert [(r.status, r.error_code) for r in finished] == [(200, None)] * 3


def test_a_sync_call_on_the_engines_own_loop_is_refused_not_hung(
    engine: Engine, served: tuple[str, openai.OpenAI], fake: FakeUpstream
) -> None:
    url, _ = served
    _, key = engine.key()
    assert httpx.get(url + "/async", headers=as_caller(key)).status_code == 200
    refused = httpx.get(url + "/blocking", headers=as_caller(key), timeout=5)
    assert refused.status_code == 403 and "run_in_threadpool" in refused.json()["message"]


# ---- the example app, as a user runs it --------------------------------------------------

def test_the_example_app_runs_governed(tmp_path: Path, fake_url: str,
                                       fake: FakeUpstream) -> None:
    settings = make_settings(tmp_path, fake_url)
    record, key = create_key(settings.database_url, name="alice")
    port = free_port()
    env = {**os.environ, "DATABASE_URL": settings.database_url,
           "VENICE_API_KEY": PROVIDER_KEY, "VENICE_BASE_URL": fake_url,
           "ADMIN_BIND_ADDR": "off", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "examples.inprocess_app:create_app",
         "--port", str(port), "--log-level", "warning"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base + "/healthz", process)
        headers = {"x-gateway-key": key}
        assert httpx.get(base + "/ask", params={"q": "hi"}, headers=headers).json()["answer"]
        assert httpx.get(base + "/ask-async", params={"q": "hi"}, headers=headers).json()
        assert httpx.get(base + "/story", params={"q": "hi"}, headers=headers).text
        assert httpx.get(base + "/ask", params={"q": "hi"}).status_code == 401
        assert httpx.get(base + "/me/user-42/ask", params={"q": "hi"}).json()["answer"]
    finally:
        stop_process(process)
    stored = usage_records(settings.database_url)
    assert [(r.key_id, r.adapter) for r in stored] == [(record.id, "httpx")] * 3 + [
        ("subject:user-42", "httpx")]
    assert all(seen.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
               for seen in fake.requests)


def test_a_stream_dropped_without_closing_still_finishes_once(
    engine: Engine, fake: FakeUpstream
) -> None:
    _, key = engine.key()
    http = httpx.Client(transport=GatewayTransport(engine.gateway, key=key))
    request = http.build_request("POST", BASE_URL + "/chat/completions",
                                 json={**CHAT, "stream": True},
                                 headers={"x-fake-chunks": "6", "x-fake-chunk-delay-ms": "50"})
    response = http.send(request, stream=True)
    assert next(response.iter_raw()).startswith(b"data: ")
    del response
    gc.collect()
    [record] = engine.finished.wait_for(1)
    assert (record.status, record.error_code) == (499, "client_disconnected")


def test_the_inbound_credential_is_read_from_the_chosen_header() -> None:
    header = b"x-gateway-key"
    assert inbound_identity([(b"X-Gateway-Key", b"llmg_a")], header) == Identity("llmg_a")
    assert inbound_identity([(header, b"Bearer llmg_b")], header) == Identity("llmg_b")
    assert inbound_identity([(b"authorization", b"Bearer e.y.j")], b"authorization") == \
        Identity("e.y.j")
    assert inbound_identity([(header, b" ")], header) is None
    assert inbound_identity([(b"authorization", b"Bearer llmg_c")], header) is None
    with pytest.raises(ValueError):
        acting_as(subject="a", key="b").__enter__()
    with pytest.raises(ValueError):
        acting_as().__enter__()
