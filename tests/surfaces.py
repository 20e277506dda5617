"""The five ways the engine is put in a request's path, each running a real engine that the
test built (so that it can look at its ledger), answered over a real socket where there
is one and read byte for byte: ``serve``'s own protocol, the ASGI middleware under uvicorn's
protocol, the in-process httpx transport, and the sidecar in reverse and regular mode.

What comes back is the raw answer (``RawAnswer``): the head as the bytes on the wire, the
body de-chunked, and whatever else the connection carried after the answer ended (a second
response smuggled into the first is there).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from llm_gateway.adapters.asgi import GatewayMiddleware, create_app
from llm_gateway.adapters.ca import load_or_create_ca
from llm_gateway.adapters.inprocess import stop_engine
from llm_gateway.engine import Gateway
from llm_gateway.httpx import GatewayTransport
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key, serve_in_thread

SURFACES = ("serve", "middleware", "inprocess", "sidecar-reverse", "sidecar-regular")
# A header line as RFC 9110 allows it: a token, a colon, a value of visible characters.
_TOKEN = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass
class RawAnswer:
    status: int
    head: bytes  # the status line and header lines, CRLFs included
    headers: list[tuple[str, str]]
    body: bytes
    trailing: bytes = b""  # anything the connection carried after the answer's end

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)

    def head_problems(self) -> list[str]:
        """What is wrong with the head as HTTP/1.1: a line that is no header, a CR or LF
        inside a line, bytes after the answer."""
        problems = []
        lines = self.head.split(b"\r\n")
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or not set(name) <= _TOKEN:
                problems.append(f"not a header line: {line!r}")
            if b"\r" in line or b"\n" in line or b"\0" in value:
                problems.append(f"CR, LF or NUL inside a header line: {line!r}")
        if self.trailing:
            problems.append(f"bytes after the answer: {self.trailing[:200]!r}")
        return problems


@dataclass
class Surface:
    name: str
    gateway: Gateway
    database_url: str
    base: str  # scheme://host:port of where requests go (in-process: unused)
    api: str  # the path of the API root on that base
    proxy: tuple[str, int] | None = None  # the regular sidecar: requests go through it
    transport: GatewayTransport | None = None
    _keys: list[str] = field(default_factory=list)

    def key(self, **options: object) -> str:
        return create_key(self.database_url, **options)[1]

    def send(self, path: str, body: bytes, headers: dict[str, str] | None = None,
             method: str = "POST") -> RawAnswer:
        """One request (``path`` under the API root) on a connection of its own."""
        headers = {"content-type": "application/json", **(headers or {})}
        if self.transport is not None:
            return self._send_in_process(method, path, body, headers)
        target = urlsplit(self.base)
        request_target = self.api + path
        if self.proxy is not None:  # absolute form: what an app with HTTP_PROXY sends
            request_target = self.base + request_target
        head = [f"{method} {request_target} HTTP/1.1", f"host: {target.netloc}",
                f"content-length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        raw = ("\r\n".join(head) + "\r\n\r\n").encode("utf-8", "surrogatepass") + body
        address = self.proxy or (target.hostname or "", target.port or 80)
        with socket.create_connection(address, timeout=20) as sock:
            sock.sendall(raw)
            return read_answer(sock, method)

    def _send_in_process(self, method: str, path: str, body: bytes,
                         headers: dict[str, str]) -> RawAnswer:
        # The in-process caller's key lives in the transport, not in a header.
        key = headers.pop("authorization", "").removeprefix("Bearer ") or None
        transport = GatewayTransport(self.gateway, key=key)
        with httpx.Client(transport=transport, base_url="http://llm-gateway") as client:
            response = client.request(method, self.api + path, content=body,
                                      headers={k: v.encode("utf-8", "surrogatepass")
                                               for k, v in headers.items()})
            content = response.read()
        lines = [f"HTTP/1.1 {response.status_code}".encode()]
        lines += [name + b": " + value for name, value in response.headers.raw]
        return RawAnswer(response.status_code, b"\r\n".join(lines),
                         [(k.decode("latin-1").lower(), v.decode("latin-1"))
                          for k, v in response.headers.raw], content)


def read_answer(sock: socket.socket, method: str = "POST") -> RawAnswer:
    """One HTTP/1.1 answer from ``sock``, framed as its head says, and what follows it
    within a short wait."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise AssertionError(f"the connection closed before a whole head: {data!r}")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = []
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip().decode("latin-1").lower(),
                        value.strip().decode("latin-1")))
    framing = dict(headers)
    body = b""
    if method == "HEAD" or status in (204, 304):
        pass
    elif framing.get("transfer-encoding", "").lower() == "chunked":
        body, rest = _dechunk(sock, rest)
    elif "content-length" in framing:
        length = int(framing["content-length"])
        while len(rest) < length:
            more = sock.recv(65536)
            if not more:
                break
            rest += more
        body, rest = rest[:length], rest[length:]
    else:  # close-delimited
        while more := sock.recv(65536):
            rest += more
        body, rest = rest, b""
    sock.settimeout(0.05)
    with contextlib.suppress(TimeoutError, OSError):
        while more := sock.recv(65536):
            rest += more
    return RawAnswer(status, head, headers, body, rest)


