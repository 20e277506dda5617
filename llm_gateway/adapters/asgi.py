"""ASGI adapter: GatewayMiddleware(app) and the standalone gateway app.

Pure ASGI (no BaseHTTPMiddleware): the request body is read once, with its size limit;
responses are passed to ``send`` chunk by chunk as the engine yields them, so a stream
is never buffered. Everything about policy is the engine's; this module translates. The
engine answers its own failures too (an OpenAI-shaped 500), so they never reach the server
as its plain-text 500.
"""

from __future__ import annotations

import asyncio

from llm_gateway import errors
from llm_gateway.adapters.identity import bound, inbound_identity
from llm_gateway.adapters.inprocess import process_gateway
from llm_gateway.asgi_types import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    answer_lifespan,
    encode_headers,
    send_body,
)
from llm_gateway.config import ConfigError, Settings, load_settings
from llm_gateway.engine import Gateway
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange
from llm_gateway.http_types import IncomingRequest
from llm_gateway.stores import StoreUnavailable
from llm_gateway.telemetry.metrics_access import metrics_refusal
from llm_gateway.wiring import build_gateway

__all__ = ["GatewayMiddleware", "create_app"]

ADAPTER_NAME = "asgi"
_JSON = [("content-type", "application/json")]


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


async def _send_rejection(send: Send, rejection: Rejection) -> None:
    await send_body(send, rejection.status, rejection.body, rejection.all_headers())


