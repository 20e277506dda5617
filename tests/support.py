"""Test plumbing: real servers on real sockets, in threads or subprocesses."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llm_gateway.adapters.asgi import GatewayMiddleware
from llm_gateway.adapters.gateway_protocol import server_options
from llm_gateway.billing.metering import UsageRecord
from llm_gateway.keys import KeyRecord, new_key_record
from llm_gateway.stores import open_store

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# Set TEST_DATABASE_URL (a postgresql:// URL of a database the tests may use to create
# others) to run every gateway the suite starts on Postgres instead of a SQLite file;
# TEST_REDIS_URL to give them the Redis limiter too. Tests that need the services for
# themselves use these, or the local defaults below.
TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL") or None
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL") or None
POSTGRES_URL = TEST_DATABASE_URL or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = TEST_REDIS_URL or "redis://127.0.0.1:6379/0"


def _free_ports() -> Iterator[int]:
    # Below the kernel's ephemeral range (32768-60999 by default), so no outgoing connection
    # and no server bound to port 0 can take a port between our pick and the server's bind:
    # a port picked with bind(0) once went to another test's client first (EADDRINUSE, exit
    # 3). Each xdist worker gets its own block, so workers never pick the same port either.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = 20000 + (int(worker) % 12) * 1000
    start = secrets.randbelow(1000)  # another run on this machine likely starts elsewhere
    while True:
        for offset in range(1000):
            port = first + (start + offset) % 1000
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:  # still held, by a server of this run or anything else
                    continue
            yield port


_FREE_PORTS = _free_ports()
_FREE_PORTS_LOCK = threading.Lock()


def free_port() -> int:
    """A port nothing listens on now and nothing outside the tests will take."""
    with _FREE_PORTS_LOCK:
        return next(_FREE_PORTS)


_CLOSED: list[socket.socket] = []


def closed_port() -> int:
    """A port where nothing listens, kept so for the rest of the run: bound but never
    listening (a connection is refused at once), so no server started later can take it.
    A port free_port() had picked once was taken by another test's gateway, which then
    answered in place of "refused"."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _CLOSED.append(sock)
    return int(sock.getsockname()[1])


def need_service(what: str, reachable: bool) -> None:
    """Outside CI a missing service skips with the reason; in CI it fails the test."""
    if reachable:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is not reachable, and CI requires it")
    pytest.skip(f"{what} is not reachable (start it, or run in CI where it is required)")


