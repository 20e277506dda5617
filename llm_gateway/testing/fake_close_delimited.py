"""The fake upstream behind an HTTP/1.1 server that frames no body it does not know the
length of: no ``Transfer-Encoding: chunked``, no ``Content-Length``, ``Connection: close``,
and the body ends when the connection does (RFC 9112 section 6.3, its last rule). Servers
answer so when they, or a proxy in front of them, stream without chunking (nginx with
``chunked_transfer_encoding off``, HTTP/1.0-era proxies, hand-written SSE servers).

uvicorn always chunks a body of unknown length, so this server stands in for it: the same
``FakeUpstream`` app, its faults included, written to the wire unframed. On such an answer
a cut stream (``Fault.cut_after_chunks``) ends exactly as a whole one does, with the
connection's close (a FIN, no reset): only the protocol's own end event (``[DONE]``,
``message_stop``, ``response.completed``) tells them apart.

One request per connection; a body whose length the app gave (``send_body``'s JSON answers)
keeps its ``Content-Length``, as such servers send it when they know it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from http import HTTPStatus

import httptools

from llm_gateway.asgi_types import ASGIApp, Message
from llm_gateway.testing.fake_app import FakeUpstream
from llm_gateway.testing.fake_faults import DeliberateConnectionCut

log = logging.getLogger("llm_gateway.testing")
# Left out of what the app sent: this server frames nothing, and closes.
_UNFRAMED = (b"transfer-encoding", b"connection")
_MAX_REQUEST_BYTES = 32 * 1024 * 1024


class _Request:
    """One request, as httptools' callbacks fill it in."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


async def _read_request(reader: asyncio.StreamReader,
                        ) -> tuple[httptools.HttpRequestParser, _Request] | None:
    request = _Request()
    parser = httptools.HttpRequestParser(request)
    received = 0
    while not request.complete:
        data = await reader.read(65536)
        received += len(data)
        if not data or received > _MAX_REQUEST_BYTES:
            return None
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            return None
    return parser, request


def _head(message: Message) -> bytes:
    """The status line and headers, without framing (Content-Length kept when known)."""
    status = int(message["status"])
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}".encode()]
    for name, value in message.get("headers", []):
        if name.lower() in _UNFRAMED:
            continue
        lines.append(bytes(name) + b": " + bytes(value))
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _answer(app: ASGIApp, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    read = await _read_request(reader)
    if read is None:
        return
    parser, request = read
    path, _, query = request.url.partition(b"?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": parser.get_method().decode("latin-1"), "scheme": "http",
             "path": path.decode("latin-1"), "raw_path": path, "query_string": query,
             "headers": request.headers, "server": writer.get_extra_info("sockname"),
             "client": writer.get_extra_info("peername")}
    body = b"".join(request.body)
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        while await reader.read(65536):  # until the client hangs up
            pass
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            writer.write(_head(message))
        elif message["type"] == "http.response.body":
            writer.write(message.get("body", b""))
        await writer.drain()

    with contextlib.suppress(DeliberateConnectionCut, ConnectionError):
        await app(scope, receive, send)


async def _connection(app: ASGIApp, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
    try:
        await _answer(app, reader, writer)
    except Exception:
        log.exception("the close-delimited fake upstream failed on a request")
    finally:
        # The end of every answer, whole or cut: a plain close, as a server that frames
        # nothing ends its body.
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@contextlib.contextmanager
def running_close_delimited(fake: FakeUpstream | None = None, host: str = "127.0.0.1",
                            ) -> Iterator[tuple[FakeUpstream, str]]:
    """Serve ``fake`` unframed in a background thread; yield ``(fake, base_url)`` (the API
    prefix included, as ``running_fake_upstream`` yields it)."""
    fake = fake if fake is not None else FakeUpstream()
    listener = socket.create_server((host, 0))
    port = listener.getsockname()[1]
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def serve() -> None:
        server = await asyncio.start_server(
            lambda reader, writer: _connection(fake, reader, writer), sock=listener)
        started.set()
        async with server:
            await server.serve_forever()

    task: list[asyncio.Task[None]] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        task.append(loop.create_task(serve()))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task[0])

    thread = threading.Thread(target=run, name=f"fake-close-delimited:{port}", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the close-delimited fake upstream did not start")
    try:
        yield fake, f"http://{host}:{port}{fake.api_prefix}"
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(10)
        loop.close()
