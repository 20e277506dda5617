"""httpx adapter: an httpx client (so an openai SDK client) whose requests the engine
answers in process, with no socket and no second hop.

    OpenAI(api_key="unused", base_url="http://llm-gateway/v1",
           http_client=httpx.Client(transport=GatewayTransport(gateway)))

Every request goes through the same four steps as ``serve``'s: admit (the caller's key or
subject, model allowlist, rate limit, budget), send with the server-held provider key,
observe (SSE relayed chunk by chunk as the engine yields it), finish (one usage record).
Answers are the ones ``serve`` gives, so the SDK raises its own exceptions (a 429 is
``openai.RateLimitError``). Like every adapter, this module only translates: httpx's
``Request`` into an ``IncomingRequest``, the engine's answer into an ``httpx.Response``.

Whom a call is charged to: the identity bound to the context (``identity.py``), else the
key the transport was built with, else ``GatewayError`` and nothing is sent. The SDK's
``api_key`` is never read. httpx's timeouts are not applied: the engine's
``REQUEST_TIMEOUT_SECONDS`` bounds the provider's answer, as in ``serve``.

The engine answers its own failures (a 500 ``gateway_error`` in the caller's protocol, or
inside a stream already under way an in-band error event): nothing reaches the application
as a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx

from llm_gateway import errors
from llm_gateway.adapters.identity import resolve
from llm_gateway.adapters.inprocess import (
    async_handover,
    engine_loop,
    process_gateway,
    wait_on,
)
from llm_gateway.engine import Gateway
from llm_gateway.errors import Headers, Rejection
from llm_gateway.http_types import GatewayResponse, IncomingRequest
from llm_gateway.keys import subject_principal

__all__ = ["AsyncGatewayTransport", "GatewayTransport", "transport_for"]

ADAPTER_NAME = "httpx"
# Where an SDK puts its own api_key: never read, never forwarded.
_SDK_CREDENTIALS = frozenset({b"authorization", b"x-api-key", b"api-key"})
log = logging.getLogger("llm_gateway")
_ENGINE_FAILED = "The gateway failed on this request."


class _EngineStream:
    """A streamed answer as the engine yields it. Its coroutines run on the engine's loop;
    ``close`` tells the engine the caller is done with it (the engine tells from how far
    it was read whether the caller left before the end)."""

    def __init__(self, response: GatewayResponse) -> None:
        assert response.chunks is not None
        self._response = response
        self._chunks = response.chunks
        self._loop = asyncio.get_running_loop()
        self._closed = False

    async def next(self) -> bytes | None:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None

    async def close(self) -> None:
        self._closed = True
        await self._response.close()

    def __del__(self) -> None:
        # A response dropped without being closed (a loop left with `break`): the caller
        # went away, and the exchange must still finish exactly once.
        if not self._closed and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self.close()))


@dataclass(slots=True)
class _Answer:
    status: int
    headers: Headers
    body: bytes = b""
    stream: _EngineStream | None = None

    @classmethod
    def of(cls, rejection: Rejection) -> _Answer:
        return cls(rejection.status, rejection.all_headers(), rejection.body)


async def _exchange(gateway: Gateway, request: IncomingRequest) -> _Answer:
    """admit → respond, on the engine's loop: the one place foreign failures are mapped
    (the engine answers its own; anything that still escapes it is a 500 here)."""
    try:
        admitted = await gateway.admit(request)
    except Exception:
        log.exception("the engine failed while admitting an in-process request")
        return _Answer.of(errors.gateway_error())
    if isinstance(admitted, Rejection):
        return _Answer.of(admitted)
    try:
        response = await gateway.respond(admitted)
    except Exception:
        log.exception("the engine failed while relaying an in-process request")
        gateway.abandon(admitted, client_gone=False, failure=(500, "gateway_error", _ENGINE_FAILED))
        return _Answer.of(errors.reject("gateway_error", _ENGINE_FAILED))
    except BaseException:  # cancelled: the caller went away before the answer
        gateway.abandon(admitted, client_gone=True)
        raise
    if response.chunks is None:
        response.done()
        return _Answer(response.status, response.headers, response.body)
    return _Answer(response.status, response.headers, stream=_EngineStream(response))


def _incoming(gateway: Gateway, request: Any, body: bytes,
              key: str | None) -> IncomingRequest | Rejection:
    """The client's request as the engine's; the credential is the resolved identity's,
    never the SDK's ``api_key`` (whatever header it put it in). Raises GatewayError when
    there is nobody to charge."""
    identity = resolve(key)
    prefix = gateway.settings.api_prefix.rstrip("/")
    path = request.url.path
    relative = path[len(prefix):] if path.startswith(prefix + "/") else ""
    if gateway.endpoint_for(request.method, relative) is None:
        # Refused through the engine: ids, span, metric and log line, as on the wire.
        return gateway.refuse(IncomingRequest(request.method, path, [], b"", ADAPTER_NAME),
                              errors.not_found(request.method, path))
    headers = [(name.decode("latin-1").lower(), value.decode("latin-1"))
               for name, value in request.headers.raw
               if name.lower() not in _SDK_CREDENTIALS]
    principal = None
    if identity.subject is not None:
        principal = subject_principal(identity.subject)
    else:
        headers.append(("authorization", f"Bearer {identity.credential}"))
    return IncomingRequest(request.method, relative, headers, body, ADAPTER_NAME,
                           request.url.query.decode("latin-1"), principal=principal)


async def _on[T](loop: asyncio.AbstractEventLoop | None, work: Coroutine[Any, Any, T]) -> T:
    """``work`` on the engine's loop: here when it is this one (None), else handed over."""
    if loop is None:
        return await work
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))