def _dechunk(sock: socket.socket, data: bytes) -> tuple[bytes, bytes]:
    body = b""
    while True:
        while b"\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                return body, data
            data += more
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(data) < size + 2:
            more = sock.recv(65536)
            if not more:
                return body + data, b""
            data += more
        if size == 0:
            return body, data[2:]
        body, data = body + data[:size], data[size + 2:]


async def _no_app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """The app behind the middleware: the tests never reach it."""
    if scope["type"] == "lifespan":
        return
    raise AssertionError("the app behind the middleware was called")


@contextlib.contextmanager
def surface(name: str, directory: Path, fake_url: str, ca_dir: Path,
            **overrides: object) -> Iterator[Surface]:
    """``name`` (one of SURFACES) in front of the fake upstream at ``fake_url``, with its own
    engine and state in ``directory``."""
    from tests.test_sidecar import sidecar_in_thread

    directory.mkdir(parents=True, exist_ok=True)
    settings = make_settings(directory, fake_url, **overrides)
    gateway = build_gateway(settings, key_cache_seconds=0)
    api = settings.api_prefix.rstrip("/")
    database_url = settings.database_url
    if name == "serve":
        with serve_in_thread(create_app(settings, gateway=gateway)) as url:
            yield Surface(name, gateway, database_url, url, api)
    elif name == "middleware":
        with serve_in_thread(GatewayMiddleware(_no_app, gateway)) as url:  # type: ignore[arg-type]
            yield Surface(name, gateway, database_url, url, api)
    elif name == "inprocess":
        try:
            yield Surface(name, gateway, database_url, "http://llm-gateway", api,
                          transport=GatewayTransport(gateway))
        finally:
            stop_engine(gateway)
    elif name in ("sidecar-reverse", "sidecar-regular"):
        load_or_create_ca(ca_dir)
        mode = name.removeprefix("sidecar-")
        with sidecar_in_thread(gateway, ca_dir, directory, mode=mode) as sidecar:
            proxy = urlsplit(sidecar.proxy)
            if mode == "reverse":
                yield Surface(name, gateway, database_url, sidecar.proxy, api)
            else:  # the app calls the provider's own URL, through the proxy
                upstream = urlsplit(fake_url)
                yield Surface(name, gateway, database_url,
                              f"{upstream.scheme}://{upstream.netloc}", upstream.path,
                              proxy=(proxy.hostname or "", proxy.port or 0))
    else:
        raise ValueError(name)


@contextlib.contextmanager
def local_surface(name: str, directory: Path, fake_url: str, **overrides: object,
                  ) -> Iterator[Surface]:
    """``surface`` on in-process state (a SQLite file, the memory ledger) whatever the
    suite runs on: for tests that look at the ledger's reserved amounts."""
    overrides.setdefault("redis_url", None)
    overrides.setdefault("database_url", f"sqlite:///{directory / 'gateway.db'}")
    with surface(name, directory / name, fake_url, directory / "ca", **overrides) as on:
        yield on


def reserved(gateway: Gateway) -> int:
    """What the (memory) ledger holds reserved now, over every counter."""
    ledger = gateway.quotas.ledger
    return sum(ledger.counter(name)[1] for name in list(ledger._counters))  # type: ignore[attr-defined]


def wait_until(condition: object, timeout: float = 5.0, what: object = "") -> None:
    """``condition()`` true within ``timeout`` (background settlements, written records)."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"the condition did not come true in time {what}"
        time.sleep(0.01)
