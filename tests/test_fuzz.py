"""Generated requests, thrown at the ASGI app and at the sidecar's request hooks: whatever
the body and headers, the answer is a well-formed HTTP response, errors are OpenAI-shaped
(``{"error": {"message", "type", "code"}}``), nothing hangs and nothing fails with a
traceback (the gateway logs no exception either).

Both run a real engine (``build_gateway``) against the fake upstream, so admitted requests
are really sent. The app is driven with raw ASGI calls, the addon with mitmproxy's test
flows in the order mitmproxy calls its hooks; each call is bounded by ``CALL_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from asgi_middleware import create_app
from llm_gateway.adapters.mitm_addon import GatewayAddon
from llm_gateway.engine import Gateway
from llm_gateway.keys import new_key_record
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.fuzzing import fuzz_settings

CALL_TIMEOUT = 10.0
# Generated requests carry this where a valid key goes; each call puts a fresh key there,
# so the engine's per-key guards (rate limit, pause after failures) never pile up.
KEY = "llmg_FUZZ_PLACEHOLDER"
FUZZ = fuzz_settings(400)  # derandomized: the same requests on every run (tests/fuzzing.py)
pytestmark = pytest.mark.slow_once  # the second pass (Postgres, Redis) adds nothing to it

# ---- what is generated -------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=12,
)
# Mostly plausible values, so that requests get past validation to the upstream; odd ones
# (any JSON) a third of the time.
MODELS = st.one_of(st.sampled_from(["llama-3.3-70b", "text-embedding-bge-m3"]),
                   st.sampled_from(["llama-3.3-70b", "", "gpt-4o", "x" * 300]), JSON)
ROLES = st.sampled_from(["user", "system", "assistant", "tool"])
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": st.text(max_size=40)}) | st.dictionaries(
    st.sampled_from(["role", "content", "name", "tool_calls"]), JSON, max_size=3)
MESSAGES = st.lists(MESSAGE, min_size=1, max_size=3) | st.lists(MESSAGE, max_size=3) | JSON
CHAT = st.fixed_dictionaries({"model": MODELS, "messages": MESSAGES}, optional={
    "stream": st.booleans() | st.booleans() | JSON,
    "max_tokens": st.integers(-10, 10**7) | JSON,
    "input": st.text(max_size=20) | st.lists(st.text(max_size=10), max_size=3) | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
    "temperature": st.floats(0, 2) | JSON,
})


def nested(depth: int, opener: str) -> bytes:
    closer = {"[": "]", '{"a":': "}"}[opener]
    value = opener * depth + "1" + closer * depth
    return f'{{"model": "llama-3.3-70b", "messages": {value}}}'.encode()


def duplicated(models: tuple[object, object]) -> bytes:
    first, second = (json.dumps(model) for model in models)
    return (f'{{"model": {first}, "model": {second}, '
            f'"messages": [{{"role": "user", "content": "hi"}}]}}').encode()


VALID = st.one_of(
    st.fixed_dictionaries({
        "model": st.just("llama-3.3-70b"),
        "messages": st.lists(st.fixed_dictionaries({"role": ROLES, "content": st.text()}),
                             min_size=1, max_size=3),
    }, optional={"stream": st.booleans(), "max_tokens": st.integers(1, 100)}),
    st.fixed_dictionaries({"model": st.just("text-embedding-bge-m3"),
                           "input": st.text() | st.lists(st.text(), min_size=1, max_size=3)}),
)
BODIES = st.one_of(
    VALID.map(lambda body: json.dumps(body).encode()),
    CHAT.map(lambda chat: json.dumps(chat).encode()),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=120),
    st.builds(nested, st.integers(1, 5000), st.sampled_from(["[", '{"a":'])),
    st.tuples(MODELS, MODELS).map(duplicated),
    st.just(b""),
)
PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
# What a header value may hold on the wire (obs-text included): encoded as latin-1.
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF,
                              exclude_characters="\x7f"), max_size=60)
TOKEN = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20).filter(
    lambda name: not name.startswith("x-fake"))  # the fake upstream's own fault switches
ENDPOINTS = ["/chat/completions", "/embeddings", "/models", "", "/", "/x", "/chat/completions/x"]
METHODS = st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE", "OPTIONS", "HEAD"])


def header_sets(max_size: int = 8) -> st.SearchStrategy[list[tuple[str, str]]]:
    authorization = st.one_of(st.just(f"Bearer {KEY}"), VALUE.map("Bearer ".__add__), VALUE)
    header = st.one_of(
        st.tuples(st.just("authorization"), authorization),
        st.tuples(st.just("content-type"), st.sampled_from(
            ["application/json", "application/json; charset=utf-8", "text/plain", ""])
            | PRINTABLE),
        st.tuples(st.sampled_from(["content-encoding", "accept-encoding"]),
                  st.sampled_from(["gzip", "br", "deflate", "identity", "zstd"]) | PRINTABLE),
        st.tuples(st.just("transfer-encoding"), st.just("chunked")),
        st.tuples(st.sampled_from(["accept", "x-request-id", "openai-organization"]), VALUE),
        st.tuples(TOKEN, VALUE),
    )
    return st.lists(header, max_size=max_size)


@dataclass(frozen=True)
class Generated:
    method: str
    path: str  # under the API root
    headers: list[tuple[str, str]]
    body: bytes


def requests() -> st.SearchStrategy[Generated]:
    """Two thirds aimed (a POST to an endpoint the gateway serves, with a valid key and a
    JSON content type, and then anything), one third anything at all."""

    def build(method: str, path: str, headers: list[tuple[str, str]], body: bytes,
              length: bool) -> Generated:
        framing = [("content-length", str(len(body)))] if length else []
        return Generated(method, path, headers + framing, body)

    aimed = st.builds(
        build, st.just("POST"), st.sampled_from(["/chat/completions", "/embeddings"]),
        header_sets(max_size=3).map(lambda headers: [
            ("authorization", f"Bearer {KEY}"), ("content-type", "application/json"),
            *headers]),
        BODIES, st.booleans())
    paths = st.sampled_from(ENDPOINTS) | PRINTABLE.map(lambda text: "/" + text.lstrip("/"))
    anything = st.builds(build, METHODS, paths, header_sets(), BODIES, st.booleans())
    # one_of picks its branches evenly and drops repeated ones: weighted by distinct copies.
    return st.one_of(aimed, aimed.map(lambda generated: generated), anything)


def hostile() -> list[Generated]:
    """Inputs from the issue's attacks, tried on every run whatever is generated."""
    aimed = [("authorization", f"Bearer {KEY}"), ("content-type", "application/json")]
    return [
        Generated("POST", "/chat/completions", aimed, nested(5000, "[")),
        Generated("POST", "/chat/completions", aimed, nested(5000, '{"a":')),
        Generated("POST", "/chat/completions", aimed, duplicated(("other", "llama-3.3-70b"))),
        Generated("POST", "/chat/completions", [*aimed, ("content-encoding", "gzip")],
                  b"not gzip at all"),
        Generated("POST", "/chat/completions", aimed, json.dumps(
            {"model": "m" * 100_000, "messages": [{"role": "user", "content": "hi"}]}).encode()),
        Generated("POST", "/chat/completions", aimed, json.dumps(
            {"model": "llama-3.3-70b", "stream": True,
             "messages": [{"role": "user", "content": "hi"}]}).encode()),
    ]