class _AsyncChunks:
    def __init__(self, source: _EngineStream, loop: asyncio.AbstractEventLoop | None) -> None:
        self._source = source
        self._loop = loop

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await _on(self._loop, self._source.next())) is not None:
            yield chunk

    async def aclose(self) -> None:
        await _on(self._loop, self._source.close())


class _SyncChunks:
    """Each chunk is handed from the engine's loop to this thread as it comes (one
    thread-safe future per chunk): nothing is read ahead, nothing accumulates."""

    def __init__(self, source: _EngineStream, loop: asyncio.AbstractEventLoop) -> None:
        self._source = source
        self._loop = loop

    def __iter__(self) -> Iterator[bytes]:
        while (chunk := wait_on(self._loop, self._source.next())) is not None:
            yield chunk

    def close(self) -> None:
        if self._loop.is_running():  # else the engine is gone, and its exchanges with it
            wait_on(self._loop, self._source.close())


class _Transport:
    """The engine as a transport of an httpx-shaped client library (``_http``: httpx, or
    httpx2, which the anthropic SDK is built on): ``handle_request`` and
    ``handle_async_request``, answers as that library's ``Response``."""

    _http: ModuleType
    _sync_chunks: type
    _async_chunks: type

    def __init__(self, gateway: Gateway | None = None, *, key: str | None = None) -> None:
        self.gateway = gateway if gateway is not None else process_gateway()
        self.key = key

    def handle_request(self, request: Any) -> Any:
        incoming = _incoming(self.gateway, request, request.read(), self.key)
        if isinstance(incoming, Rejection):
            return self._response(_Answer.of(incoming), None)
        loop = engine_loop(self.gateway)
        answer = wait_on(loop, _exchange(self.gateway, incoming))
        return self._response(answer, None if answer.stream is None
                              else self._sync_chunks(answer.stream, loop))

    async def handle_async_request(self, request: Any) -> Any:
        incoming = _incoming(self.gateway, request, await request.aread(), self.key)
        if isinstance(incoming, Rejection):
            return self._response(_Answer.of(incoming), None)
        loop = async_handover(self.gateway)
        answer = await _on(loop, _exchange(self.gateway, incoming))
        return self._response(answer, None if answer.stream is None
                              else self._async_chunks(answer.stream, loop))

    def _response(self, answer: _Answer, stream: object | None) -> Any:
        if stream is None:
            return self._http.Response(answer.status, headers=answer.headers,
                                       content=answer.body)
        return self._http.Response(answer.status, headers=answer.headers, stream=stream)


@functools.cache
def transport_for(http: ModuleType) -> type[_Transport]:
    """The gateway's transport made of ``http``'s own base classes (httpx's clients and
    httpx2's check for theirs)."""
    return type("GatewayTransport", (_Transport, http.BaseTransport, http.AsyncBaseTransport), {
        "__doc__": GATEWAY_TRANSPORT_DOC, "_http": http,
        "_sync_chunks": type("SyncChunks", (_SyncChunks, http.SyncByteStream), {}),
        "_async_chunks": type("AsyncChunks", (_AsyncChunks, http.AsyncByteStream), {}),
    })


GATEWAY_TRANSPORT_DOC = """The engine as an httpx transport, for ``httpx.Client`` and
``httpx.AsyncClient`` (``transport_for(httpx2)``: the same for httpx2's, the anthropic SDK's).

``gateway``: the engine (default: this process's, configured from the environment as
``serve``'s is). ``key``: the gateway key charged when no identity is bound. Closing the
transport leaves the engine alone: its lifetime is whoever built it (the process's engine
is closed at exit). Sync calls wait in the calling thread while the engine works on its
own loop (``inprocess.py``).
"""
GatewayTransport = transport_for(httpx)
# One class serves both kinds of client; the name says which one a reader expects.
AsyncGatewayTransport = GatewayTransport
