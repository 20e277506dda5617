"""``serve``'s HTTP/1.1 protocol: the engine answered straight from the parser's callbacks.

``serve`` and the reverse sidecar serve the standalone gateway (``create_app``), whose
every request is the engine's: its API under the prefix, ``/healthz``, ``/readyz``,
``/metrics``, and a 404 the engine refuses for the rest. For that app uvicorn's request
cycle is pure overhead (an ASGI scope per request, messages for the body and the answer,
a task to watch for the client leaving, a header validator): measured with a prototype of
this module against uvicorn's protocol, request by request, it was 108 µs of the c=1
latency and 128 µs of CPU per request at c=8. So this protocol parses with httptools
(llhttp, the parser uvicorn uses) and calls the engine itself.

uvicorn stays the server: it binds and shares the sockets (workers too), runs the lifespan
(the engine starts and stops there), handles the signals and the graceful shutdown, all
through the protocol interface it takes for its ``http`` setting (``shutdown()``, its
``connections`` and ``tasks``). The admin listener, and any other ASGI app, keep uvicorn's
own protocol (``LimitedHttpToolsProtocol``). The connection limits are the same
``ConnectionWatch`` on the same parser callbacks.

What it answers is what the ASGI middleware answers (``adapters/asgi.py``), byte for byte
in body and headers; it adds ``malformed_http`` (an OpenAI-shaped 400 where uvicorn wrote
plain text). Requests on one connection are answered in order (pipelining: the next waits,
its bytes unread, until the answer before it is complete). An answer's head and whole body
leave in one write; a stream's chunks use chunked transfer encoding, each written as it
comes, after waiting while the client's socket is full.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import logging
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httptools

from llm_gateway import errors
from llm_gateway.adapters.asgi import ADAPTER_NAME, GatewayMiddleware
from llm_gateway.adapters.connection_limits import (
    BoundedHead,
    ConnectionLimits,
    ConnectionWatch,
    Wait,
    answer_bytes,
    connection_options,
)
from llm_gateway.config import Settings
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange
from llm_gateway.http_types import Headers, IncomingRequest
from llm_gateway.telemetry.metrics_access import local_address

__all__ = ["GatewayHttpProtocol", "server_options"]

log = logging.getLogger("llm_gateway.connections")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:  # a provider's own status (529, say) is relayed as it came
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# The framing is this module's to write: the engine's headers never carry it.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


@dataclass(slots=True, eq=False)  # eq=False: hashed by identity (the watch's keys)
class _Request:
    method: str
    path: str  # percent-decoded, as ASGI's scope["path"]
    query: str
    headers: Headers
    keep_alive: bool
    relative: str | None  # the path under the API prefix, when the engine serves it
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    refusal: Rejection | None = None  # answered without its body (too large)
    queued: bool = False  # handed to be answered (it is, or waits behind another)
    started: bool = False  # bytes of its answer were written
    # Asked for a 100 Continue while the request before it was answered: it gets it then.
    awaits_continue: bool = False


def _unreadable(version: str, headers: Headers, upgrade: bool) -> bool:
    """What llhttp reads but is no HTTP/1.x request the gateway may read (h11 refuses the
    first three): an HTTP/0.9 or 2.0 request line; Host missing (HTTP/1.1) or twice, which
    RFC 9112 §3.2 answers with a 400; a transfer coding besides chunked (llhttp takes "gzip,
    chunked"), which the gateway would not decode (RFC 9112 §6.1); a body on a request
    asking to upgrade (llhttp leaves what follows its head to the new protocol, and the
    gateway upgrades to nothing: the body would be lost)."""
    if version not in ("1.1", "1.0"):
        return True
    hosts, body = 0, False
    for name, value in headers:
        if name == "host":
            hosts += 1
        elif name == "transfer-encoding":
            if value.lower() != "chunked":
                return True
            body = True
        elif name == "content-length":
            body = body or value.lstrip("0") != ""
    return hosts > 1 or (hosts == 0 and version == "1.1") or (upgrade and body)


class GatewayHttpProtocol(BoundedHead, asyncio.Protocol):
    """One client connection (``server_options`` makes the subclass carrying the
    gateway's middleware and the connection limits)."""

    middleware: ClassVar[GatewayMiddleware]

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not config.loaded:
            config.load()
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.gateway = self.middleware.gateway
        self.body_limit = self.gateway.settings.request_body_limit_bytes
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3
            # As uvicorn: a request after "connection: close" in the same read is no error.
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.watch: ConnectionWatch = None  # type: ignore[assignment]
        self._url = b""
        self._headers: Headers = []
        self._reading: _Request | None = None  # the request the parser is in
        self._answering: _Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting: collections.deque[_Request] = collections.deque()  # pipelined
        self._closing = False  # graceful shutdown: close once the answer is complete
        # What followed the requests being answered was not HTTP/1.1: their answers go
        # first, then the connection closes (after a 400 when the request at fault is owed one).
        self._malformed = False
        self._refusal_owed = False
        self._gone = False  # the client left before its answer was complete
        self._relaying = False  # a disconnect may cancel the answer now (an exchange owns it)
        self._drained: asyncio.Future[None] | None = None  # set while writing is paused

    # ---- the connection -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server_state.connections.add(self)
        self.transport = transport  # type: ignore[assignment]
        self.watch = ConnectionWatch(self.limits, self.loop, self._expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self.watch.close()
        if self._answering is not None:
            self._gone = True
            if self._relaying and self._task is not None:
                self._task.cancel()  # the exchange finishes as client_disconnected
        self._resume_writing()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost follows

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = self.loop.create_future()

    def resume_writing(self) -> None:
        self._resume_writing()

    def _resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: an idle connection closes now, a busy one once its
        answer is complete."""
        if self._answering is None:
            self.transport.close()
        else:
            self._closing = True

    def data_received(self, data: bytes) -> None:
        if self._malformed:
            return  # the parser has stopped
        self.watch.received()
        try:
            self._feed_bounded(data, self.parser.feed_data)
        except httptools.HttpParserUpgrade:
            pass  # answered as a plain request: the gateway upgrades to nothing
        except httptools.HttpParserError as exc:
            log.debug("closing a connection that sent what is not HTTP/1.1: %s", exc)
            self._refuse_malformed()

    def _refuse_malformed(self) -> None:
        """A 400 for the request at fault, unless its head was answered already (a probe, a
        404, a body too large): once every answer owed for the requests before it is out,
        in order (in their place it would be read as theirs). Then the connection closes."""
        reading = self._reading
        owed = reading is None or not reading.queued
        if self._answering is None:
            self._reap(errors.malformed_http(), owed)
            return
        self._malformed, self._refusal_owed = True, owed
        self.transport.pause_reading()
        if reading is not None:
            self.watch.body_complete(reading)  # no body deadline for what is not read

    # ---- the parser's callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_body:
            return  # a trailer field: never one of the request's headers (RFC 9110 §6.5.1)
        # llhttp keeps the whitespace after a value, which is not part of it (RFC 9110 §5.5).
        self._headers.append((name.decode("latin-1").lower(),
                              value.decode("latin-1").rstrip(" \t")))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version, upgrade = parser.get_http_version(), parser.should_upgrade()
        if _unreadable(version, self._headers, upgrade):  # raised here, it stops the parser
            raise httptools.HttpParserError("not an HTTP/1.1 request the gateway reads")
        url = httptools.parse_url(self._url)
        path = url.path.decode("latin-1")
        if "%" in path:
            path = urllib.parse.unquote(path)
        method = parser.get_method().decode("ascii")
        relative = self.middleware.api_path(method, path)
        # A request asking to upgrade is answered as a plain one, and its connection closed:
        # the parser reads nothing after it (the gateway upgrades to nothing).
        request = _Request(
            method, path, (url.query or b"").decode("latin-1"), self._headers,
            version != "1.0" and parser.should_keep_alive() and not upgrade, relative)
        self._reading = request
        self._header_bytes, self._in_body = 0, True
        self.watch.headers_complete(request)
        if relative is None:
            self._enqueue(request)  # its body is not read: answered now
            return
        length, expects = "", False
        for name, value in request.headers:
            if name == "content-length":
                length = value
            elif name == "expect":
                expects = value.lower() == "100-continue"
        if length.isdigit() and int(length) > self.body_limit:
            request.refusal = self.gateway.body_too_large()
            self._enqueue(request)  # answered without reading its body (nor asking for it)
        elif expects and self._answering is None:
            self.transport.write(CONTINUE)  # the body is wanted
        elif expects:
            request.awaits_continue = True  # wanted once the answer before it is out

    def on_body(self, body: bytes) -> None:
        request = self._reading
        if request is None or request.relative is None or request.refusal is not None:
            return  # not read: nothing that answers it needs its body
        request.size += len(body)
        request.awaits_continue = False  # the client sent its body without waiting for it
        if request.size > self.body_limit:
            request.refusal = self.gateway.body_too_large()
            request.body.clear()
            self._enqueue(request)
            return
        request.body.append(body)

    def on_message_complete(self) -> None:
        request = self._reading
        self._reading, self._in_body = None, False
        if request is not None:
            self.watch.body_complete(request)
            if not request.queued:
                self._enqueue(request)

    # ---- answering, one request at a time ----------------------------------------------

    def _enqueue(self, request: _Request) -> None:
        """A request to answer once its body is in (or not needed): now, or after the one
        being answered (pipelining)."""
        request.queued = True
        if self._answering is None:
            self._start(request)
        else:  # pipelined: it waits, and so do its bytes
            self._waiting.append(request)
            self.transport.pause_reading()

    def _start(self, request: _Request) -> None:
        self._answering, self._gone = request, False
        # Started at once, inside the parser's callback: it runs up to its first wait (the
        # key store, the provider) without waiting for the loop's next turn.
        task = asyncio.Task(self._answer(request), loop=self.loop, eager_start=True)
        self._task = task
        self.server_state.tasks.add(task)
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task[None]) -> None:
        self.server_state.tasks.discard(task)
        self.server_state.total_requests += 1
        request, self._answering, self._task = self._answering, None, None
        self.watch.answered(request)
        if self.transport.is_closing():
            return
        if request is not None and (not request.keep_alive or self._closing):
            self.transport.close()
            return
        if self._waiting:
            self._start(self._waiting.popleft())
        elif self._malformed:
            self._reap(errors.malformed_http(), self._refusal_owed)
            return
        if not self._waiting and not self._malformed:
            self.transport.resume_reading()
        reading = self._reading
        if self._answering is None and reading is not None and reading.awaits_continue:
            reading.awaits_continue = False
            self.transport.write(CONTINUE)

    async def _answer(self, request: _Request) -> None:
        try:
            if request.relative is not None:
                await self._serve(request, request.relative)
            else:
                await self._serve_other(request)
        except Exception:  # a bug of this module: the engine's own failures are answers
            log.exception("the gateway's HTTP server failed on a request")
            if not request.started and not self.transport.is_closing():
                request.keep_alive = False
                failed = errors.gateway_error()
                self._write(request, 500, failed.all_headers(), failed.body)
            else:
                self.transport.close()

    def _incoming(self, request: _Request, path: str) -> IncomingRequest:
        return IncomingRequest(request.method, path, request.headers,
                               b"".join(request.body), ADAPTER_NAME, request.query)

    async def _serve(self, request: _Request, path: str) -> None:
        incoming = self._incoming(request, path)
        if request.refusal is not None:
            refused = self.gateway.refuse(incoming, request.refusal)
            self._write(request, refused.status, refused.all_headers(), refused.body)
            return
        admitted = await self.gateway.admit(incoming)
        if isinstance(admitted, Rejection):
            self._write(request, admitted.status, admitted.all_headers(), admitted.body)
            return
        await self._relay(request, admitted)

    async def _relay(self, request: _Request, exchange: Exchange) -> None:
        response = None
        task = asyncio.current_task()
        self._relaying = True
        try:
            if self._gone:  # left while it was admitted: not sent
                return
            response = await self.gateway.respond(exchange)
            if response.chunks is None:
                self._write(request, response.status, response.headers, response.body)
                return
            self._write_head(request, response.status, response.headers, None)
            write = self.transport.write
            async for chunk in response.chunks:
                if self._drained is not None:
                    await self._drained
                if self._gone:
                    break
                if chunk:
                    write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            else:
                write(b"0\r\n\r\n")
        except asyncio.CancelledError:
            if not self._gone or task is None:
                raise
            task.uncancel()  # the client left: its record says so, nothing more to do
        finally:
            self._relaying = False
            if response is None:  # left before the engine answered
                self.gateway.abandon(exchange, client_gone=self._gone)
            else:
                await response.close(client_gone=self._gone)

    async def _serve_other(self, request: _Request) -> None:
        """The probes, as the middleware answers them, and the 404."""
        path = request.path
        answer = await self.middleware.probe(
            path, local_address(self.transport.get_extra_info("sockname")),
            next((value for name, value in request.headers if name == "authorization"), None))
        if answer is not None:
            status, body, headers = answer
            self._write(request, status, headers, body)
        else:
            refused = self.gateway.refuse(self._incoming(request, path),
                                          errors.not_found(request.method, path))
            self._write(request, refused.status, refused.all_headers(), refused.body)

    # ---- writing -----------------------------------------------------------------------

    def _write_head(self, request: _Request, status: int, headers: Headers,
                    body: bytes | None) -> None:
        """The status line and headers, and ``body`` whole in the same write (None: a
        stream follows, chunked)."""
        keep_alive = request.keep_alive and not self._closing
        head = [STATUS_LINES.get(status) or _status_line(status)]
        for name, value in self.server_state.default_headers:  # the date, as uvicorn's
            head.append(name + b": " + value + b"\r\n")
        written = [(name, value) for name, value in headers if name not in _FRAMING]
        lines = "".join([f"{name}: {value}\r\n" for name, value in written])
        if (lines.count("\n") != len(written) or lines.count("\r") != len(written)
                or "\0" in lines):
            # No value the gateway writes holds one (caller_text): if one ever did, it
            # would split the answer on a keep-alive connection. A 500, before any byte.
            raise ValueError("a response header value holds CR, LF or NUL")
        head.append(lines.encode("latin-1"))
        if body is None:
            head.append(b"transfer-encoding: chunked\r\n")
        else:
            head.append(b"content-length: %d\r\n" % len(body))
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if body and request.method != "HEAD":
            head.append(body)
        request.started = True  # not before: a head that cannot be encoded is still a 500
        self.transport.write(b"".join(head))

    def _write(self, request: _Request, status: int, headers: Headers, body: bytes) -> None:
        if not self._gone:
            self._write_head(request, status, headers, body)

    # ---- limits ------------------------------------------------------------------------

    def _expired(self, wait: Wait, request: object | None) -> None:
        if self.transport.is_closing():
            return
        log.debug("closing a connection that kept the gateway waiting for %s", wait)
        self._reap(self.limits.timeout_answer(wait), wait.answerable and self._may_answer(request))

    def _may_answer(self, request: object | None) -> bool:
        """Nothing was or is being written for the request in question, so an answer of
        ours neither corrupts nor contradicts one (an answer under way, a pipelined one)."""
        if self._waiting:
            return False
        if isinstance(request, _Request):  # late with its body: not behind another answer
            return not request.started and self._answering in (None, request)
        # Not while a request before it is answered, started or not: the client would take
        # ours for that one's.
        return self._answering is None

    def _reap(self, rejection: Rejection, answer: bool) -> None:
        if answer:
            self.transport.write(answer_bytes(rejection, self.server_state.default_headers))
        # Closing also ends a request being answered: connection_lost says the client left.
        self.transport.close()


def server_options(app: object, settings: Settings) -> dict[str, Any]:
    """The protocol settings of ``uvicorn.Config`` for ``app``: the standalone gateway
    (serve's public listener, the reverse sidecar) is answered by this protocol, every
    other app by uvicorn's; both with the connection limits."""
    options = connection_options(settings)
    if isinstance(app, GatewayMiddleware) and app.standalone:
        options["http"] = type("GatewayHttpProtocol", (GatewayHttpProtocol,), {
            "middleware": app, "limits": ConnectionLimits.from_settings(settings)})
    return options