def fuzzed(check: object) -> object:
    """``check`` as a hypothesis test: the hostile inputs, then generated ones."""
    for generated in hostile():
        check = example(generated=generated)(check)  # type: ignore[arg-type]
    return FUZZ(given(generated=requests())(check))  # type: ignore[arg-type]


# ---- what every answer must be ---------------------------------------------------------


def assert_well_formed(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    assert 100 <= status <= 599, status
    for name, value in headers:
        assert name and not any(byte in b"\r\n :" for byte in name), name
        assert b"\r" not in value and b"\n" not in value, value
    assert b"Traceback" not in body
    content_type = dict((name.lower(), value) for name, value in headers).get(
        b"content-type", b"")
    if status >= 400:
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str) and error["message"], error
        assert isinstance(error["type"], str) and error["type"], error
        assert error["code"] is None or isinstance(error["code"], str), error
    elif content_type.startswith(b"application/json"):
        json.loads(body)
    elif content_type.startswith(b"text/event-stream"):
        body.decode("utf-8")


class FailureLog(logging.Handler):
    """Every record the gateway logs with a traceback, or as an error."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("llm_gateway") and not record.name.startswith(
                "llm_gateway.testing"):
            self.failures.append(self.format(record))


@contextlib.contextmanager
def nothing_logged() -> Iterator[None]:
    handler = FailureLog()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
    assert not handler.failures, "\n".join(handler.failures)


# ---- the engine, on a loop of the test's own ----------------------------------------------


@dataclass
class Running:
    loop: asyncio.AbstractEventLoop
    gateway: Gateway

    def run(self, call: object) -> object:
        return self.loop.run_until_complete(
            asyncio.wait_for(call, CALL_TIMEOUT))  # type: ignore[arg-type]

    async def with_fresh_key(self, generated: Generated) -> Generated:
        record, key = new_key_record(name="fuzz", subject_id=None, now=time.time())
        await self.gateway.store.insert_key(record)
        headers = [(name, value.replace(KEY, key)) for name, value in generated.headers]
        return dataclasses.replace(generated, headers=headers)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def started(loop: asyncio.AbstractEventLoop, directory: Path, upstream: str) -> Running:
    gateway = build_gateway(make_settings(directory, upstream))
    loop.run_until_complete(gateway.start())
    return Running(loop, gateway)


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop, fake_server: tuple[FakeUpstream, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = started(loop, tmp_path_factory.mktemp("fuzz-asgi"), fake_server[1])
    yield running
    loop.run_until_complete(running.gateway.close())


# ---- the ASGI app ------------------------------------------------------------------------


async def call_app(engine: Running, app: object, generated: Generated,
                   ) -> tuple[int, list, bytes]:
    generated = await engine.with_fresh_key(generated)
    path, _, query = ("/v1" + generated.path).partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": generated.method, "scheme": "http", "path": path,
        "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(name.encode(), value.encode("latin-1"))
                    for name, value in generated.headers],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 3000),
    }
    pieces = [generated.body[:7], generated.body[7:]]  # the body in two messages
    sent: list[dict] = []

    async def receive() -> dict:
        if pieces:
            body = pieces.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pieces)}
        await asyncio.Event().wait()  # the client stays: no disconnect
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)  # type: ignore[operator]
    starts = [message for message in sent if message["type"] == "http.response.start"]
    bodies = [message for message in sent if message["type"] == "http.response.body"]
    assert len(starts) == 1 and sent[0] is starts[0], sent
    assert bodies and not bodies[-1].get("more_body", False), "the response never ended"
    body = b"".join(message.get("body", b"") for message in bodies)
    return starts[0]["status"], list(starts[0].get("headers", [])), body


@pytest.fixture(scope="module")
def app(engine: Running) -> object:
    return create_app(engine.gateway.settings, gateway=engine.gateway)


def test_the_asgi_app_answers_anything_well(engine: Running, app: object) -> None:
    def check(generated: Generated) -> None:
        with nothing_logged():
            status, headers, body = engine.run(  # type: ignore[misc]
                call_app(engine, app, generated))
        assert_well_formed(status, headers, body)

    fuzzed(check)()  # type: ignore[operator]


# ---- the sidecar's request hooks ----------------------------------------------------------


@pytest.fixture(scope="module")
def addon(loop: asyncio.AbstractEventLoop, fake_server: tuple[FakeUpstream, str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayAddon, Running]]:
    running = started(loop, tmp_path_factory.mktemp("fuzz-sidecar"), fake_server[1])
    gateway_addon = GatewayAddon(running.gateway)
    loop.run_until_complete(gateway_addon.running())
    yield gateway_addon, running
    loop.run_until_complete(gateway_addon.done())


async def call_hooks(engine: Running, addon: GatewayAddon, generated: Generated,
                     ) -> tuple[int, list, bytes]:
    generated = await engine.with_fresh_key(generated)
    flow = tflow.tflow(req=tutils.treq(
        host="api.venice.ai", port=443, scheme=b"https", method=generated.method.encode(),
        path=("/api/v1" + generated.path).encode(),
        headers=http.Headers([(name.encode(), value.encode("latin-1"))
                              for name, value in generated.headers]),
        content=generated.body,
    ))
    addon.requestheaders(flow)
    await addon.request(flow)
    if flow.response is not None:
        # An answer set by an addon: mitmproxy emulates responseheaders, then response.
        addon.responseheaders(flow)
        addon.response(flow)
        return flow.response.status_code, flow.response.headers.fields, flow.response.content
    # Forwarded: never to the provider as the caller sent it; fetch what mitmproxy would.
    assert flow.request.host != "api.venice.ai", "forwarded unchanged"
    request = flow.request
    async with httpx.AsyncClient() as client:
        answer = await client.request(request.method, request.url, content=request.raw_content,
                                      headers=list(request.headers.items(multi=True)))
    return answer.status_code, answer.headers.raw, answer.content


def test_the_sidecar_hooks_answer_anything_well(
        addon: tuple[GatewayAddon, Running]) -> None:
    gateway_addon, engine = addon

    def check(generated: Generated) -> None:
        with nothing_logged():
            status, headers, body = engine.run(  # type: ignore[misc]
                call_hooks(engine, gateway_addon, generated))
        assert_well_formed(status, headers, body)

    fuzzed(check)()  # type: ignore[operator]
