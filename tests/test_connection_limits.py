"""Connection limits: idle, slow and oversized clients are reaped, on `serve` and the sidecar.

In process, the layers as the servers use them: uvicorn with ``connection_options`` (which
also serves a reverse-mode sidecar's port), and a regular-mode sidecar (in a thread) with
the ``ConnectionGuard``, inside its TLS tunnels. Then real processes under a file
descriptor limit of 512: 600 slow sockets, and a 200 MB header.

Deadlines are short here (1 s for headers and idle, 1.5 s for bodies); a socket must be
closed within its deadline plus ``MARGIN``, and not before its deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from cryptography import x509

from asgi_middleware import create_app
from llm_gateway.adapters.ca import CERT_FILE
from llm_gateway.adapters.connection_limits import connection_options
from llm_gateway.adapters.gateway_protocol import server_options
from llm_gateway.adapters.mitm_guard import ConnectionGuard
from llm_gateway.adapters.sidecar import Sidecar
from llm_gateway.config import Settings
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import BIN, create_key, free_port, stop_process, wait_until_up
from tests.test_sidecar import (  # noqa: F401 (fixtures)
    ca_dir,
    connect_through,
    echo_server,
    origin_certificate,
    sidecar_in_thread,
)

HEADER_S, BODY_S, IDLE_S = 1.0, 1.5, 1.0
MAX_HEADER = 8192
LIMITS = {"header_read_timeout_seconds": HEADER_S, "body_read_timeout_seconds": BODY_S,
          "keepalive_timeout_seconds": IDLE_S, "max_header_bytes": MAX_HEADER}
LIMITS_ENV = {"HEADER_READ_TIMEOUT_SECONDS": str(HEADER_S),
              "BODY_READ_TIMEOUT_SECONDS": str(BODY_S),
              "KEEPALIVE_TIMEOUT_SECONDS": str(IDLE_S), "MAX_HEADER_BYTES": str(MAX_HEADER)}
MARGIN = 2.0
TRICKLE_S = 0.2  # one byte this often: well inside any inactivity timer

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\n"
# Answered at once (401: no key) by serve and the sidecar alike.
COMPLETE = b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n"


# ---- slow clients -----------------------------------------------------------------------


@dataclass(frozen=True)
class Slow:
    """A client that opens a connection, sends ``first``, then one byte of ``trickle``
    every TRICKLE_S; the server must close it after ``deadline`` (plus MARGIN)."""

    name: str
    first: bytes
    deadline: float
    statuses: tuple[int, ...]  # the answers it gets, in order
    trickle: bytes = b""


SLOW_CLIENTS = [
    Slow("silent", b"", HEADER_S, ()),
    Slow("partial head", HEAD, HEADER_S, (408,)),
    Slow("trickled head", HEAD[:1], HEADER_S, (408,), trickle=HEAD[1:]),
    Slow("partial body", HEAD + b"content-length: 100\r\n\r\n{", BODY_S, (408,)),
    Slow("trickled body", HEAD + b"content-length: 100\r\n\r\n", BODY_S, (408,),
         trickle=b"{" * 100),
    Slow("idle after an answer", COMPLETE, IDLE_S, (401,)),
    # The first stray byte after an answer starts a header deadline: bytes that never
    # make a request do not keep a connection open.
    Slow("CRLFs after an answer", COMPLETE, TRICKLE_S + HEADER_S, (401, 408),
         trickle=b"\r\n" * 100),
]


@dataclass
class Outcome:
    elapsed: float  # from the first byte sent to the server's close
    received: bytes
    closed: bool


def run_slow_client(address: tuple[str, int], slow: Slow) -> Outcome:
    sock = socket.create_connection(address, timeout=5)
    stop = threading.Event()

    def trickle() -> None:
        for byte in slow.trickle:
            if stop.wait(TRICKLE_S):
                return
            with contextlib.suppress(OSError):
                sock.sendall(bytes([byte]))

    started = time.monotonic()
    sock.sendall(slow.first)
    threading.Thread(target=trickle, daemon=True).start()
    received, closed = read_until_closed(sock, slow.deadline + MARGIN)
    stop.set()
    sock.close()
    return Outcome(time.monotonic() - started, received, closed)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes the connection (True), or until
    ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    received = b""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return received, True
        if not data:
            return received, True
        received += data
    return received, False


def answers(raw: bytes) -> list[tuple[int, dict[str, object]]]:
    """(status, JSON body) of each HTTP/1.1 response in ``raw``."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers.get("content-length", "0"))
        found.append((int(lines[0].split()[1]), json.loads(rest[:length] or b"null")))
        raw = rest[length:]
    return found


