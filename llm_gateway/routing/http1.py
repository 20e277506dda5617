"""HTTP/1.1 to providers: keep-alive connections on asyncio protocols, answers parsed by
httptools (llhttp, the parser uvicorn already brings), pooled per origin.

Why not a general client (aiohttp's was used before): what a gateway asks of its upstream
client is narrow (one request per connection at a time, a body it already holds, no
redirects, cookies, proxies or multipart) and on its hot path. Measured against the fake
upstream in one process at concurrency 8, aiohttp's client spent 90-105 µs of CPU a
request where this one spends about a third of that, and the upstream client was the
largest single part of ``serve``'s cost.

Everything here is bounded: the status line and headers (MAX_HEAD_BYTES), the body
buffered ahead of its reader (the socket stops being read past _PAUSE_AT), each decoded
piece of a compressed body (DECODED_PIECE, so a small bomb is met piece by piece).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import zlib
from typing import Any, Protocol

import httptools

MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers together
DECODED_PIECE = 64 * 1024  # the most a compressed body's piece decodes to at once
KEEPALIVE_SECONDS = 30.0  # an idle connection older than this is closed, not reused
_PAUSE_AT = 256 * 1024  # body bytes buffered ahead of the reader: stop reading the socket
_RESUME_AT = 64 * 1024
_SWEEP_SECONDS = 10.0

Origin = tuple[str, str, int]  # scheme, host, port


class ConnectionBroken(Exception):
    """The connection failed, or the answer on it was malformed or cut short."""


class _Stop(Exception):
    """Raised from a parser callback to stop parsing (httptools wraps it)."""


class Http1Connection(asyncio.Protocol):
    """One connection; one request at a time. The parser's callbacks fill in the answer,
    and a reader waits on ``_waiter`` for what it needs next."""

    def __init__(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self.origin = origin
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False  # taken from the pool, rather than opened for this request
        self.busy = False  # a request is out on it, its answer not yet given back
        self._waiter: asyncio.Future[None] | None = None
        self._timed_out = False
        # The body's idle deadline: one timer per connection, moved on only when it fires
        # (a timer made and cancelled per piece cost 2-3 µs of every stream chunk).
        self._idle_watch: asyncio.TimerHandle | None = None
        self._idle_timeout = 0.0
        self._idle_since = 0.0  # the later of the last piece's arrival and the wait's start
        self._reading_body = False  # a reader waits for the body (not for a head)
        self._start_answer()

    def _start_answer(self) -> None:
        if self._idle_watch is not None:  # the last answer's: this one starts afresh
            self._idle_watch.cancel()
            self._idle_watch = None
        self._parser = httptools.HttpResponseParser(self)
        self.answered = False  # any byte of an answer came
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self._received_before_head = 0
        self._header_bytes = 0
        self.headers_done = False
        self.done = False
        self.keep_alive = False
        self._until_close = True
        self.broken = False
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False

    # ---- the caller's side ----------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.busy = True
        self._start_answer()
        self.transport.write(head + body if body else head)

    async def answer_head(self, deadline: float) -> None:
        """Until the status line and headers are in; TimeoutError past ``deadline`` (loop
        time), ConnectionBroken when the connection ends or the answer is malformed."""
        while not self.headers_done:
            if self.broken or self.closed:
                raise ConnectionBroken
            await self._wait(self.loop.call_at(deadline, self._time_out))

    async def next_body_piece(self, idle_timeout: float) -> bytes | None:
        """The next body bytes as they came (None at the end of the answer); TimeoutError
        when nothing arrives for ``idle_timeout`` seconds."""
        while not self._body:
            if self.done:
                return None
            if self.broken or self.closed:
                raise ConnectionBroken
            self._idle_since, self._idle_timeout = self.loop.time(), idle_timeout
            if self._idle_watch is None:
                self._idle_watch = self.loop.call_at(self._idle_since + idle_timeout,
                                                     self._watch_idle)
            self._reading_body = True
            try:
                await self._wait(None)
            finally:
                self._reading_body = False
        piece = self._body.popleft()
        self._buffered -= len(piece)
        if self._paused and self._buffered < _RESUME_AT and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    @property
    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.closed and not self.broken

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self, timer: asyncio.TimerHandle | None) -> None:
        self._waiter = waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self._timed_out:
            self._timed_out = False
            raise TimeoutError

    def _watch_idle(self) -> None:
        """The idle deadline came: a reader waiting for the body since then, with nothing
        arriving, times out; otherwise the deadline moves on (none while nobody reads)."""
        self._idle_watch = None
        if not self._reading_body or self.done:
            return
        due = self._idle_since + self._idle_timeout
        if self.loop.time() >= due:
            self._time_out()
        else:
            self._idle_watch = self.loop.call_at(due, self._watch_idle)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _time_out(self) -> None:
        self._timed_out = True
        self._wake()

    # ---- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.done:
            # Bytes past the end of an answer (more than its Content-Length said, or on an
            # idle connection): the answer stands, the connection is never reused.
            self.keep_alive = False
            self.abort()
            return
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.done:
                self.keep_alive = False
                self.abort()
            else:
                self._break()
        except httptools.HttpParserUpgrade:
            self._break()
        else:
            if not self.headers_done:
                # httptools gathers a header's value before it calls on_header: this
                # bounds what it gathers to one read past the bound.
                self._received_before_head += len(data)
                if self._received_before_head > MAX_HEAD_BYTES:
                    self._break()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._idle_watch is not None:
            self._idle_watch.cancel()
            self._idle_watch = None
        if self.busy and self.headers_done and not self.done and self._until_close:
            self.done = True  # a body without length or chunks ends with its connection
        self._wake()

    def _break(self) -> None:
        self.broken = True
        self.abort()
        self._wake()

    # ---- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            raise _Stop  # a second answer to one request
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEAD_BYTES:
            raise _Stop
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self.status = status
        self.headers_done = True
        self.keep_alive = self._parser.should_keep_alive()
        for name, value in self.headers:
            if name == "content-length" or (name == "transfer-encoding"
                                             and "chunked" in value.lower()):
                self._until_close = False
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._idle_since = self.loop.time()
        self._body.append(body)
        self._buffered += len(body)
        if not self._paused and self._buffered > _PAUSE_AT and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.headers_done:
            self._header_bytes = 0  # after an interim answer, the real one's head is counted
            return
        self.done = True
        self._wake()


class ConnectionPool:
    """Idle keep-alive connections per origin, newest first; created on the loop that
    uses it."""

    def __init__(self) -> None:
        self._idle: dict[Origin, list[Http1Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._swept_at = 0.0

    async def acquire(self, origin: Origin, connect_timeout: float, *,
                      new: bool = False) -> Http1Connection:
        """An idle connection to ``origin`` (unless ``new``) or a new one. Raises
        TimeoutError or OSError (ssl.SSLError among them) when a new one cannot be made."""
        loop = asyncio.get_running_loop()
        idle = self._idle.get(origin)
        if idle and not new:
            now = loop.time()
            while idle:
                connection = idle.pop()
                if not connection.closed and now - connection.idle_since < KEEPALIVE_SECONDS:
                    connection.reused = True
                    return connection
                connection.abort()
        scheme, host, port = origin
        tls = None
        if scheme == "https":
            if self._tls is None:
                # The system's trust store, or SSL_CERT_FILE / SSL_CERT_DIR when set.
                self._tls = ssl.create_default_context()
            tls = self._tls
        async with asyncio.timeout(connect_timeout):
            _, connection = await loop.create_connection(
                lambda: Http1Connection(origin, loop), host, port, ssl=tls,
                server_hostname=host if tls is not None else None)
        return connection

    def release(self, connection: Http1Connection) -> None:
        """Back to the pool when its answer was read whole and it may be kept; else
        closed."""
        connection.busy = False
        if not connection.reusable:
            connection.abort()
            return
        now = connection.loop.time()
        connection.idle_since = now
        self._idle.setdefault(connection.origin, []).append(connection)
        if now - self._swept_at > _SWEEP_SECONDS:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drops the connections the provider closed or that idled too long (a burst
        leaves many; only the newest are reused)."""
        self._swept_at = now
        for origin, idle in list(self._idle.items()):
            kept = []
            for connection in idle:
                if connection.closed or now - connection.idle_since >= KEEPALIVE_SECONDS:
                    connection.abort()
                else:
                    kept.append(connection)
            if kept:
                self._idle[origin] = kept
            else:
                del self._idle[origin]

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.abort()
        self._idle.clear()


