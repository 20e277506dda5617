"""A realistic fake OpenAI/Venice-compatible upstream, shipped with the project.

It is used by the test-suite, by ``llm-gateway demo`` and by benchmarks, so it is a pure ASGI app
(no framework) that does no per-request logging and never sleeps unless a delay is configured.

What it speaks, under ``api_prefix`` (default ``/api/v1``, like ``https://api.venice.ai/api/v1``):

* ``POST /chat/completions`` -- JSON or SSE (``"stream": true``) replies with deterministic content
  (see :func:`fake_reply_text`), usage, and in ``usage_mode="venice"`` Venice's ``usage.cost``.
* ``POST /embeddings`` -- deterministic unit vectors, ``float`` or ``base64`` encoded.
* ``GET /models`` -- a small Venice-like catalogue (:data:`FAKE_MODELS`).
* any other path under the prefix -- a 200 "billing" body carrying :data:`BILLING_SECRET`, so
  tests can prove a gateway never lets such a request through.

Every endpoint requires ``Authorization: Bearer <api_key>``. Failures are injected with
:meth:`FakeUpstream.push_fault`; every request is recorded in :attr:`FakeUpstream.requests`.

Run it standalone with ``python -m llm_gateway.testing.fake_upstream --port 3001``.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from llm_gateway.asgi_types import answer_lifespan

__all__ = [
    "BILLING_SECRET",
    "DEFAULT_FAKE_API_KEY",
    "FAKE_MODELS",
    "WORDS_PER_CHUNK",
    "DeliberateConnectionCut",
    "FakeModel",
    "FakeUpstream",
    "Fault",
    "RecordedRequest",
    "fake_cost",
    "fake_reply_chunk",
    "fake_reply_text",
    "main",
    "running_fake_upstream",
    "serve_fake_upstream",
]

ASGIScope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
ASGIReceive = Callable[[], Awaitable[ASGIMessage]]
ASGISend = Callable[[ASGIMessage], Awaitable[None]]

DEFAULT_FAKE_API_KEY = "sk-fake-upstream"
BILLING_SECRET = "you should never see this through the gateway"
ERROR_SHAPES = ("venice", "openai")
USAGE_MODES = ("venice", "openai")

# Every reply chunk is "This is chunk N of the fake reply." -- eight words, which is also the number
# of completion tokens the fake charges per chunk.
WORDS_PER_CHUNK = 8

# Prices in the ballpark of Venice's llama-3.3-70b. The DIEM rates deliberately differ from the USD
# rates so a test can tell which of the two fields a gateway actually read.
USD_PER_PROMPT_TOKEN = 0.7e-6
USD_PER_COMPLETION_TOKEN = 2.8e-6
DIEM_PER_PROMPT_TOKEN = 0.5e-6
DIEM_PER_COMPLETION_TOKEN = 2.0e-6

DEFAULT_EMBEDDING_DIMENSIONS = 8

# What Fault.malformed_frame slips into a stream: looks like a JSON frame, does not parse.
MALFORMED_SSE_FRAME = b"data: {not json\n\n"
SSE_DONE_FRAME = b"data: [DONE]\n\n"

# Which header makes the fake deviate from its configured stream shape for one request. Gateways
# forward unknown headers untouched, so tests can steer the fake through a gateway with them.
CHUNK_COUNT_HEADER = "x-fake-chunks"
CHUNK_DELAY_MS_HEADER = "x-fake-chunk-delay-ms"

_JSON_CONTENT_TYPE = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
]


@dataclass(frozen=True)
class FakeModel:
    id: str
    type: str  # Venice's model type: "text" or "embedding"
    created: int


FAKE_MODELS: tuple[FakeModel, ...] = (
    FakeModel("llama-3.3-70b", "text", 1733768349),
    FakeModel("venice-uncensored", "text", 1742262554),
    FakeModel("qwen3-4b", "text", 1745903059),
    FakeModel("text-embedding-bge-m3", "embedding", 1739468485),
)


@dataclass
class Fault:
    """A failure applied to the next ``times`` requests whose path matches.

    Faults apply only to authenticated requests under the API prefix, so a stray bad-key request
    cannot use one up. The stream faults (``cut_after_chunks``, ``malformed_frame``,
    ``inband_error``) have non-stream counterparts so a fault is never silently wasted: a JSON
    response is cut halfway through its body, replaced by ``{not json``, or replaced by
    ``{"error": "<text>"}`` with status 200, respectively.
    """

    status: int | None = None  # answer with this HTTP status instead of success
    shape: str = "venice"  # "venice" -> {"error": msg}; "openai" -> {"error": {message,type,code}}
    message: str = "Upstream failure injected by the fake"
    retry_after: str | None = None  # Retry-After header value on the error
    delay: float = 0.0  # seconds to wait before sending response headers (for timeout tests)
    cut_after_chunks: int | None = None  # stream: send this many content chunks, then drop
    malformed_frame: bool = False  # stream: insert a `data: {not json` frame mid-stream
    inband_error: str | None = None  # stream: 200, then `data: {"error": text}`, then [DONE]
    path: str | None = None  # only requests whose path ends with this; None = any
    times: int = 1

    def __post_init__(self) -> None:
        if self.shape not in ERROR_SHAPES:
            raise ValueError(f"Fault.shape must be one of {ERROR_SHAPES}, not {self.shape!r}")
        if self.times < 1:
            raise ValueError("Fault.times must be at least 1")
        if self.cut_after_chunks is not None and self.cut_after_chunks < 0:
            raise ValueError("Fault.cut_after_chunks must not be negative")


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    json: object | None  # the parsed body, or None when it is empty or not JSON
    received_at: float  # time.monotonic() once the whole body was read
    chunk_sent_at: list[float] = field(default_factory=list)  # monotonic, per SSE content chunk
    # True when the client hung up while the fake was deliberately waiting (fault delay or chunk
    # delay). Without a delay the fake never waits, so it cannot notice and this stays False.
    client_hung_up: bool = False


class DeliberateConnectionCut(Exception):
    """Raised from the ASGI app to drop a connection mid-response (``Fault.cut_after_chunks``).

    The server then closes the socket without the terminating chunk, so the client sees a broken
    response rather than a clean end. Its traceback is filtered out of uvicorn's error log.
    """


class _HideDeliberateCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[1] if record.exc_info else None
        return not isinstance(raised, DeliberateConnectionCut)


_HIDE_DELIBERATE_CUTS = _HideDeliberateCuts()


def _hide_deliberate_cut_tracebacks() -> None:
    # uvicorn logs "Exception in ASGI application" with the traceback on "uvicorn.error".
    server_error_log = logging.getLogger("uvicorn.error")
    if _HIDE_DELIBERATE_CUTS not in server_error_log.filters:
        server_error_log.addFilter(_HIDE_DELIBERATE_CUTS)


# --- deterministic content -------------------------------------------------------------------


def fake_reply_chunk(index: int) -> str:
    """The content of stream chunk ``index``; chunks after the first carry a leading space."""
    sentence = f"This is chunk {index} of the fake reply."
    return sentence if index == 0 else " " + sentence


def fake_reply_text(chunk_count: int) -> str:
    """The whole reply: what a non-stream answer contains and what the stream chunks add up to."""
    return "".join(fake_reply_chunk(index) for index in range(chunk_count))


def fake_cost(prompt_tokens: int, completion_tokens: int) -> dict[str, float]:
    """Venice's ``usage.cost`` object as the fake computes it."""
    usd = prompt_tokens * USD_PER_PROMPT_TOKEN + completion_tokens * USD_PER_COMPLETION_TOKEN
    diem = prompt_tokens * DIEM_PER_PROMPT_TOKEN + completion_tokens * DIEM_PER_COMPLETION_TOKEN
    # Rounded so the numbers survive a JSON round trip and compare equal in tests.
    return {"diem": round(diem, 10), "usd": round(usd, 10)}


def _count_words(text: str) -> int:
    return len(text.split())


def _prompt_word_count(messages: list[object]) -> int:
    """Roughly the prompt tokens: the words in every text content, plain or multi-part."""
    words = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += _count_words(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += _count_words(part["text"])
    return words


def _fake_embedding(model: str, text: str, dimensions: int) -> list[float]:
    """A unit vector derived from the text, so equal inputs embed equally."""
    raw = hashlib.shake_256(f"{model}\0{text}".encode()).digest(4 * dimensions)
    components = [value / 2**31 - 1.0 for value in struct.unpack(f"<{dimensions}I", raw)]
    norm = sum(component * component for component in components) ** 0.5 or 1.0
    # Six decimals keep the float and the float32/base64 encodings of a vector comparable.
    return [round(component / norm, 6) for component in components]


# --- error bodies ----------------------------------------------------------------------------

# OpenAI's (type, code) for an error status; anything unlisted below 500 is invalid_request_error.
_OPENAI_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    429: ("requests", "rate_limit_exceeded"),
}


def _error_payload(
    shape: str, status: int, message: str, *, param: str | None = None
) -> dict[str, object]:
    if shape == "openai":
        default_kind = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
        error_type, code = _OPENAI_ERROR_KINDS.get(status, default_kind)
        return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return {"error": message}


def _validation_error_payload(shape: str, param: str, problem: str) -> dict[str, object]:
    if shape == "openai":
        return _error_payload(shape, 400, problem, param=param)
    # Venice answers validation failures with zod-style issues.
    issue = {"code": "invalid_type", "path": [param], "message": problem}
    return {"error": "Invalid request", "issues": [issue]}


# --- ASGI plumbing ---------------------------------------------------------------------------


async def _read_body(receive: ASGIReceive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body  # the common single-message case, without building a list
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
    return b"".join(parts)


def _header_dict(raw_headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _parse_json(body: bytes) -> object | None:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return None


def _encode_json(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _sse_frame(payload: object) -> bytes:
    return b"data: " + _encode_json(payload) + b"\n\n"


async def _send_json(
    send: ASGISend,
    status: int,
    payload: object,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    body = _encode_json(payload)
    headers = [_JSON_CONTENT_TYPE, (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _ClientPresence:
    """Lets the fake wait without outliving a client that has hung up.

    Only created when the fake has something to wait for; the watcher task that listens for
    ``http.disconnect`` is started lazily on the first wait, so undelayed requests pay nothing.
    """

    __slots__ = ("_hung_up", "_receive", "_watcher")

    def __init__(self, receive: ASGIReceive) -> None:
        self._receive = receive
        self._hung_up = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    async def wait(self, seconds: float) -> bool:
        """Wait at least ``seconds``; return False as soon as the client hangs up instead."""
        # A monotonic deadline rather than one plain sleep: event-loop timers may fire a hair
        # early, and tests assert that chunk gaps are at least the configured delay.
        deadline = time.monotonic() + seconds
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch_for_hang_up())
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._hung_up.wait(), remaining)
            except TimeoutError:
                continue
            return False
        return not self._hung_up.is_set()

    async def _watch_for_hang_up(self) -> None:
        # The body has been read already, so the next message is the disconnect (the server also
        # reports one once the response is complete; by then nobody waits any more).
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._hung_up.set()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


@dataclass
class _QueuedFault:
    fault: Fault
    remaining: int


@dataclass
class _Exchange:
    """One request in flight: what was asked and how to answer."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body_json: object | None
    send: ASGISend
    presence: _ClientPresence
    recorded: RecordedRequest | None

    async def wait(self, seconds: float) -> bool:
        """Wait; False (and noted in the record) when the client hung up meanwhile."""
        still_connected = await self.presence.wait(seconds)
        if not still_connected and self.recorded is not None:
            self.recorded.client_hung_up = True
        return still_connected


# The endpoints the fake implements (relative to the prefix); every other path is "billing".
_ENDPOINT_METHODS = {"/chat/completions": "POST", "/embeddings": "POST", "/models": "GET"}


# --- the app ---------------------------------------------------------------------------------


class FakeUpstream:
    """An OpenAI/Venice-compatible upstream as a pure ASGI app.

    ``usage_mode`` selects the provider being imitated: "venice" always sends a usage chunk in
    streams and adds ``usage.cost``; "openai" sends stream usage only when the request asked for
    it with ``stream_options.include_usage`` and never adds cost. It also picks the shape of the
    fake's own errors (401, 400, 404, 405); injected faults choose theirs with ``Fault.shape``.
    """

    def __init__(
        self,
        api_key: str = DEFAULT_FAKE_API_KEY,
        *,
        api_prefix: str = "/api/v1",
        usage_mode: str = "venice",
        chunk_count: int = 8,
        chunk_delay: float = 0.0,
        record: bool = True,
    ) -> None:
        if usage_mode not in USAGE_MODES:
            raise ValueError(f"usage_mode must be one of {USAGE_MODES}, not {usage_mode!r}")
        if chunk_count < 0 or chunk_delay < 0:
            raise ValueError("chunk_count and chunk_delay must not be negative")
        self.api_key = api_key
        # Normalised to "/x/y" (or "" for the root) so prefix matching is a plain string test.
        self.api_prefix = "/" + api_prefix.strip("/") if api_prefix.strip("/") else ""
        self.usage_mode = usage_mode
        self.chunk_count = chunk_count
        self.chunk_delay = chunk_delay
        self.record = record
        self.requests: list[RecordedRequest] = []
        self.connections = 0  # incremented by the runner's protocol on every accepted connection
        self._expected_authorization = f"bearer {api_key}"
        self._faults: list[_QueuedFault] = []
        # Tests push faults from their thread while the server thread consumes them.
        self._fault_lock = threading.Lock()
        _hide_deliberate_cut_tracebacks()

    # -- test controls --

    def push_fault(self, fault: Fault) -> None:
        with self._fault_lock:
            self._faults.append(_QueuedFault(fault, fault.times))

    @property
    def pending_faults(self) -> list[Fault]:
        """Faults not yet used up, in the order they will be applied."""
        with self._fault_lock:
            return [queued.fault for queued in self._faults]

    def reset(self) -> None:
        with self._fault_lock:
            self._faults.clear()
        self.requests.clear()
        self.connections = 0

    def _take_fault(self, path: str) -> Fault | None:
        with self._fault_lock:
            for position, queued in enumerate(self._faults):
                if queued.fault.path is None or path.endswith(queued.fault.path):
                    queued.remaining -= 1
                    if queued.remaining == 0:
                        del self._faults[position]
                    return queued.fault
        return None

    # -- ASGI entry point --

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] != "http":
            await self._handle_non_http(scope, receive, send)
            return

        body = await _read_body(receive)
        headers = _header_dict(scope["headers"])
        body_json = _parse_json(body)
        method: str = scope["method"]
        path: str = scope["path"]
        query: str = scope.get("query_string", b"").decode("latin-1")
        recorded: RecordedRequest | None = None
        if self.record:
            recorded = RecordedRequest(
                method=method,
                path=path,
                query=query,
                headers=headers,
                body=body,
                json=body_json,
                received_at=time.monotonic(),
            )
            self.requests.append(recorded)

        prefix = self.api_prefix
        if path != prefix and not path.startswith(prefix + "/"):
            await _send_json(send, 404, _error_payload(self.usage_mode, 404, "Not found"))
            return
        if headers.get("authorization", "").lower() != self._expected_authorization:
            # Compared case-insensitively because the scheme is; fake keys are not secret.
            await self._send_unauthorized(send)
            return

        fault = self._take_fault(path) if self._faults else None
        exchange = _Exchange(
            method=method,
            path=path,
            query=query,
            headers=headers,
            body_json=body_json,
            send=send,
            presence=_ClientPresence(receive),
            recorded=recorded,
        )
        try:
            if fault is not None:
                if fault.delay > 0 and not await exchange.wait(fault.delay):
                    return
                if fault.status is not None:
                    await self._send_fault_status(send, fault)
                    return
            await self._route(exchange, path[len(prefix) :], fault)
        finally:
            exchange.presence.stop()

    async def _handle_non_http(
        self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend
    ) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _send_unauthorized(self, send: ASGISend) -> None:
        if self.usage_mode == "openai":
            message = "Incorrect API key provided."
        else:
            message = "Authentication failed"
        await _send_json(send, 401, _error_payload(self.usage_mode, 401, message))

    async def _send_fault_status(self, send: ASGISend, fault: Fault) -> None:
        assert fault.status is not None
        extra_headers: list[tuple[bytes, bytes]] = []
        if fault.retry_after is not None:
            extra_headers.append((b"retry-after", fault.retry_after.encode("latin-1")))
        payload = _error_payload(fault.shape, fault.status, fault.message)
        await _send_json(send, fault.status, payload, extra_headers)

    async def _route(self, exchange: _Exchange, endpoint: str, fault: Fault | None) -> None:
        expected_method = _ENDPOINT_METHODS.get(endpoint)
        if expected_method is None:
            await self._send_success_json(exchange, self._billing_payload(), fault)
        elif exchange.method != expected_method:
            payload = _error_payload(self.usage_mode, 405, "Method not allowed")
            await _send_json(exchange.send, 405, payload, [(b"allow", expected_method.encode())])
        elif endpoint == "/chat/completions":
            await self._chat_completions(exchange, fault)
        elif endpoint == "/embeddings":
            await self._embeddings(exchange, fault)
        else:
            await self._send_success_json(exchange, self._models_payload(exchange), fault)

    async def _send_success_json(
        self, exchange: _Exchange, payload: object, fault: Fault | None
    ) -> None:
        """Send a 200 JSON answer, or its non-stream counterpart of a stream fault."""
        send = exchange.send
        if fault is None:
            await _send_json(send, 200, payload)
        elif fault.inband_error is not None:
            await _send_json(send, 200, {"error": fault.inband_error})
        elif fault.malformed_frame:
            body = b"{not json"
            headers = [_JSON_CONTENT_TYPE, (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        elif fault.cut_after_chunks is not None:
            # Promise the whole body, deliver half, then drop the connection.
            body = _encode_json(payload)
            headers = [_JSON_CONTENT_TYPE, (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            half = body[: len(body) // 2]
            await send({"type": "http.response.body", "body": half, "more_body": True})
            raise DeliberateConnectionCut("fake upstream cut the response body on purpose")
        else:
            await _send_json(send, 200, payload)

    # -- endpoints --

    def _billing_payload(self) -> dict[str, object]:
        return {"object": "billing", "secret": BILLING_SECRET}

    def _models_payload(self, exchange: _Exchange) -> dict[str, object]:
        # Venice filters the catalogue with ?type=text|embedding; without it the fake lists all.
        wanted_type = urllib.parse.parse_qs(exchange.query).get("type", ["all"])[0]
        models = [
            {
                "id": model.id,
                "object": "model",
                "created": model.created,
                "owned_by": "venice.ai",
                "type": model.type,
            }
            for model in FAKE_MODELS
            if wanted_type in ("all", model.type)
        ]
        return {"object": "list", "data": models}

    def _usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
        usage: dict[str, object] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if self.usage_mode == "venice":
            usage["cost"] = fake_cost(prompt_tokens, completion_tokens)
        return usage

    def _stream_settings(self, headers: dict[str, str]) -> tuple[int, float] | str:
        """(chunk count, chunk delay) after per-request header overrides, or a problem."""
        chunk_count = self.chunk_count
        chunk_delay = self.chunk_delay
        try:
            if CHUNK_COUNT_HEADER in headers:
                chunk_count = int(headers[CHUNK_COUNT_HEADER])
            if CHUNK_DELAY_MS_HEADER in headers:
                chunk_delay = float(headers[CHUNK_DELAY_MS_HEADER]) / 1000
        except ValueError:
            return f"{CHUNK_COUNT_HEADER} and {CHUNK_DELAY_MS_HEADER} must be numbers"
        if chunk_count < 0 or chunk_delay < 0:
            return f"{CHUNK_COUNT_HEADER} and {CHUNK_DELAY_MS_HEADER} must not be negative"
        return chunk_count, chunk_delay

    async def _reject(self, exchange: _Exchange, param: str, problem: str) -> None:
        payload = _validation_error_payload(self.usage_mode, param, problem)
        await _send_json(exchange.send, 400, payload)

    async def _chat_completions(self, exchange: _Exchange, fault: Fault | None) -> None:
        request = exchange.body_json
        if not isinstance(request, dict):
            await self._reject(exchange, "body", "Request body must be a JSON object")
            return
        model = request.get("model")
        messages = request.get("messages")
        if not isinstance(model, str):
            await self._reject(exchange, "model", "model must be a string")
            return
        if not isinstance(messages, list):
            await self._reject(exchange, "messages", "messages must be an array")
            return
        settings = self._stream_settings(exchange.headers)
        if isinstance(settings, str):
            await self._reject(exchange, "headers", settings)
            return
        chunk_count, chunk_delay = settings
        prompt_tokens = _prompt_word_count(messages)
        completion_tokens = WORDS_PER_CHUNK * chunk_count
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())

        if request.get("stream") is not True:
            # A non-stream answer takes as long as generating every chunk would have.
            if chunk_delay > 0 and not await exchange.wait(chunk_delay * chunk_count):
                return
            completion = {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": fake_reply_text(chunk_count)},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": self._usage(prompt_tokens, completion_tokens),
            }
            await self._send_success_json(exchange, completion, fault)
            return

        stream_options = request.get("stream_options")
        include_usage = self.usage_mode == "venice" or (
            isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        )
        usage = self._usage(prompt_tokens, completion_tokens) if include_usage else None
        await self._stream_completion(
            exchange, fault, completion_id, created, model, chunk_count, chunk_delay, usage
        )

    async def _stream_completion(
        self,
        exchange: _Exchange,
        fault: Fault | None,
        completion_id: str,
        created: int,
        model: str,
        chunk_count: int,
        chunk_delay: float,
        usage: dict[str, object] | None,
    ) -> None:
        send = exchange.send
        chunk_sent_at = exchange.recorded.chunk_sent_at if exchange.recorded is not None else None

        async def send_frame(frame: bytes) -> None:
            # One ASGI message per frame so each one reaches the wire immediately.
            await send({"type": "http.response.body", "body": frame, "more_body": True})

        def chunk(delta: dict[str, str], finish_reason: str | None) -> bytes:
            return _sse_frame(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    ],
                }
            )

        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if fault is not None and fault.inband_error is not None:
            # What Venice does when overloaded after it has already committed to a 200.
            await send_frame(_sse_frame({"error": fault.inband_error}))
            await send({"type": "http.response.body", "body": SSE_DONE_FRAME, "more_body": False})
            return

        cut_after = fault.cut_after_chunks if fault is not None else None
        malformed_before = chunk_count // 2 if fault is not None and fault.malformed_frame else -1

        await send_frame(chunk({"role": "assistant", "content": ""}, None))
        for index in range(chunk_count):
            if cut_after is not None and index >= cut_after:
                raise DeliberateConnectionCut("fake upstream dropped the stream on purpose")
            if index > 0 and chunk_delay > 0 and not await exchange.wait(chunk_delay):
                return
            if index == malformed_before:
                await send_frame(MALFORMED_SSE_FRAME)
            await send_frame(chunk({"content": fake_reply_chunk(index)}, None))
            if chunk_sent_at is not None:
                chunk_sent_at.append(time.monotonic())
        if cut_after is not None:
            # Asked to cut after at least as many chunks as there are: cut before the ending.
            raise DeliberateConnectionCut("fake upstream dropped the stream on purpose")
        if malformed_before == chunk_count:  # only when there are no content chunks at all
            await send_frame(MALFORMED_SSE_FRAME)

        await send_frame(chunk({}, "stop"))
        if usage is not None:
            usage_chunk = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            await send_frame(_sse_frame(usage_chunk))
        await send({"type": "http.response.body", "body": SSE_DONE_FRAME, "more_body": False})

    async def _embeddings(self, exchange: _Exchange, fault: Fault | None) -> None:
        request = exchange.body_json
        if not isinstance(request, dict):
            await self._reject(exchange, "body", "Request body must be a JSON object")
            return
        model = request.get("model")
        raw_input = request.get("input")
        dimensions = request.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
        encoding_format = request.get("encoding_format") or "float"
        if not isinstance(model, str):
            await self._reject(exchange, "model", "model must be a string")
            return
        # Token-id arrays are accepted too and embedded by their text form.
        texts = [raw_input] if isinstance(raw_input, str) else raw_input
        if not isinstance(texts, list) or not texts:
            await self._reject(exchange, "input", "input must be a string or a non-empty array")
            return
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
            await self._reject(exchange, "dimensions", "dimensions must be a positive integer")
            return
        if encoding_format not in ("float", "base64"):
            await self._reject(exchange, "encoding_format", "encoding_format must be float|base64")
            return

        data: list[dict[str, object]] = []
        prompt_tokens = 0
        for index, item in enumerate(texts):
            text = item if isinstance(item, str) else json.dumps(item)
            prompt_tokens += _count_words(text)
            vector = _fake_embedding(model, text, dimensions)
            embedding: list[float] | str = vector
            if encoding_format == "base64":
                # The openai SDK asks for base64 by default: little-endian float32s.
                packed = struct.pack(f"<{dimensions}f", *vector)
                embedding = base64.b64encode(packed).decode("ascii")
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        payload = {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
        await self._send_success_json(exchange, payload, fault)


# --- running it on uvicorn ---------------------------------------------------------------------


def _connection_counting_protocol(fake: FakeUpstream) -> type[asyncio.Protocol]:
    """uvicorn's default HTTP protocol (httptools, else h11), counting accepted connections."""

    class ConnectionCountingProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            fake.connections += 1
            super().connection_made(transport)

    return ConnectionCountingProtocol


def _listening_socket(host: str, port: int) -> socket.socket:
    # Bound here rather than by uvicorn so port 0 resolves to a real port before the server starts.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def _base_url(host: str, port: int, fake: FakeUpstream) -> str:
    url_host = f"[{host}]" if ":" in host else host
    return f"http://{url_host}:{port}{fake.api_prefix}"


def _uvicorn_server(fake: FakeUpstream, *, embedded: bool) -> uvicorn.Server:
    config = uvicorn.Config(
        fake,
        http=_connection_counting_protocol(fake),
        ws="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
        # Embedded in tests or the demo, the host process owns logging configuration.
        log_config=None if embedded else LOGGING_CONFIG,
        # A backstop only: waiting requests end early when their client hangs up.
        timeout_graceful_shutdown=3,
    )
    return uvicorn.Server(config)


@contextmanager
def running_fake_upstream(
    fake: FakeUpstream | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[tuple[FakeUpstream, str]]:
    """Serve ``fake`` on uvicorn in a background thread; yield ``(fake, base_url)``.

    ``port=0`` picks a free port. ``base_url`` includes the API prefix, e.g.
    ``http://127.0.0.1:41234/api/v1``, ready for ``openai.OpenAI(base_url=...)``.
    """
    fake = fake if fake is not None else FakeUpstream()
    listener = _listening_socket(host, port)
    bound_port: int = listener.getsockname()[1]
    server = _uvicorn_server(fake, embedded=True)
    startup_failures: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=[listener])
        except BaseException as failure:  # SystemExit included: uvicorn exits on startup errors
            startup_failures.append(failure)

    thread = threading.Thread(target=serve, name=f"fake-upstream:{bound_port}", daemon=True)
    thread.start()
    try:
        give_up_at = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > give_up_at:
                cause = startup_failures[0] if startup_failures else None
                raise RuntimeError("the fake upstream did not start") from cause
            time.sleep(0.002)
        yield fake, _base_url(host, bound_port, fake)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def serve_fake_upstream(host: str, port: int, **fake_options: Any) -> None:
    """Serve a new ``FakeUpstream(**fake_options)`` until interrupted (for a CLI subcommand).

    Recording defaults to off here: nobody holds the fake to read it, and a long benchmark run
    would otherwise keep every request in memory.
    """
    fake_options.setdefault("record", False)
    fake = FakeUpstream(**fake_options)
    listener = _listening_socket(host, port)
    base_url = _base_url(host, listener.getsockname()[1], fake)
    print(f"fake upstream listening on {base_url} (api key {fake.api_key})", file=sys.stderr)
    sys.stderr.flush()
    try:
        _uvicorn_server(fake, embedded=False).run(sockets=[listener])
    finally:
        listener.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m llm_gateway.testing.fake_upstream",
        description="Run the fake OpenAI/Venice-compatible upstream.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3001)
    parser.add_argument("--api-key", default=DEFAULT_FAKE_API_KEY)
    parser.add_argument("--api-prefix", default="/api/v1")
    parser.add_argument("--chunks", type=int, default=8, help="content chunks per reply")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds between stream chunks"
    )
    parser.add_argument("--usage-mode", choices=USAGE_MODES, default="venice")
    arguments = parser.parse_args(argv)
    serve_fake_upstream(
        arguments.host,
        arguments.port,
        api_key=arguments.api_key,
        api_prefix=arguments.api_prefix,
        usage_mode=arguments.usage_mode,
        chunk_count=arguments.chunks,
        chunk_delay=arguments.chunk_delay,
    )


if __name__ == "__main__":
    main()
