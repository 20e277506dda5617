"""The upstream client's HTTP/1.1 (``routing/http1.py``) against a server that answers
with bytes scripted per request: framing (length, chunks, until close, interim answers),
keep-alive reuse and its refusals, compression, every bound and every timeout."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import zlib
from collections.abc import AsyncIterator, Callable

import brotli
import pytest

from llm_gateway.errors import UpstreamFailure
from llm_gateway.routing.client import UpstreamClient, UpstreamResponse
from llm_gateway.routing.http1 import MAX_HEAD_BYTES, request_head
from llm_gateway.routing.table import ProviderConfig, Timeouts


class ScriptedServer:
    """Answers each request with ``answer(request bytes, writer)``; counts connections and
    keeps every request it read (head and body)."""

    def __init__(self, answer: Callable[[bytes, asyncio.StreamWriter], object]) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                result = self.answer(request, writer)
                if asyncio.iscoroutine(result):
                    await result
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., object]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Callable[[bytes, asyncio.StreamWriter], object],
                    ) -> tuple[ScriptedServer, str]:
        scripted = ScriptedServer(answer)
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return scripted, f"http://127.0.0.1:{port}/v1/chat/completions"

    yield start
    for server in servers:
        server.close()


def provider(first_byte: float = 5.0) -> ProviderConfig:
    return ProviderConfig(name="p", base_url="http://unused",
                          timeouts=Timeouts(connect=2, first_byte=first_byte, read=5,
                                            stream_idle=5))


async def send(client: UpstreamClient, url: str, *, read_timeout: float = 5.0,
               first_byte: float = 5.0) -> UpstreamResponse:
    return await client.send(provider(first_byte), "POST", url,
                             [("content-type", "application/json")], b'{"a": 1}',
                             read_timeout=read_timeout)


def fixed(body: bytes, *extra: bytes) -> Callable[[bytes, asyncio.StreamWriter], None]:
    def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + b"".join(extra)
                     + b"content-length: %d\r\n\r\n" % len(body) + body)
    return answer


async def test_a_request_goes_as_http_1_1_and_keep_alive_reuses_the_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server, url = await serve(fixed(b'{"ok": true}'))
    client = UpstreamClient()
    for _ in range(3):
        response = await send(client, url)
        assert (response.status, await response.read(1000)) == (200, b'{"ok": true}')
    assert server.connections == 1
    head, body = server.requests[0].split(b"\r\n\r\n")
    port = url.split(":")[2].split("/")[0]
    assert head.split(b"\r\n")[:2] == [b"POST /v1/chat/completions HTTP/1.1",
                                       f"host: 127.0.0.1:{port}".encode()]
    assert b"content-length: 8" in head and body == b'{"a": 1}'
    await client.aclose()


async def test_a_kept_connection_closed_as_the_request_went_is_tried_once_anew(serve) -> None:  # type: ignore[no-untyped-def]
    """The provider's idle timeout closing a pooled connection just as a request is
    written: nothing was answered, so the request goes once more, on a new connection.
    A new connection closed unanswered is a failure (the request may have run)."""
    answered: set[int] = set()

    def once_per_connection(_: bytes, writer: asyncio.StreamWriter) -> None:
        if id(writer) in answered:
            writer.close()  # as if its keep-alive ran out
            return
        answered.add(id(writer))
        fixed(b"{}")(_, writer)

    server, url = await serve(once_per_connection)
    client = UpstreamClient()
    for _ in range(2):
        assert await (await send(client, url)).read(10) == b"{}"
    assert server.connections == 2 and len(server.requests) == 3

    _, url = await serve(lambda request, writer: writer.close())
    with pytest.raises(UpstreamFailure) as failure:
        await send(client, url)
    assert failure.value.code == "upstream_unreachable"


async def test_chunked_and_until_close_bodies_arrive_whole(serve) -> None:  # type: ignore[no-untyped-def]
    def chunked(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")

    def until_close(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        writer.close()

    client = UpstreamClient()
    _, url = await serve(chunked)
    assert await (await send(client, url)).read(100) == b"hello world"
    server, url = await serve(until_close)
    assert await (await send(client, url)).read(100) == b"all of it"
    assert await (await send(client, url)).read(100) == b"all of it"
    assert server.connections == 2  # an answer that ended its connection is not reused
    await client.aclose()


async def test_an_interim_answer_is_skipped(serve) -> None:  # type: ignore[no-untyped-def]
    _, url = await serve(lambda request, writer: writer.write(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nx-real: yes\r\n"
        b"content-length: 2\r\n\r\nok"))
    response = await send(UpstreamClient(), url)
    assert (response.status, response.header_map()["x-real"], await response.read(10)) == (
        201, "yes", b"ok")


async def test_bytes_past_the_content_length_end_the_connection_not_the_answer(serve) -> None:  # type: ignore[no-untyped-def]
    server, url = await serve(lambda request, writer: writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
        b"content-length: 6\r\n\r\nforged"))
    client = UpstreamClient()
    for _ in range(2):
        assert await (await send(client, url)).read(10) == b"ok"
    assert server.connections == 2


async def test_an_answer_cut_or_malformed_is_a_failure(serve) -> None:  # type: ignore[no-untyped-def]
    def cut(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        writer.close()

    client = UpstreamClient()
    _, url = await serve(cut)
    with pytest.raises(UpstreamFailure) as failure:
        await (await send(client, url)).read(1000)
    assert failure.value.code == "upstream_broken_response"
    _, url = await serve(lambda request, writer: writer.write(b"NOT HTTP AT ALL\r\n\r\n"))
    with pytest.raises(UpstreamFailure) as failure:
        await send(client, url)
    assert failure.value.code == "upstream_unreachable"


async def test_headers_past_their_bound_are_refused(serve) -> None:  # type: ignore[no-untyped-def]
    def huge(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (4 * MAX_HEAD_BYTES) + b"\r\n")

    def many(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"x-h: 0123456789\r\n" * 5000 + b"\r\n")

    client = UpstreamClient()
    for answer in (huge, many):
        _, url = await serve(answer)
        with pytest.raises(UpstreamFailure) as failure:
            await send(client, url)
        assert failure.value.code == "upstream_unreachable"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "br"])
async def test_compressed_bodies_are_decoded(serve, encoding: str) -> None:  # type: ignore[no-untyped-def]
    text = b'{"text": "' + b"compressible " * 20000 + b'"}'
    packed = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress,
              "raw-deflate": lambda data: zlib.compress(data)[2:-4]}[encoding](text)
    name = b"deflate" if encoding == "raw-deflate" else encoding.encode()
    _, url = await serve(fixed(packed, b"content-encoding: " + name + b"\r\n"))
    response = await send(UpstreamClient(), url)
    assert await response.read(len(text)) == text
    response = await send(UpstreamClient(), url)
    with pytest.raises(UpstreamFailure) as failure:
        await response.read(len(text) - 1)  # bounded as decoded, not as sent
    assert failure.value.code == "upstream_response_too_large"


async def test_a_compressed_stream_comes_in_bounded_pieces(serve) -> None:  # type: ignore[no-untyped-def]
    _, url = await serve(fixed(gzip.compress(b"x" * (8 * 1024 * 1024)),
                               b"content-encoding: gzip\r\n"))
    response = await send(UpstreamClient(), url)
    sizes = [len(piece) async for piece in response.chunks()]
    assert sum(sizes) == 8 * 1024 * 1024 and max(sizes) <= 64 * 1024


async def test_an_unknown_or_broken_encoding_is_a_failure(serve) -> None:  # type: ignore[no-untyped-def]
    client = UpstreamClient()
    _, url = await serve(fixed(b"whatever", b"content-encoding: zstd\r\n"))
    with pytest.raises(UpstreamFailure) as failure:
        await send(client, url)
    assert "encoding the gateway cannot read (zstd)" in str(failure.value)
    _, url = await serve(fixed(b"not gzip at all", b"content-encoding: gzip\r\n"))
    with pytest.raises(UpstreamFailure) as failure:
        await (await send(client, url)).read(1000)
    assert failure.value.code == "upstream_broken_response"


async def test_first_byte_and_read_timeouts(serve) -> None:  # type: ignore[no-untyped-def]
    async def silent(_: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3)

    async def stalls(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await asyncio.sleep(3)

    client = UpstreamClient()
    _, url = await serve(silent)
    with pytest.raises(UpstreamFailure) as failure:
        await send(client, url, first_byte=0.2)
    assert failure.value.code == "upstream_timeout"
    _, url = await serve(stalls)
    response = await send(client, url, read_timeout=0.2)
    pieces = response.chunks()
    assert await anext(pieces) == b"hi"
    with pytest.raises(UpstreamFailure) as failure:
        await anext(pieces)
    assert failure.value.code == "upstream_timeout"


async def test_the_read_timeout_counts_from_the_last_piece_and_ends_with_its_answer(serve) -> None:  # type: ignore[no-untyped-def]
    """One deadline per connection, moved on as pieces come: a stream whose pieces come
    more often than the read timeout lasts as long as it likes; a stall is timed out
    within the timeout; a reused connection's next answer is not timed out by the last's."""
    async def trickles(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(12):  # 1.2 s in all, against a read timeout of 0.6 s
            writer.write(b"2\r\nhi\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")

    client = UpstreamClient()
    server, url = await serve(trickles)
    for _ in range(2):  # the second on the kept connection
        response = await send(client, url, read_timeout=0.6)
        assert [piece async for piece in response.chunks()] == [b"hi"] * 12
    assert server.connections == 1
    loop = asyncio.get_running_loop()

    async def stalls(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await asyncio.sleep(0.5)  # a reader that waits past its timeout, then stalls
        await asyncio.sleep(3)

    _, url = await serve(stalls)
    response = await send(client, url, read_timeout=0.3)
    pieces = response.chunks()
    assert await anext(pieces) == b"hi"
    await asyncio.sleep(0.5)  # not reading: no deadline runs while nobody waits
    started = loop.time()
    with pytest.raises(UpstreamFailure) as failure:
        await anext(pieces)
    assert failure.value.code == "upstream_timeout"
    assert loop.time() - started >= 0.25  # from the wait's start, not from the last piece


async def test_a_slow_reader_stops_the_socket_being_read(serve) -> None:  # type: ignore[no-untyped-def]
    """A provider sending faster than the client takes is held back by TCP, not buffered."""
    sent = 0

    async def flood(_: bytes, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (65536, b"z" * 65536)
        with contextlib.suppress(ConnectionError):
            for _ in range(1000):  # 64 MiB
                writer.write(piece)
                await writer.drain()
                sent += 65536

    _, url = await serve(flood)
    response = await send(UpstreamClient(), url)
    pieces = response.chunks()
    await anext(pieces)
    await asyncio.sleep(0.5)
    assert sent < 16 * 1024 * 1024, f"{sent} bytes sent to a reader that took 64 KiB"
    response.close()


async def test_refused_and_nameless_providers_are_unreachable() -> None:
    from tests.support import closed_port

    client = UpstreamClient()
    for url in (f"http://127.0.0.1:{closed_port()}/v1/x", "http://name.invalid/v1/x"):
        with pytest.raises(UpstreamFailure) as failure:
            await send(client, url)
        assert failure.value.code == "upstream_unreachable"


def test_a_line_break_in_a_header_never_reaches_the_wire() -> None:
    with pytest.raises(ValueError, match="line break"):
        request_head("POST", "/x", "h", [("x-a", "b\r\nx-injected: 1")], b"")
    head = request_head("GET", "/v1/models?x=1", "h:8080", [("accept", "\udc80")], b"")
    assert head == b"GET /v1/models?x=1 HTTP/1.1\r\nhost: h:8080\r\naccept: \x80\r\n\r\n"
