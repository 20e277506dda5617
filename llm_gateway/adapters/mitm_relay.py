"""The sidecar's stream relay: the engine sends admitted streams; mitmproxy only carries
the answer to its client.

mitmproxy cannot stream a response an addon makes, so an admitted stream is forwarded
here instead, to a loopback port of this process, with a single-use token naming its
exchange. This server gives the exchange to the engine (``Gateway.respond``: failover,
error shapes, idle timeouts, usage chunks, exactly as ``serve``) and writes the answer
back chunk by chunk; mitmproxy relays it to the client as it arrives. A client that goes
away closes mitmproxy's connection here, which cancels the upstream request and is
recorded as the exchange's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from http import HTTPStatus

from llm_gateway.engine import Gateway
from llm_gateway.exchange import Exchange

log = logging.getLogger("llm_gateway.sidecar")

TOKEN_HEADER = "x-llm-gateway-exchange"
# mitmproxy sends its request head at once; anything slower is not mitmproxy.
HEAD_TIMEOUT_SECONDS = 5.0


class StreamRelay:
    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._waiting: dict[str, Exchange] = {}
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def register(self, exchange: Exchange) -> str:
        """A token for ``exchange``: the one request that may claim it here."""
        token = secrets.token_urlsafe(16)
        self._waiting[token] = exchange
        return token

    def claimed(self, token: str) -> bool:
        return token not in self._waiting

    def withdraw(self, token: str) -> Exchange | None:
        """The exchange of a token never claimed (the flow failed before it got here)."""
        return self._waiting.pop(token, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            writer.close()
            return
        exchange = self._waiting.pop(_token_of(head), None)
        if exchange is None:
            await _write_and_close(writer, b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n"
                                           b"connection: close\r\n\r\n")
            return
        await self._relay(exchange, reader, writer)

    async def _relay(self, exchange: Exchange, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            # mitmproxy sends nothing more; the end of its side is its client leaving.
            with contextlib.suppress(ConnectionError):
                await reader.read()
            gone = True
            task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        response = None
        try:
            response = await self._gateway.respond(exchange)
            chunks = response.chunks
            writer.write(_head(response.status, response.headers, chunked=chunks is not None,
                               length=len(response.body)))
            if chunks is None:
                writer.write(response.body)
            else:
                async for chunk in chunks:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            await writer.drain()
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
        except ConnectionError:
            gone = True
        finally:
            watcher.cancel()
            if response is None:  # left before the engine answered
                self._gateway.abandon(exchange, client_gone=gone)
            else:
                await response.close(client_gone=gone)
            writer.close()


def _token_of(head: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == TOKEN_HEADER.encode():
            return value.strip().decode("latin-1")
    return ""


def _head(status: int, headers: list[tuple[str, str]], *, chunked: bool, length: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append("transfer-encoding: chunked" if chunked else f"content-length: {length}")
    lines.append("connection: close")
    head = "\r\n".join(lines)
    if head.count("\n") != len(lines) - 1 or head.count("\r") != len(lines) - 1 or "\0" in head:
        # As serve's writer: no value the gateway writes holds one (caller_text).
        raise ValueError("a response header value holds CR, LF or NUL")
    return (head + "\r\n\r\n").encode("latin-1")


async def _write_and_close(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        await writer.drain()
    writer.close()