class GatewayMiddleware:
    """Serves the gateway under ``prefix`` (default ``/v1``) plus ``/healthz``,
    ``/readyz`` and ``/metrics``; every other request goes to the wrapped app.

    ``govern_outbound=True``: while the app serves a request, the credential that request
    carries in ``identity_header`` (``Bearer <gateway key or JWT>``, or the bare key) is
    bound to its context, so the app's own LLM calls through the in-process transport
    are limited and charged to that caller; the engine authenticates it when such a call
    is admitted. Without a gateway or settings, the middleware then uses this process's
    engine, the one ``openai_client()`` shares: one engine per process.
    """

    def __init__(
        self,
        app: ASGIApp,
        gateway: Gateway | None = None,
        *,
        settings: Settings | None = None,
        prefix: str | None = None,
        govern_outbound: bool = False,
        identity_header: str = "authorization",
    ) -> None:
        self.app = app
        if gateway is None and settings is None and govern_outbound:
            gateway = process_gateway()
        self.gateway = gateway or build_gateway(settings or load_settings())
        self.identity_header = (identity_header.lower().encode("latin-1")
                                if govern_outbound else None)
        chosen = prefix if prefix is not None else self.gateway.settings.api_prefix
        self.prefix = chosen.rstrip("/")
        # The standalone gateway (create_app): nothing but the engine answers, so serve
        # may answer it without ASGI (adapters/gateway_protocol.py).
        self.standalone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            relative = self.api_path(scope["method"], path)
            if relative is not None:
                await self._serve(scope, receive, send, relative)
                return
            authorization = dict(scope["headers"]).get(b"authorization")
            answer = await self.probe(path, scope.get("server"),
                                      authorization.decode("latin-1") if authorization else None)
            if answer is not None:
                await send_body(send, *answer)
                return
        elif kind == "lifespan":
            await self.app(scope, self._lifespan_receive(receive, send), send)
            return
        await self._call_app(scope, receive, send)

    def api_path(self, method: str, path: str) -> str | None:
        """``path`` under the API root, when the engine serves it (else None): the one rule
        for what is the gateway's, in this middleware and in serve's own protocol."""
        if path.startswith(self.prefix + "/"):
            relative = path[len(self.prefix):]
            if self.gateway.endpoint_for(method, relative) is not None:
                return relative
        return None

    async def probe(self, path: str, local: tuple[str, int | None] | None = None,
                    authorization: str | None = None,
                    ) -> tuple[int, bytes, list[tuple[str, str]]] | None:
        """The answer of a probe path (status, body, headers), else None. The probes keep
        their paths under any prefix, "/" too (the API then at the server's root).
        ``local``, the connection's local address, and ``authorization`` decide whether
        ``/metrics`` is answered (``telemetry.metrics_access``; unknown: as a public port)."""
        if path == "/healthz":
            return 200, b'{"status":"ok"}', _JSON
        if path == "/metrics":
            refused = metrics_refusal(self.gateway.settings, local, authorization)
            if refused is not None:
                return refused.status, refused.body, refused.all_headers()
            body, content_type = self.gateway.telemetry.metrics()
            return 200, body, [("content-type", content_type)]
        if path == "/readyz":
            # 200 "ready" or "degraded" (fail-open keeps serving: stay in rotation),
            # 503 "unavailable" (fail-closed refuses), with each backend's state.
            readiness = await self.gateway.readiness()
            return 200 if readiness.ready else 503, readiness.body(), _JSON
        return None

    async def _call_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        identity = None
        if self.identity_header is not None and scope["type"] in ("http", "websocket"):
            identity = inbound_identity(scope["headers"], self.identity_header)
        if identity is None:
            # Nothing to bind: an identity bound further out (acting_as) stays in force.
            await self.app(scope, receive, send)
            return
        with bound(identity):
            await self.app(scope, receive, send)

    def _lifespan_receive(self, receive: Receive, send: Send) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.gateway.start()
                except (StoreUnavailable, ConfigError) as exc:
                    # Told to the server, which logs the one line and exits: a store down
                    # or a spool that cannot be written at start-up is an operator's
                    # matter, not a traceback.
                    await self.gateway.close()
                    problem = (f"the key store is unreachable ({exc})"
                               if isinstance(exc, StoreUnavailable) else str(exc))
                    await send({"type": "lifespan.startup.failed",
                                "message": f"cannot start: {problem}"})
                    raise
            elif message["type"] == "lifespan.shutdown":
                await self.gateway.close()
            return message

        return wrapped

    async def _serve(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        request = _incoming(scope, path)
        try:
            body = await self._read_body(receive, request.headers)
        except _BodyTooLarge:
            await _send_rejection(send, self.gateway.refuse(request, self.gateway.body_too_large()))
            return
        except _ClientGone:
            return
        request.body = body
        admitted = await self.gateway.admit(request)
        if isinstance(admitted, Rejection):
            await _send_rejection(send, admitted)
            return
        await self._relay(admitted, receive, send)

    async def _read_body(self, receive: Receive, headers: list[tuple[str, str]]) -> bytes:
        limit = self.gateway.settings.request_body_limit_bytes
        for name, value in headers:
            if name == "content-length" and value.isdigit() and int(value) > limit:
                raise _BodyTooLarge
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _relay(self, exchange: Exchange, receive: Receive, send: Send) -> None:
        # ASGI servers drop writes to a vanished client silently, so a watcher on
        # `receive` is the one reliable signal: it cancels the relay; closing the answer
        # then tells the engine, which closes the upstream response and records it.
        relay_task = asyncio.current_task()
        assert relay_task is not None
        gone = False

        async def watch_disconnect() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            relay_task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        response = None
        try:
            response = await self.gateway.respond(exchange)
            if response.chunks is None:
                await send_body(send, response.status, response.body, response.headers)
            else:
                await send({"type": "http.response.start", "status": response.status,
                            "headers": encode_headers(response.headers)})
                async for chunk in response.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not gone:
                raise
            relay_task.uncancel()
        finally:
            watcher.cancel()
            if response is None:  # cancelled before the engine answered
                self.gateway.abandon(exchange, client_gone=gone)
            else:
                await response.close(client_gone=gone)


def _incoming(scope: Scope, path: str) -> IncomingRequest:
    """The request as the engine reads it, its body still to come."""
    return IncomingRequest(
        method=scope["method"], path=path,
        headers=[(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]],
        body=b"", adapter=ADAPTER_NAME, query=scope.get("query_string", b"").decode("latin-1"),
    )


class _NotFound:
    """The standalone gateway's app: whatever the middleware does not serve is a 404
    ``not_found``, refused through the engine like any request (ids, metric, log line)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        refusal = errors.not_found(scope["method"], scope["path"])
        await _send_rejection(send, self.gateway.refuse(_incoming(scope, scope["path"]), refusal))


def create_app(
    settings: Settings | None = None, *, gateway: Gateway | None = None, prefix: str | None = None
) -> GatewayMiddleware:
    """The standalone gateway: the middleware around an app that answers 404."""
    gateway = gateway or build_gateway(settings or load_settings())
    app = GatewayMiddleware(_NotFound(gateway), gateway, settings=settings, prefix=prefix)
    app.standalone = True
    return app