def assert_reaped(address: tuple[str, int]) -> None:
    """Every slow client at once (they take seconds each): closed in time, answered so."""
    outcomes: dict[str, Outcome] = {}
    threads = [threading.Thread(target=lambda slow=slow: outcomes.__setitem__(
        slow.name, run_slow_client(address, slow))) for slow in SLOW_CLIENTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for slow in SLOW_CLIENTS:
        outcome = outcomes[slow.name]
        assert outcome.closed, f"{slow.name}: still open after {slow.deadline + MARGIN} s"
        assert outcome.elapsed >= slow.deadline - 0.1, f"{slow.name}: closed too early"
        got = answers(outcome.received)
        assert tuple(status for status, _ in got) == slow.statuses, (slow.name, got)
        for status, body in got:
            code = {401: "invalid_api_key", 408: "request_timeout"}[status]
            assert body["error"]["code"] == code, (slow.name, body)  # type: ignore[index]


def assert_header_limit(address: tuple[str, int]) -> None:
    """Over MAX_HEADER: 431 and closed. Under it, with a body in the same write: served."""
    oversized = b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nx-big: " + b"a" * MAX_HEADER
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(oversized + b"\r\n\r\n")
        received, closed = read_until_closed(sock, MARGIN)
    assert closed
    [(status, body)] = answers(received)
    assert (status, body["error"]["code"]) == (  # type: ignore[index]
        431, "request_header_fields_too_large")

    # A head near the limit and a large body arriving together: only the head counts.
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]})
    head = HEAD + b"x-filler: " + b"f" * (MAX_HEADER - 400) + b"\r\n"
    request = head + f"content-length: {len(body)}\r\n\r\n".encode() + body.encode()
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(request)
        sock.settimeout(5)
        first = sock.recv(65536)
    assert answers(first)[0][0] == 401  # checked for its key, not refused for its size


# ---- in process: uvicorn with connection_options, a sidecar with the guard --------------


