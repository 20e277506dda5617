"""Connection limits: a client gets a bounded time to send each request, a bounded time to
sit idle, and a bounded header size; then its connection is reaped. Shared by ``serve``
(uvicorn, below) and the sidecar (``mitm_guard``).

Every open connection holds a file descriptor and some memory, so a client that connects
and says nothing, or sends its request one byte every few seconds, can exhaust either with
a few hundred sockets. What the servers offer, and what is added here:

- uvicorn's ``timeout_keep_alive`` only covers the wait *after* a response, and any byte
  (a lone CRLF will do) cancels it until the next response; a new connection has no timer
  at all, and nothing bounds how long headers or a body may take. httptools, the parser
  uvicorn picks when installed (the faster one), has no header size limit either; h11's
  ``max_incomplete_event_size`` would bound it, but counting the header bytes fed to
  httptools is one loop, so ``serve`` keeps the faster parser.
- mitmproxy's ``tcp_timeout`` is an inactivity timer (600 s), reset by every byte.

So each connection gets a ``ConnectionWatch``: one deadline while it waits for a request
(the header timeout from connecting, the idle timeout from the last response, the header
timeout again from the first byte of the next request) and one per request reading its
body (the body timeout from the end of its headers). Once a request is read, only the
gateway's own timeouts (``REQUEST_TIMEOUT_SECONDS``) apply: a long answer is never cut.
The deadlines are absolute, not inactivity timers, so trickling bytes does not extend them.

For uvicorn, ``LimitedHttpToolsProtocol`` subclasses the protocol class uvicorn uses and
reports the parser's own callbacks to the watch: the parser already knows exactly where
headers and bodies end, so this is the least code that is exact (an ASGI-independent
wrapper around the socket would have to parse HTTP a second time to know as much).
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from llm_gateway import errors
from llm_gateway.config import Settings
from llm_gateway.engine import answer_ids
from llm_gateway.errors import Rejection

__all__ = [
    "BoundedHead",
    "ConnectionLimits",
    "ConnectionWatch",
    "LimitedHttpToolsProtocol",
    "Wait",
    "answer_bytes",
    "connection_options",
]

log = logging.getLogger("llm_gateway.connections")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    idle_timeout: float
    max_header_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(settings.header_read_timeout_seconds, settings.body_read_timeout_seconds,
                   settings.keepalive_timeout_seconds, settings.max_header_bytes)

    def timeout_answer(self, wait: Wait) -> Rejection:
        if wait is Wait.BODY:
            return errors.request_timeout("body", self.body_timeout)
        return errors.request_timeout("headers", self.header_timeout)

    def too_large_answer(self) -> Rejection:
        return errors.request_header_fields_too_large(self.max_header_bytes)


class Wait(StrEnum):
    """What a connection was waiting for when its deadline passed."""

    NEW = "new"  # a new connection: not one byte yet
    IDLE = "idle"  # between requests: not one byte of the next yet
    HEADERS = "headers"  # part of a request line and headers
    BODY = "body"  # a request's body, after its headers

    @property
    def answerable(self) -> bool:
        """A request was under way: it gets a 408. Otherwise the socket is just closed, as
        any server closes an idle keep-alive connection."""
        return self in (Wait.HEADERS, Wait.BODY)


# (what it waited for, the request whose body was late or None) -> reap the connection
Expired = Callable[[Wait, object | None], None]


class ConnectionWatch:
    """The deadlines of one client connection (see the module's docstring).

    The server reports what its parser saw; ``expired`` is called once a deadline passes,
    and the server then answers (or not) and closes the connection. Requests are keys of
    the server's choosing, so pipelined ones each keep their own body deadline.
    """

    def __init__(self, limits: ConnectionLimits, loop: asyncio.AbstractEventLoop,
                 expired: Expired) -> None:
        self._limits = limits
        self._loop = loop
        self._expired = expired
        self._open: dict[object, None] = {}  # headers in, not answered yet; oldest first
        self._bodies: dict[object, asyncio.TimerHandle] = {}  # body being read
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.waiting: Wait | None = None
        self.restart()

    def received(self) -> None:
        """Bytes arrived: the first of a request starts its header deadline."""
        if self.waiting is Wait.IDLE:
            self._wait(Wait.HEADERS, self._limits.header_timeout)
        elif self.waiting is Wait.NEW:
            self.waiting = Wait.HEADERS  # its deadline still counts from the connection's start

    def headers_complete(self, request: object) -> None:
        if self._closed:
            return
        self._open[request] = None
        self.body_complete(request)  # a key reused for the next request starts afresh
        self._bodies[request] = self._loop.call_later(
            self._limits.body_timeout, self._body_expired, request)
        self._wait(None)

    def body_complete(self, request: object) -> None:
        timer = self._bodies.pop(request, None)
        if timer is not None:
            timer.cancel()
        self._settle()

    def answered(self, request: object | None = None) -> None:
        """A response is complete: ``request``'s, or the oldest open request's."""
        if request is None:
            request = next(iter(self._open), None)
        self._open.pop(request, None)
        self._settle()

    def restart(self) -> None:
        """A first request is due, as on a new connection (again after a CONNECT)."""
        if not self._closed and not self._open and not self._bodies:
            self._wait(Wait.NEW, self._limits.header_timeout)

    def close(self) -> None:
        """The connection is gone, or a tunnel now: no more deadlines."""
        self._closed = True
        self._wait(None)
        for timer in self._bodies.values():
            timer.cancel()
        self._bodies.clear()
        self._open.clear()

    def _settle(self) -> None:
        if not self._closed and not self._open and not self._bodies and self.waiting is None:
            self._wait(Wait.IDLE, self._limits.idle_timeout)

    def _wait(self, waiting: Wait | None, timeout: float = 0.0) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.waiting = waiting
        self._timer = None if waiting is None else self._loop.call_later(timeout, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self._closed and self.waiting is not None:
            self._expired(self.waiting, None)

    def _body_expired(self, request: object) -> None:
        self._bodies.pop(request, None)
        if not self._closed:
            self._expired(Wait.BODY, request)


def answer_bytes(rejection: Rejection, extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection: written by a server's connection
    code itself, where no application (and no response object) exists yet. It carries
    ``x-request-id`` and ``x-trace-id`` like every answer, minted by the engine's rule
    when the rejection has none."""
    phrase = http.HTTPStatus(rejection.status).phrase
    head = [f"HTTP/1.1 {rejection.status} {phrase}".encode()]
    head += [name + b": " + value for name, value in extra_headers]
    headers = rejection.all_headers()
    if not any(name == "x-request-id" for name, _ in headers):
        headers += answer_ids()
    head += [f"{name}: {value}".encode("latin-1") for name, value in headers]
    head += [f"content-length: {len(rejection.body)}".encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + rejection.body


class HeadHeldTransport:
    """A response's head waits for the response's first body write, so that both leave in
    one write: uvicorn writes them apart, two system calls a response where one does. When
    no body write follows in the same turn of the loop (a stream waiting for its first
    chunk), the head goes at the end of that turn. Everything else is the transport's."""

    __slots__ = ("_held", "_loop", "_transport", "hold_next")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self.hold_next = False  # set when a request's headers are in: its answer's head

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif self.hold_next:
            self.hold_next, self._held = False, data
            self._loop.call_soon(self._release)
            return
        self._transport.write(data)

    def _release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHead:
    """What both HTTP protocols of ``serve`` share (uvicorn's, below, and the gateway's own):
    a parser is fed at most the bytes that may still belong to a request's head, so no
    more than ``max_header_bytes`` are ever buffered; past them, a 431."""

    limits: ClassVar[ConnectionLimits]
    transport: asyncio.Transport
    _header_bytes: int = 0  # fed since the last headers ended, outside bodies
    _in_body: bool = False

    def _feed_bounded(self, data: bytes, feed: Callable[[bytes], None]) -> None:
        while data:
            if self._in_body:
                # A body is bounded by REQUEST_BODY_LIMIT_BYTES, in the app. What follows
                # it in this same read (a pipelined request) goes uncounted: one read.
                feed(data)
                return
            room = self.limits.max_header_bytes - self._header_bytes
            if room <= 0:
                self._reap(self.limits.too_large_answer(), self._may_answer(None))
                return
            head, data = data[:room], data[room:]
            self._header_bytes += len(head)
            feed(head)
            if self.transport.is_closing():
                return

    def _may_answer(self, request: object | None) -> bool:
        raise NotImplementedError

    def _reap(self, rejection: Rejection, answer: bool) -> None:
        raise NotImplementedError


class LimitedHttpToolsProtocol(BoundedHead, HttpToolsProtocol):
    """uvicorn's httptools protocol with the connection limits (``connection_options``
    makes a subclass carrying the configured ``limits``).

    Only the parser's callbacks and the byte stream are observed; uvicorn serves as ever.
    Header bytes are counted as they are fed to the parser, which is fed at most the bytes
    that may still belong to headers: no more than ``max_header_bytes`` are ever buffered.
    A pipelined request waits unread behind the one being answered while its body deadline
    runs; SDKs and browsers do not pipeline, so that is accepted rather than tracked.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits.from_settings(Settings())
    _watch: ConnectionWatch
    _writes: HeadHeldTransport

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._writes = HeadHeldTransport(transport, self.loop)
        super().connection_made(self._writes)  # type: ignore[arg-type]
        self._watch = ConnectionWatch(self.limits, self.loop, self._expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._watch.close()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._watch.received()
        self._feed_bounded(data, super().data_received)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._writes.hold_next = True
        self._header_bytes, self._in_body = 0, True
        self._watch.headers_complete(self.cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        self._watch.body_complete(self.cycle)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch.answered()

    def _expired(self, wait: Wait, request: object | None) -> None:
        if self.transport.is_closing():
            return
        log.debug("closing a connection that kept the gateway waiting for %s", wait)
        may_answer = wait.answerable and self._may_answer(request)
        self._reap(self.limits.timeout_answer(wait), may_answer)

    def _may_answer(self, request: object | None) -> bool:
        """Nothing was or is being sent for the request in question, so an answer of ours
        neither corrupts nor contradicts one (a response under way, a pipelined one)."""
        if self.pipeline:
            return False
        if isinstance(request, RequestResponseCycle):
            return not request.response_started
        return self.cycle is None or self.cycle.response_complete

    def _reap(self, rejection: Rejection, answer: bool) -> None:
        if answer:
            self.transport.write(answer_bytes(rejection, self.server_state.default_headers))
        # Closing also ends a request the app is reading: uvicorn tells it the client left.
        self.transport.close()


def connection_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that put the connection limits on."""
    limits = ConnectionLimits.from_settings(settings)
    protocol = type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
    return {
        "http": protocol,
        # uvicorn's own keep-alive timer stays on, with the same value as the watch's idle
        # deadline, so both say the same thing; the watch also covers what it misses.
        "timeout_keep_alive": limits.idle_timeout,
        # The gateway serves no WebSocket; an upgraded connection would leave the watch.
        "ws": "none",
    }