class BadEncoding(Exception):
    """A compressed body that does not decode."""


class Decoder(Protocol):
    """Raises BadEncoding for bytes that do not decode."""

    def push(self, data: bytes) -> bytes: ...
    def more(self) -> bytes: ...
    def end(self) -> bytes: ...


class _ZlibDecoder:
    """gzip or deflate (zlib-wrapped, or raw as some servers send it), decoded at most
    DECODED_PIECE at a time."""

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._decoder: Any = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        self._started = False

    def push(self, data: bytes) -> bytes:
        if not self._started and not self._gzip:
            self._started = True
            try:
                return self._decoder.decompress(data, DECODED_PIECE)
            except zlib.error:
                self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
        self._started = True
        try:
            return self._decoder.decompress(data, DECODED_PIECE)
        except zlib.error as exc:
            raise BadEncoding(str(exc)) from None

    def more(self) -> bytes:
        tail = self._decoder.unconsumed_tail
        return self.push(tail) if tail else b""

    def end(self) -> bytes:
        try:
            return self._decoder.flush()
        except zlib.error as exc:
            raise BadEncoding(str(exc)) from None


class _BrotliDecoder:
    def __init__(self) -> None:
        import brotli  # mitmproxy's dependency; imported only for a provider that sends br

        self._error = brotli.error
        self._decoder = brotli.Decompressor()

    def push(self, data: bytes) -> bytes:
        try:
            return self._decoder.process(data, output_buffer_limit=DECODED_PIECE)
        except self._error as exc:
            raise BadEncoding(str(exc)) from None

    def more(self) -> bytes:
        # Output held back by the limit comes with empty input (can_accept_more_data()
        # says True even then); nothing once the stream is finished.
        return b"" if self._decoder.is_finished() else self.push(b"")

    def end(self) -> bytes:
        return b""


class UnknownEncoding(Exception):
    pass


def decoder_for(content_encoding: str | None) -> Decoder | None:
    """The decoder for a Content-Encoding; None for identity. UnknownEncoding for one the
    gateway cannot read (observers need the plain text)."""
    if content_encoding is None:
        return None
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _ZlibDecoder(gzip=True)
    if encoding == "deflate":
        return _ZlibDecoder(gzip=False)
    if encoding == "br":
        try:
            return _BrotliDecoder()
        except ImportError:
            pass
    raise UnknownEncoding(encoding)


def request_head(method: str, target: str, host: str, headers: list[tuple[str, str]],
                 body: bytes) -> bytes:
    """The request line and headers. A CR or LF in a header would start a header (or a
    request) of its own: refused, whoever put it there."""
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n"]
    for name, value in headers:
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"a line break in the value of header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    if body or method not in ("GET", "HEAD"):
        lines.append(f"content-length: {len(body)}\r\n")
    lines.append("\r\n")
    # As adapters decoded them: bytes that were not UTF-8 come back as they were.
    return "".join(lines).encode("utf-8", "surrogateescape")
