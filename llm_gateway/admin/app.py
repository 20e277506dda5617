"""The admin listener's application: ``/admin/v1/*`` (the API), ``/admin/`` (the web
console's static files, shipped in the package), and the probes ``/healthz``, ``/readyz``
and ``/metrics``. Everything else is 404, OpenAI-shaped.

It runs on its own listener (``ADMIN_BIND_ADDR``: ``serve``; the sidecar's admin port),
never on the public one, so a NetworkPolicy can keep it in the cluster.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles

from llm_gateway import errors
from llm_gateway.admin.api import build_admin_api
from llm_gateway.asgi_types import Message, Receive, Scope, Send, answer_lifespan, send_body
from llm_gateway.engine import Gateway, Readiness

CONSOLE_DIR = Path(__file__).parent / "console"
_JSON = [("content-type", "application/json")]
# The console loads nothing but its own files and talks to nothing but this listener.
_CONSOLE_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; script-src 'self'; style-src 'self'; "
     b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]
# API answers may carry a key or token shown once: no cache keeps a copy.
_API_HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            names = {name for name, _ in extra}
            headers = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
            message = {**message, "headers": headers + extra}
        await send(message)

    return wrapped


class AdminApp:
    def __init__(self, gateway: Gateway,
                 readiness: Callable[[], Awaitable[Readiness]] | None = None) -> None:
        self.gateway = gateway
        self.api = build_admin_api(gateway)
        self.console = StaticFiles(directory=CONSOLE_DIR, html=True)
        self.readiness = readiness or gateway.readiness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            # The gateway's owner (the public app's lifespan, the sidecar) starts and
            # closes it; the admin API starts it on first use if need be.
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path == "/admin/v1" or path.startswith("/admin/v1/"):
            await self.api(scope, receive, _with_headers(send, _API_HEADERS))
        elif path == "/admin":
            await send_body(send, 308, b"", [("location", "/admin/")])
        elif path.startswith("/admin/"):
            await self._console(scope, receive, send)
        elif path == "/healthz":
            await send_body(send, 200, b'{"status":"ok"}', _JSON)
        elif path == "/readyz":
            readiness = await self.readiness()
            await send_body(send, 200 if readiness.ready else 503, readiness.body(), _JSON)
        elif path == "/metrics":
            body, content_type = self.gateway.telemetry.metrics()
            await send_body(send, 200, body, [("content-type", content_type)])
        else:
            rejection = errors.not_found(scope["method"], path)
            await send_body(send, rejection.status, rejection.body, rejection.all_headers())

    async def _console(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            rejection = errors.reject("method_not_allowed",
                                      f"{scope['method']} is not allowed on {scope['path']}.")
            await send_body(send, rejection.status, rejection.body, rejection.all_headers())
            return
        child = {**scope, "root_path": scope.get("root_path", "") + "/admin"}
        try:
            await self.console(child, receive, _with_headers(send, _CONSOLE_HEADERS))
        except HTTPException as exc:  # StaticFiles' answer for a file it does not have
            if exc.status_code != 404:
                raise
            rejection = errors.not_found(scope["method"], scope["path"])
            await send_body(send, rejection.status, rejection.body, rejection.all_headers())


def create_admin_app(
    gateway: Gateway, *, readiness: Callable[[], Awaitable[Readiness]] | None = None,
) -> AdminApp:
    """The admin listener's ASGI app for ``gateway``. ``readiness`` replaces the gateway's
    own /readyz answer (the sidecar adds its own conditions)."""
    return AdminApp(gateway, readiness)