@contextlib.contextmanager
def limited_uvicorn(settings: Settings, app: object,
                    options: dict[str, object] | None = None) -> Iterator[tuple[str, int]]:
    """uvicorn serving ``app`` with the protocol serve gives it (``options``: others)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False,  # type: ignore[arg-type]
        **(options if options is not None else server_options(app, settings)),  # type: ignore[arg-type]
    ))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield listener.getsockname()
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def guarded(sidecar: Sidecar) -> None:
    """The guard on a running regular-mode sidecar, unless the sidecar adds it itself (a
    reverse-mode sidecar is served as `serve` is, with its connection limits)."""
    master = sidecar._master
    if master is None:
        assert sidecar.mode == "reverse"
        return
    if master.addons.get("connectionguard") is not None:
        return
    added = threading.Event()

    def add() -> None:
        master.addons.add(ConnectionGuard(sidecar.gateway))
        added.set()

    master.event_loop.call_soon_threadsafe(add)
    assert added.wait(5)


@pytest.fixture(params=["serve", "uvicorn-protocol", "sidecar"])
def server_address(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
                   ca_dir: Path) -> Iterator[tuple[str, int]]:  # noqa: F811
    """serve's own protocol; uvicorn's (every other listener: the admin port), here with
    the same app; the reverse sidecar."""
    settings = make_settings(tmp_path, fake_url, **LIMITS)
    if request.param != "sidecar":
        app = create_app(settings)
        options = connection_options(settings) if request.param == "uvicorn-protocol" else None
        with limited_uvicorn(settings, app, options) as address:
            yield address
        return
    with sidecar_in_thread(build_gateway(settings), ca_dir, tmp_path, mode="reverse") as sc:
        guarded(sc.sidecar)
        assert sc.sidecar.proxy_address is not None
        yield sc.sidecar.proxy_address


def test_slow_and_idle_connections_are_reaped(server_address: tuple[str, int]) -> None:
    assert_reaped(server_address)


def test_the_request_head_is_bounded(server_address: tuple[str, int]) -> None:
    assert_header_limit(server_address)


# ---- the sidecar's tunnels: interception follows the CONNECT target ---------------------


@pytest.fixture
def regular_sidecar(tmp_path: Path, fake_url: str,
                    ca_dir: Path) -> Iterator[tuple[str, Path]]:  # noqa: F811
    settings = make_settings(tmp_path, fake_url, **LIMITS)
    with sidecar_in_thread(build_gateway(settings), ca_dir, tmp_path) as sc:
        guarded(sc.sidecar)
        yield sc.proxy, ca_dir / CERT_FILE


@contextlib.contextmanager
def tcp_echo() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server that echoes what it gets, and keeps it: (port, what it received)."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(65536):
                    received.append(data)
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], received
    finally:
        listener.close()


def issuer(der: bytes) -> x509.Name:
    return x509.load_der_x509_certificate(der).issuer


def test_a_foreign_tunnel_keeps_its_tls_whatever_its_sni(
    regular_sidecar: tuple[str, Path], origin_certificate: tuple[Path, ssl.SSLContext, bytes],  # noqa: F811
) -> None:
    proxy, gateway_ca = regular_sidecar
    _, server_context, origin_der = origin_certificate
    anything = ssl.create_default_context()
    anything.check_hostname, anything.verify_mode = False, ssl.CERT_NONE
    with echo_server(server_context) as port:
        sock, head = connect_through(proxy, f"127.0.0.1:{port}")  # not an LLM host
        assert head.startswith(b"HTTP/1.1 200"), head
        # ... while the SNI names one: still the origin's own certificate, untouched.
        with anything.wrap_socket(sock, server_hostname="api.venice.ai") as tls:
            assert tls.getpeercert(binary_form=True) == origin_der
    # The LLM host itself is still intercepted, with the gateway's CA.
    sock, head = connect_through(proxy, "api.venice.ai:443")
    with anything.wrap_socket(sock, server_hostname="api.venice.ai") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    ca = x509.load_pem_x509_certificate(gateway_ca.read_bytes())
    assert issuer(der) == ca.subject


def test_a_foreign_tunnel_keeps_its_bytes_whatever_its_host_header(
    regular_sidecar: tuple[str, Path],
) -> None:
    proxy, _ = regular_sidecar
    request = COMPLETE.replace(b"Host: gateway", b"Host: api.venice.ai")
    with tcp_echo() as (port, received):
        sock, head = connect_through(proxy, f"127.0.0.1:{port}")
        assert head.startswith(b"HTTP/1.1 200"), head
        with sock:
            sock.sendall(request)
            echoed = b""
            while len(echoed) < len(request):
                echoed += sock.recv(65536)
    assert echoed == request and b"".join(received) == request  # byte for byte


def test_inside_tls_a_slow_head_is_closed_and_an_oversized_one_refused(
    regular_sidecar: tuple[str, Path],
) -> None:
    proxy, gateway_ca = regular_sidecar
    trusting = ssl.create_default_context(cafile=str(gateway_ca))

    def tunnel() -> ssl.SSLSocket:
        sock, head = connect_through(proxy, "api.venice.ai:443")
        assert head.startswith(b"HTTP/1.1 200"), head
        return trusting.wrap_socket(sock, server_hostname="api.venice.ai")

    with tunnel() as tls:
        tls.sendall(HEAD)
        started = time.monotonic()
        _, closed = read_until_closed(tls, HEADER_S + MARGIN)
        assert closed and time.monotonic() - started <= HEADER_S + MARGIN
    with tunnel() as tls:
        tls.sendall(b"GET /api/v1/models HTTP/1.1\r\nHost: api.venice.ai\r\nx-big: "
                    + b"a" * MAX_HEADER + b"\r\n\r\n")
        received, _ = read_until_closed(tls, MARGIN)
    [(status, body)] = answers(received)
    assert (status, body["error"]["code"]) == (  # type: ignore[index]
        431, "request_header_fields_too_large")


# ---- real processes under a file-descriptor limit of 512 -----------------------------

FD_LIMIT = 512
SLOW_SOCKETS = 600


@dataclass
class LimitedProcess:
    process: subprocess.Popen[bytes]
    address: tuple[str, int]
    api: str  # the base URL an OpenAI client uses
    database_url: str

    def peak_rss_kib(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0])


def limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@contextlib.contextmanager
def limited_process(command: list[str], env: dict[str, str], ready_url: str,
                    log_file: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_file.open("wb") as log_output:
        process = subprocess.Popen(command, env={**os.environ, **LIMITS_ENV, **env},
                                   stdout=log_output, stderr=subprocess.STDOUT,
                                   preexec_fn=limit_fds)
        try:
            wait_until_up(ready_url, process, timeout=30)  # type: ignore[arg-type]
            yield process
        finally:
            stop_process(process)


@pytest.fixture(scope="module", params=["serve", "sidecar"])
def process(request: pytest.FixtureRequest, fake_server: tuple[FakeUpstream, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LimitedProcess]:
    directory = tmp_path_factory.mktemp(request.param)
    database_url = f"sqlite:///{directory / 'gateway.db'}"
    port, admin = free_port(), free_port()
    env = {"DATABASE_URL": database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_server[1]}
    if request.param == "serve":
        command = [str(BIN / "llm-gateway"), "serve"]
        env |= {"BIND_ADDR": f"127.0.0.1:{port}", "ADMIN_BIND_ADDR": f"127.0.0.1:{admin}"}
        ready = f"http://127.0.0.1:{port}/healthz"
    else:
        command = [str(BIN / "llm-gateway"), "sidecar", "--mode", "reverse",
                   "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
                   "--ca-dir", str(directory / "ca")]
        ready = f"http://127.0.0.1:{admin}/readyz"
    with limited_process(command, env, ready, directory / "process.log") as running:
        yield LimitedProcess(running, ("127.0.0.1", port), f"http://127.0.0.1:{port}/v1",
                             database_url)


def open_slow_sockets(address: tuple[str, int], count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(HEAD)  # and never the rest
        sockets.append(sock)
    return sockets


def wait_until_all_closed(sockets: list[socket.socket], timeout: float) -> int:
    """How many of ``sockets`` the server still holds open after ``timeout``."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    still_open = set(sockets)
    deadline = time.monotonic() + timeout
    while still_open and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(left):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            with contextlib.suppress(BlockingIOError):
                try:
                    while sock.recv(65536):
                        pass
                except ConnectionResetError:
                    pass
                selector.unregister(sock)
                still_open.discard(sock)
    selector.close()
    return len(still_open)


