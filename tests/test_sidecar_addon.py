"""The addon's hooks driven directly with mitmproxy's test flows: the paths that real
traffic rarely takes (compressed streams, hooks that fail after headers, options an
operator set that would undo the addon's guarantees)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from mitmproxy import exceptions, http
from mitmproxy.addons import next_layer, proxyserver
from mitmproxy.connection import ConnectionState
from mitmproxy.test import taddons, tflow, tutils

from llm_gateway.adapters.mitm_addon import GatewayAddon
from llm_gateway.adapters.mitm_relay import TOKEN_HEADER
from llm_gateway.billing.metering import UsageRecord
from llm_gateway.engine import Gateway
from llm_gateway.keys import new_key_record
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings

UPSTREAM = "http://127.0.0.1:9/api/v1"  # never connected to: these flows are simulated
CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}


def sse_reply() -> bytes:
    chunk = {"id": "chatcmpl-1", "model": "llama-3.3-70b",
             "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


_SINKS: dict[int, RecordedUsage] = {}


def recording(gateway: Gateway) -> Gateway:
    _SINKS[id(gateway)] = sink = RecordedUsage()
    gateway.add_record_sink(sink)
    return gateway


def finished(gateway: Gateway) -> list[UsageRecord]:
    """The usage records of the requests that finished so far."""
    return _SINKS[id(gateway)].records


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    engine = recording(build_gateway(make_settings(tmp_path, UPSTREAM), key_cache_seconds=0))
    await engine.start()
    yield engine
    await engine.close()


async def new_key(gateway: Gateway) -> str:
    record, key = new_key_record(name="unit", subject_id=None, now=time.time())
    await gateway.store.insert_key(record)
    return key


def llm_flow(key: str, body: object, path: str = "/api/v1/chat/completions") -> http.HTTPFlow:
    request = tutils.treq(
        host="api.venice.ai", port=443, scheme=b"https", method=b"POST", path=path.encode(),
        headers=http.Headers([(b"authorization", f"Bearer {key}".encode()),
                              (b"content-type", b"application/json")]),
        content=json.dumps(body).encode(),
    )
    return tflow.tflow(req=request)


async def admitted_flow(addon: GatewayAddon, key: str, body: object) -> http.HTTPFlow:
    """An admitted stream, forwarded to the engine's relay: a single-use token and nothing
    of the caller's request (its key least of all)."""
    flow = llm_flow(key, body)
    addon.requestheaders(flow)
    await addon.request(flow)
    assert flow.response is None, flow.response and flow.response.text
    assert flow.request.host == "127.0.0.1" and flow.request.path == "/relay"
    assert {name.lower() for name in flow.request.headers} == {
        TOKEN_HEADER, "content-length", "host"}
    assert flow.request.content == b""
    return flow


async def relayed(flow: http.HTTPFlow) -> httpx.Response:
    """What mitmproxy would fetch from the relay for ``flow``."""
    async with httpx.AsyncClient() as client:
        return await client.post(flow.request.url,
                                 headers={TOKEN_HEADER: flow.request.headers[TOKEN_HEADER]})


def test_configure_enforces_lazy_connections_and_allowed_hosts(tmp_path: Path) -> None:
    addon = GatewayAddon(build_gateway(
        make_settings(tmp_path, "https://venice.example:8443/api/v1")))
    with taddons.context(proxyserver.Proxyserver(), next_layer.NextLayer(), addon) as context:
        context.configure(addon, connection_strategy="eager")
        options = context.options
        assert options.connection_strategy == "lazy" and options.upstream_cert is False
        assert options.rawtcp is False  # never relayed raw from an intercepted host
        # The LLM hosts, then the known hosts no provider serves (refused, not tunnelled).
        assert options.allow_hosts[:2] == [r"^api\.venice\.ai:\d+$", r"^venice\.example:8443$"]
        assert r"^api\.openai\.com:\d+$" in options.allow_hosts[2:]
        assert r"^[a-z0-9-]+\.openai\.azure\.com:\d+$" in options.allow_hosts
        assert len(set(options.allow_hosts)) == len(options.allow_hosts)
        with pytest.raises(exceptions.OptionsError, match="ignore_hosts"):
            context.configure(addon, ignore_hosts=["api.venice.ai"])
        context.configure(addon, mode=["reverse:http://127.0.0.1:1"])
        assert options.allow_hosts == []  # a reverse proxy serves the gateway only


