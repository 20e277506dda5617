"""The admin listener's application: ``/admin/v1/*`` (the API), ``/admin/`` (the web
console's static files, shipped in the package), and the probes ``/healthz``, ``/readyz``
and ``/metrics``. Everything else is 404, OpenAI-shaped.

It runs on its own listener (``ADMIN_BIND_ADDR``: ``serve``; the sidecar's admin port, on
loopback unless told otherwise), never on the public one, so a NetworkPolicy can keep it in
the cluster. The sidecar's probe port serves the probes of it alone. Who may read
``/metrics`` is ``telemetry.metrics_access``'s rule, on every listener.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llm_gateway import errors
from llm_gateway.admin.api import build_admin_api
from llm_gateway.asgi_types import Message, Receive, Scope, Send, answer_lifespan, send_body
from llm_gateway.engine import Gateway, Readiness
from llm_gateway.telemetry.metrics_access import metrics_refusal

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


_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                  ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


@dataclass(frozen=True, slots=True)
class ConsoleFile:
    body: bytes
    content_type: str
    etag: str


def load_console(directory: Path = CONSOLE_DIR) -> dict[str, ConsoleFile]:
    """The console's files by URL path under /admin, read once: a page load asks for a
    dozen of them, and answering each from memory (with an ETag, so a reload is a 304)
    took a page from ~150 to ~60 ms where reading each from disk in a thread did not."""
    files: dict[str, ConsoleFile] = {}
    for path in sorted(directory.rglob("*")):
        content_type = _CONTENT_TYPES.get(path.suffix)
        if content_type is None or not path.is_file():
            continue
        body = path.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files["/" + path.relative_to(directory).as_posix()] = ConsoleFile(body, content_type, etag)
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            names = {name for name, _ in extra}
            headers = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
            message = {**message, "headers": headers + extra}
        await send(message)

    return wrapped


PROBE_PATHS = ("/healthz", "/readyz", "/metrics")


class AdminApp:
    """``probes_only``: a probe port (the sidecar's ``--probe``, reached by the kubelet
    and Prometheus on the pod IP), answering ``PROBE_PATHS`` and nothing else."""

    def __init__(self, gateway: Gateway,
                 readiness: Callable[[], Awaitable[Readiness]] | None = None,
                 *, probes_only: bool = False) -> None:
        self.gateway = gateway
        self.api = build_admin_api(gateway)
        self.console: Mapping[str, ConsoleFile] = load_console()
        self.readiness = readiness or gateway.readiness
        self.probes_only = probes_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            # The gateway's owner (the public app's lifespan, the sidecar) starts and
            # closes it; the admin API starts it on first use if need be.
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if self.probes_only and path not in PROBE_PATHS:
            rejection = errors.not_found(scope["method"], path)
            await send_body(send, rejection.status, rejection.body, rejection.all_headers())
        elif path == "/admin/v1" or path.startswith("/admin/v1/"):
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
            authorization = dict(scope.get("headers") or ()).get(b"authorization")
            refused = metrics_refusal(self.gateway.settings, scope.get("server"),
                                      authorization.decode("latin-1") if authorization else None)
            if refused is not None:
                await send_body(send, refused.status, refused.body, refused.all_headers())
                return
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
        found = self.console.get(scope["path"].removeprefix("/admin"))
        if found is None:
            rejection = errors.not_found(scope["method"], scope["path"])
            await send_body(send, rejection.status, rejection.body, rejection.all_headers())
            return
        headers = [(b"content-type", found.content_type.encode()), (b"etag", found.etag.encode()),
                   *_CONSOLE_HEADERS]
        asked = dict(scope.get("headers") or ()).get(b"if-none-match", b"").decode("latin-1")
        if found.etag in (tag.strip().removeprefix("W/") for tag in asked.split(",")):
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        body = found.body if scope["method"] == "GET" else b""
        await send({"type": "http.response.start", "status": 200, "headers": [
            *headers, (b"content-length", str(len(found.body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def create_admin_app(
    gateway: Gateway, *, readiness: Callable[[], Awaitable[Readiness]] | None = None,
    probes_only: bool = False,
) -> AdminApp:
    """The admin listener's ASGI app for ``gateway``. ``readiness`` replaces the gateway's
    own /readyz answer (the sidecar adds its own conditions); ``probes_only``: the probes
    alone (the sidecar's probe port)."""
    return AdminApp(gateway, readiness, probes_only=probes_only)