def test_the_processes_reap_and_bound_too(process: LimitedProcess) -> None:
    assert_reaped(process.address)
    assert_header_limit(process.address)


def test_slow_sockets_do_not_starve_real_requests(process: LimitedProcess,
                                                  fake: FakeUpstream) -> None:
    key = create_key(process.database_url)[1]
    sockets = open_slow_sockets(process.address, SLOW_SOCKETS)
    try:
        # More slow sockets than descriptors: those past the limit wait to be accepted
        # until the first ones are reaped, and then get a deadline of their own.
        assert wait_until_all_closed(sockets, 2 * HEADER_S + 1 + MARGIN) == 0
    finally:
        for sock in sockets:
            sock.close()
    response = httpx.post(process.api + "/chat/completions", timeout=10,
                          headers={"authorization": f"Bearer {key}"},
                          json={"model": "llama-3.3-70b",
                                "messages": [{"role": "user", "content": "Hello"}]})
    assert response.status_code == 200, response.text
    assert process.process.poll() is None


def test_a_200_mb_header_costs_no_memory(process: LimitedProcess) -> None:
    before = process.peak_rss_kib()
    chunk = b"a" * (1024 * 1024)
    # Reset once the server closes the connection: what should happen.
    with socket.create_connection(process.address, timeout=10) as sock, \
            contextlib.suppress(OSError):
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nx-big: ")
        for _ in range(200):
            sock.sendall(chunk)
    time.sleep(0.5)
    growth_mib = (process.peak_rss_kib() - before) / 1024
    assert growth_mib < 50, f"peak RSS grew by {growth_mib:.0f} MiB"
    assert httpx.get(process.api + "/models", timeout=5).status_code == 401  # still serving


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "chunked"])
def test_a_200_mb_body_is_refused_before_it_is_buffered(process: LimitedProcess,
                                                        declared: bool) -> None:
    """413, OpenAI-shaped, as soon as the body is known to be too large: its declared
    length, or its bytes passing the limit (a chunked body)."""
    before = process.peak_rss_kib()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
            b"content-type: application/json\r\n")
    head += b"content-length: 209715200\r\n\r\n" if declared else \
        b"transfer-encoding: chunked\r\n\r\n"
    chunk = b"a" * (1024 * 1024)
    framed = b"100000\r\n" + chunk + b"\r\n" if not declared else chunk
    answer = b""
    with socket.create_connection(process.address, timeout=10) as sock, \
            contextlib.suppress(OSError):
        sock.sendall(head)
        for _ in range(200):
            sock.sendall(framed)
        answer = sock.recv(65536)
    if answer:  # may be cut by the reset the close causes on a client still sending
        assert answer.startswith(b"HTTP/1.1 413")
        assert b'"request_too_large"' in answer
    growth_mib = (process.peak_rss_kib() - before) / 1024
    assert growth_mib < 50, f"peak RSS grew by {growth_mib:.0f} MiB"