@contextmanager
def serve_in_thread(app: object, host: str = "127.0.0.1") -> Iterator[str]:
    """Run an ASGI app on uvicorn in a background thread; yields its base URL. The
    standalone gateway (``create_app``) is served as serve serves it: by its own protocol,
    with the connection limits of its settings."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    port = listener.getsockname()[1]
    options: dict[str, object] = {}
    if isinstance(app, GatewayMiddleware) and app.standalone:
        options = server_options(app, app.gateway.settings)
    server = uvicorn.Server(uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False,  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    ))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.005)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def create_key(database_url: str, **options: object) -> tuple[KeyRecord, str]:
    """Insert a key straight into the store (what `keys create` does)."""

    async def work() -> tuple[KeyRecord, str]:
        store = open_store(database_url)
        try:
            await store.migrate()
            record, key = new_key_record(
                name=str(options.pop("name", "test")), subject_id=None, now=time.time(),
                **options,  # type: ignore[arg-type]
            )
            await store.insert_key(record)
            return record, key
        finally:
            await store.close()

    return asyncio.run(work())


@contextmanager
def gateway_process(
    env: dict[str, str], *args: str, ready_path: str = "/healthz", port: int | None = None
) -> Iterator[str]:
    """Run `llm-gateway serve` (or another subcommand) as a real process; yields its URL."""
    port = port or free_port()
    full_env = {**os.environ, "BIND_ADDR": f"127.0.0.1:{port}", **env}
    command = [str(BIN / "llm-gateway"), *(args or ("serve",))]
    # Into a file, not a pipe: a gateway logs a line per request, and a pipe nobody reads
    # would fill and stop it.
    with tempfile.TemporaryFile(mode="w+") as output:
        process = subprocess.Popen(command, env=full_env, stdout=output,
                                   stderr=subprocess.STDOUT, text=True)
        process.output_file = output  # type: ignore[attr-defined]
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(base + ready_path, process)
            yield base
        finally:
            stop_process(process)


def stop_process(process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM (a clean shutdown flushes usage records and spans), then SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def wait_until_up(url: str, process: subprocess.Popen[str] | None = None,
                  timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            output = _output_of(process)
            raise AssertionError(f"process exited with {process.returncode}:\n{output}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not come up in {timeout}s")


def _output_of(process: subprocess.Popen[str]) -> str:
    saved = getattr(process, "output_file", None)
    if saved is not None:
        saved.seek(0)
        return str(saved.read())
    return process.stdout.read() if process.stdout else ""


def usage_records(database_url: str) -> list[UsageRecord]:
    """Every usage record the store holds, oldest first."""

    async def read() -> list[UsageRecord]:
        store = open_store(database_url)
        try:
            return await store.usage_records()
        finally:
            await store.close()

    return asyncio.run(read())


# ---- Postgres and Redis ----------------------------------------------------------------

def postgres_reachable(url: str = POSTGRES_URL) -> bool:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


def redis_reachable(url: str = REDIS_URL) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def with_database(url: str, database: str, *, search_path: str | None = None) -> str:
    """``url`` pointed at another database (and schema, through libpq's ``options``)."""
    parts = urlsplit(url)
    query = f"options={quote(f'-csearch_path={search_path}')}" if search_path else ""
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", query, ""))


def create_database(server_url: str = POSTGRES_URL) -> str:
    """A new, empty database on the server ``server_url`` names; returns its URL."""
    import psycopg

    name = f"llmg_test_{secrets.token_hex(6)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    return with_database(server_url, name)


def drop_database(database_url: str) -> None:
    import psycopg

    name = urlsplit(database_url).path.lstrip("/")
    assert name.startswith("llmg_test_"), "only ever drop what the tests created"
    with psycopg.connect(with_database(database_url, "postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]


def create_schema(database_url: str) -> str:
    """A new, empty schema in ``database_url``; returns a URL whose connections use it.
    Cheaper than a database per test, and as isolated for the gateway's tables."""
    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")  # type: ignore[arg-type]
    return with_database(database_url, urlsplit(database_url).path.lstrip("/"),
                         search_path=name)


class SessionDatabase:
    """One Postgres database for the whole test session, created on first use and
    dropped at the end (conftest's session fixture calls ``drop``)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.url: str | None = None
        self._per_directory: dict[Path, str] = {}

    def database(self) -> str:
        if self.url is None:
            self.url = create_database(self.server_url)
        return self.url

    def schema_for(self, directory: Path) -> str:
        """The same schema for the same test directory, like a SQLite file in it."""
        if directory not in self._per_directory:
            self._per_directory[directory] = create_schema(self.database())
        return self._per_directory[directory]

    def drop(self) -> None:
        if self.url is not None:
            drop_database(self.url)
            self.url = None


SESSION_DATABASE = SessionDatabase(POSTGRES_URL)


def fresh_database_url(directory: Path) -> str:
    """Where a test's gateway keeps its state: a SQLite file in ``directory``, or with
    TEST_DATABASE_URL set, a schema of its own in the session's Postgres database."""
    if TEST_DATABASE_URL:
        return SESSION_DATABASE.schema_for(directory)
    return f"sqlite:///{directory / 'gateway.db'}"


class PrivateRedis:
    """A redis-server of the test's own, to stop and start again: the machine's shared
    Redis serves other tests and people and is never stopped."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        # Its Unix socket as well, on a short path (a socket path is at most 107 bytes),
        # named after its port as its TCP address is; removed when it stops.
        self.socket = Path(tempfile.gettempdir()) / f"llmg-redis-{self.port}.sock"
        self.socket_url = f"unix://{self.socket}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory),
             "--unixsocket", str(self.socket), "--unixsocketperm", "700"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not redis_reachable(self.url):
            assert self.process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()  # as abrupt as a crash: no goodbye to the clients
            self.process.wait(10)
            self.process = None
        self.socket.unlink(missing_ok=True)  # a killed server leaves it behind


@contextmanager
def private_redis(directory: Path) -> Iterator[PrivateRedis]:
    if not shutil.which("redis-server"):
        need_service("redis-server (the binary, to run a private Redis)", False)
    server = PrivateRedis(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class GatewayProcess:
    url: str
    process: subprocess.Popen[str]
    output: list[str]  # every line it printed, collected by a reader thread


@contextmanager
def gateway_processes(env: dict[str, str], count: int) -> Iterator[list[GatewayProcess]]:
    """``count`` `llm-gateway serve` processes with the same environment, started
    together (each imports for a second or so); yields once all answer /healthz."""
    started: list[GatewayProcess] = []
    try:
        for _ in range(count):
            port = free_port()
            process = subprocess.Popen(
                [str(BIN / "llm-gateway"), "serve"],
                env={**os.environ, **env, "BIND_ADDR": f"127.0.0.1:{port}"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            output: list[str] = []

            def read(process: subprocess.Popen[str] = process, output: list[str] = output) -> None:
                assert process.stdout is not None
                output.extend(process.stdout)

            threading.Thread(target=read, daemon=True).start()
            started.append(GatewayProcess(f"http://127.0.0.1:{port}", process, output))
        for gateway in started:
            try:
                wait_until_up(gateway.url + "/healthz", timeout=30)
            except AssertionError:
                raise AssertionError("".join(gateway.output)) from None
        yield started
    finally:
        for gateway in started:
            gateway.process.terminate()
        for gateway in started:
            try:
                gateway.process.wait(10)
            except subprocess.TimeoutExpired:
                gateway.process.kill()


def assert_stream_not_buffered(client: object, fake: object) -> None:
    """With 300 ms between upstream chunks, the SDK client holds the first content chunk
    before the fake upstream (in this process: one monotonic clock) sent the second."""
    stream = client.chat.completions.create(  # type: ignore[attr-defined]
        model="llama-3.3-70b", messages=[{"role": "user", "content": "Tell me a story"}],
        stream=True, extra_headers={"x-fake-chunks": "3", "x-fake-chunk-delay-ms": "300"},
    )
    first_content_at = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_content_at = time.monotonic()
            break
    assert first_content_at is not None
    list(stream)
    [seen] = fake.requests  # type: ignore[attr-defined]
    assert len(seen.chunk_sent_at) == 3
    assert seen.chunk_sent_at[0] <= first_content_at < seen.chunk_sent_at[1]


def send_keys_as_prompts(gw: object, keys: list[str]) -> None:
    """One chat completion per key, the key itself as the prompt: what an at-rest scan
    must then not find anywhere."""
    for key in keys:
        response = httpx.post(
            gw.url + "/v1/chat/completions",  # type: ignore[attr-defined]
            headers={"authorization": f"Bearer {key}"},
            json={"model": "llama-3.3-70b", "messages": [{"role": "user", "content": key}]},
        )
        assert response.status_code == 200


def self_signed_certificate(directory: Path) -> tuple[Path, Path, bytes]:
    """A certificate for ``localhost`` and 127.0.0.1, signed by its own key, made now (no key
    is committed): its PEM file, its key's PEM file, and the certificate in DER."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "origin.crt", directory / "origin.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path, certificate.public_bytes(serialization.Encoding.DER)


def roomy_window(now: float | None = None, margin: float = 120) -> int:
    """A rate-limit window (about an hour) with at least ``margin`` seconds left at ``now``
    (the limiter's clock; this machine's by default). Windows are epoch-aligned: a burst
    that straddled two would be admitted up to the limit in each."""
    now = time.time() if now is None else now
    return next(w for w in range(3600, 3500, -1) if w - now % w >= margin)