@contextlib.asynccontextmanager
async def upstream_answering(handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                             ) -> AsyncIterator[str]:
    """A real upstream on loopback, for the requests the engine sends itself."""
    app = web.Application()
    app.router.add_post("/api/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        await runner.cleanup()


async def engine_for(tmp_path: Path, upstream: str) -> Gateway:
    engine = recording(build_gateway(make_settings(tmp_path, upstream, venice_max_retries=0),
                                     key_cache_seconds=0))
    await engine.start()
    return engine


async def test_a_stream_goes_through_the_relay_decoded_and_observed(tmp_path: Path) -> None:
    """The provider compresses anyway: the engine decodes, observes and relays; the
    usage chunk nobody asked for stays with the gateway."""
    async def sse(request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(sse_reply()), content_type="text/event-stream",
                            headers={"content-encoding": "gzip"})

    async with upstream_answering(sse) as upstream:
        gateway = await engine_for(tmp_path, upstream)
        addon = GatewayAddon(gateway)
        try:
            await addon.start()
            flow = await admitted_flow(addon, await new_key(gateway), {**CHAT, "stream": True})
            response = await relayed(flow)
            assert response.status_code == 200 and "content-encoding" not in response.headers
            assert response.content == sse_reply()  # one frame: content and usage together
            [record] = finished(gateway)
            assert (record.total_tokens, record.finish_reasons, record.error_code) == (
                4, ["stop"], None)
            again = await relayed(flow)  # a token serves once
            assert again.status_code == 404
        finally:
            await addon.done()


async def test_an_unreachable_upstream_is_answered_by_the_relay_and_recorded(
    tmp_path: Path,
) -> None:
    gateway = await engine_for(tmp_path, UPSTREAM)
    addon = GatewayAddon(gateway)
    try:
        await addon.start()
        flow = await admitted_flow(addon, await new_key(gateway), {**CHAT, "stream": True})
        response = await relayed(flow)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_unreachable"
        [record] = finished(gateway)
        assert (record.status, record.error_code) == (502, "upstream_unreachable")
    finally:
        await addon.done()


async def test_a_stream_that_never_reached_the_relay_is_finished_by_the_error_hook(
    gateway: Gateway,
) -> None:
    addon = GatewayAddon(gateway)
    await addon.start()
    flow = await admitted_flow(addon, await new_key(gateway), {**CHAT, "stream": True})
    flow.error = tflow.terr("Connection refused")
    addon.error(flow)
    [record] = finished(gateway)
    assert (record.status, record.error_code) == (502, "gateway_error")


async def test_a_stream_nobody_asked_for_is_answered_whole(tmp_path: Path) -> None:
    async def sse(request: web.Request) -> web.Response:
        return web.Response(body=sse_reply(), content_type="text/event-stream")

    async with upstream_answering(sse) as upstream:
        gateway = await engine_for(tmp_path, upstream)
        try:
            addon = GatewayAddon(gateway)
            flow = llm_flow(await new_key(gateway), CHAT)  # not a stream
            addon.requestheaders(flow)
            await addon.request(flow)
            assert flow.response is not None and flow.response.status_code == 200
            assert flow.response.content == sse_reply()
            assert flow.response.headers["content-length"] == str(len(sse_reply()))
            assert flow.request.host == "api.venice.ai"  # answered, not rewritten
            assert finished(gateway) == []  # finished once mitmproxy answers
            addon.responseheaders(flow)
            addon.response(flow)
            addon.response(flow)
            [record] = finished(gateway)
            assert (record.status, record.total_tokens, record.finish_reasons) == (
                200, 4, ["stop"])
        finally:
            await gateway.close()


async def test_a_client_gone_while_the_engine_waits_is_recorded(tmp_path: Path) -> None:
    hung_up = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if request.transport is None or request.transport.is_closing():
                hung_up.set()
                break
            await asyncio.sleep(0.02)
        return web.Response(body=b"{}", content_type="application/json")

    async with upstream_answering(slow) as upstream:
        gateway = await engine_for(tmp_path, upstream)
        try:
            addon = GatewayAddon(gateway)
            flow = llm_flow(await new_key(gateway), CHAT)
            addon.requestheaders(flow)
            asyncio.get_running_loop().call_later(
                0.2, setattr, flow.client_conn, "state", ConnectionState.CLOSED)
            started = time.monotonic()
            await addon.request(flow)
            assert time.monotonic() - started < 1
            assert flow.error is not None and flow.error.msg == flow.error.KILLED_MESSAGE
            [record] = finished(gateway)
            assert (record.status, record.error_code) == (499, "client_disconnected")
            addon.error(flow)  # mitmproxy reports the killed flow: finished already
            assert len(finished(gateway)) == 1
            await asyncio.wait_for(hung_up.wait(), 5)  # the upstream request was dropped
        finally:
            await gateway.close()


async def test_a_request_before_the_engine_exists_is_answered_not_forwarded() -> None:
    addon = GatewayAddon()  # configure() never ran: no engine
    flow = llm_flow("llmg_whatever", CHAT)
    addon.requestheaders(flow)
    await addon.request(flow)
    assert flow.response is not None and flow.response.status_code == 500
    assert json.loads(flow.response.content or b"")["error"]["code"] == "gateway_error"
    assert flow.request.headers["authorization"] == "Bearer llmg_whatever"  # not rewritten


async def test_a_flow_that_skipped_requestheaders_is_still_checked(gateway: Gateway) -> None:
    addon = GatewayAddon(gateway)
    flow = llm_flow("llmg_not-a-real-key", CHAT)
    await addon.request(flow)  # no requestheaders first
    assert flow.response is not None and flow.response.status_code == 401
    assert flow.request.host == "api.venice.ai"  # not rewritten, and answered
    other = tflow.tflow(req=tutils.treq(host="example.com", port=80))
    await addon.request(other)
    assert other.response is None and other.request.headers["header"] == "qvalue"
