"""ASGI types, declared once, and the lifespan answer for apps with nothing to start."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def send_body(
    send: Send, status: int, body: bytes, headers: list[tuple[str, str]],
) -> None:
    """A whole response in two messages; ``headers`` carry the content type."""
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": encode_headers([*headers, ("content-length", str(len(body)))]),
    })
    await send({"type": "http.response.body", "body": body})


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge startup and shutdown, so servers with lifespan="on" accept the app."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