class _RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_an_answers_head_leaves_with_its_body_or_at_the_end_of_the_loops_turn() -> None:
    import asyncio

    from llm_gateway.adapters.connection_limits import HeadHeldTransport

    async def scenario() -> list[list[bytes]]:
        seen = []
        inner = _RecordingTransport()
        writes = HeadHeldTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        writes.hold_next = True
        writes.write(b"head|")
        writes.write(b"body")  # a whole answer: one write
        writes.write(b"more")  # not held: only an answer's first write is
        seen.append(list(inner.writes))
        inner.writes.clear()
        writes.hold_next = True
        writes.write(b"stream head|")
        seen.append(list(inner.writes))  # held while the turn lasts
        await asyncio.sleep(0)
        seen.append(list(inner.writes))  # the turn ended: sent alone
        inner.writes.clear()
        writes.hold_next = True
        writes.write(b"refusal")
        writes.close()  # closing sends what is held first
        seen.append(list(inner.writes))
        assert writes.is_closing() and inner.closed  # the rest is the transport's
        await asyncio.sleep(0)
        seen.append(list(inner.writes))  # nothing twice
        return seen

    assert asyncio.run(scenario()) == [
        [b"head|body", b"more"], [], [b"stream head|"], [b"refusal"], [b"refusal"]]
