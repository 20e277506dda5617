"""The mitmproxy sidecar: real processes, real sockets, the official openai SDK.

Apps reach ``https://api.venice.ai/api/v1`` through the proxy. The name never resolves:
the proxy receives ``CONNECT api.venice.ai:443``, answers the TLS handshake with its own CA
and sends what the engine admitted to the fake upstream on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest

from llm_gateway.adapters.ca import CERT_FILE, install_for_mitmproxy, load_or_create_ca
from llm_gateway.adapters.sidecar import Sidecar
from llm_gateway.billing.metering import UsageRecord
from llm_gateway.config import EgressPolicy, Settings
from llm_gateway.engine import Gateway
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange
from llm_gateway.http_types import IncomingRequest
from llm_gateway.stores import Store, open_store
from llm_gateway.stores.sqlite import SqliteStore
from llm_gateway.testing.fake_upstream import BILLING_SECRET, FakeUpstream, Fault
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import (
    BIN,
    REPO,
    assert_stream_not_buffered,
    closed_port,
    create_key,
    free_port,
    self_signed_certificate,
    stop_process,
)

VENICE = "https://api.venice.ai/api/v1"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]
CHAT = {"model": "llama-3.3-70b", "messages": MESSAGES}
SERVER_KEY = "sk-fake-upstream"


# ---- plumbing: sidecars as processes and in this process --------------------------------


def trusting(cafile: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cafile))


@dataclass
class SidecarProcess:
    proxy: str  # http://127.0.0.1:PORT
    admin: str
    ca_dir: Path
    ca_bundle: Path
    database_url: str

    def key(self, **options: object) -> str:
        return create_key(self.database_url, **options)[1]

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(proxy=self.proxy, verify=trusting(self.ca_bundle), timeout=10,
                            **options)  # type: ignore[arg-type]


def wait_for(url: str, process: subprocess.Popen[bytes], log_file: Path,
             timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}:\n{log_file.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"{url} did not come up:\n{log_file.read_text()}")


@contextlib.contextmanager
def running_process(command: list[str], env: dict[str, str], log_file: Path,
                    ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    with log_file.open("wb") as log_output:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=log_output,
                                   stderr=subprocess.STDOUT)
        try:
            wait_for(ready_url, process, log_file)
            yield process
        finally:
            stop_process(process)


@contextlib.contextmanager
def sidecar_process(fake_url: str, directory: Path, *args: str,
                    env: dict[str, str] | None = None) -> Iterator[SidecarProcess]:
    port, admin_port = free_port(), free_port()
    database_url = f"sqlite:///{directory / 'gateway.db'}"
    sidecar = SidecarProcess(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}",
                             directory / "ca", directory / "bundle" / "ca-bundle.pem",
                             database_url)
    command = [
        str(BIN / "llm-gateway"), "sidecar", "--listen", f"127.0.0.1:{port}",
        "--admin", f"127.0.0.1:{admin_port}", "--ca-dir", str(sidecar.ca_dir),
        "--ca-bundle-out", str(sidecar.ca_bundle), *args,
    ]
    settings_env = {"DATABASE_URL": database_url, "VENICE_API_KEY": SERVER_KEY,
                    "VENICE_BASE_URL": fake_url, **(env or {})}
    with running_process(command, settings_env, directory / "sidecar.log",
                         sidecar.admin + "/readyz"):
        yield sidecar


@pytest.fixture(scope="module")
def proxy(fake_server: tuple[FakeUpstream, str], tmp_path_factory) -> Iterator[SidecarProcess]:  # type: ignore[no-untyped-def]
    with sidecar_process(fake_server[1], tmp_path_factory.mktemp("sidecar")) as sidecar:
        yield sidecar


@dataclass
class InProcessSidecar:
    sidecar: Sidecar
    gateway: Gateway
    proxy: str
    admin: str
    ca_cert: Path

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(proxy=self.proxy, verify=trusting(self.ca_cert), timeout=10,
                            **options)  # type: ignore[arg-type]

    finished: RecordedUsage

    def records(self, count: int = 1, timeout: float = 5) -> list[UsageRecord]:
        """The usage records finish() produced, once there are ``count`` of them."""
        return self.finished.wait_for(count, timeout)


@pytest.fixture(scope="session")
def ca_dir(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("ca")
    load_or_create_ca(directory)
    return directory


@contextlib.contextmanager
def sidecar_in_thread(gateway: Gateway, ca_dir: Path, workdir: Path, *, mode: str = "regular",
                      ca_bundle: Path | None = None,
                      probe: tuple[str, int] | None = None) -> Iterator[InProcessSidecar]:
    """The sidecar on its own event loop in a thread: for engines a test builds itself."""
    confdir = workdir / f"mitmproxy-{time.monotonic_ns()}"
    install_for_mitmproxy(load_or_create_ca(ca_dir), confdir)
    sidecar = Sidecar(gateway, mode=mode, listen=("127.0.0.1", 0), admin=("127.0.0.1", 0),
                      confdir=confdir, ca_bundle=ca_bundle, probe=probe)
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(sidecar.run())
        except BaseException as failure:  # SystemExit too: mitmproxy exits on start-up errors
            failures.append(failure)

    thread = threading.Thread(target=serve, name="sidecar", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not sidecar.started.is_set():
        assert thread.is_alive() and time.monotonic() < deadline, f"no start: {failures}"
        time.sleep(0.005)
    assert sidecar.proxy_address and sidecar.admin_address
    finished = RecordedUsage()
    gateway.add_record_sink(finished)
    try:
        yield InProcessSidecar(
            sidecar, gateway, "http://{}:{}".format(*sidecar.proxy_address),
            "http://{}:{}".format(*sidecar.admin_address), ca_dir / CERT_FILE, finished,
        )
    finally:
        sidecar.shutdown()
        thread.join(10)


def in_process_gateway(tmp_path: Path, fake_url: str, *, store: Store | None = None,
                       **overrides: object) -> Gateway:
    settings = make_settings(tmp_path, fake_url, **overrides)
    return build_gateway(settings, store=store, key_cache_seconds=0)


def chat(client: httpx.Client, url: str, key: str | None, body: object = CHAT,
         **headers: str) -> httpx.Response:
    auth = {"authorization": f"Bearer {key}"} if key else {}
    return client.post(url + "/chat/completions", json=body, headers={**auth, **headers})


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == code
    assert response.headers["content-type"] == "application/json"


def upstream_saw_only_the_server_key(fake: FakeUpstream, gateway_key: str) -> None:
    assert fake.requests
    for seen in fake.requests:
        assert seen.headers["authorization"] == f"Bearer {SERVER_KEY}"
        assert gateway_key not in json.dumps(seen.headers)
        assert gateway_key.encode() not in seen.body
        assert seen.headers["accept-encoding"] == "identity"


# ---- 1. the official SDK, through the proxy ---------------------------------------------


def test_sdk_through_the_proxy(proxy: SidecarProcess, fake: FakeUpstream) -> None:
    key = proxy.key(rate_limit_requests=1000)
    client = openai.OpenAI(base_url=VENICE, api_key=key, max_retries=0,
                           http_client=proxy.client())
    completion = client.chat.completions.create(
        model="llama-3.3-70b", messages=MESSAGES, temperature=0.25,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content.startswith("This is chunk 0")  # type: ignore[union-attr]
    assert completion.usage is not None and completion.usage.total_tokens > 0
    stream = client.chat.completions.create(
        model="llama-3.3-70b", messages=MESSAGES, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith(
        "This is chunk 0")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    embedding = client.embeddings.create(model="text-embedding-bge-m3", input="hello")
    assert len(embedding.data[0].embedding) > 0
    assert {m.id for m in client.models.list()} >= {"llama-3.3-70b"}
    assert [seen.path for seen in fake.requests] == [
        "/api/v1/chat/completions", "/api/v1/chat/completions", "/api/v1/embeddings",
        "/api/v1/models",
    ]
    assert fake.requests[0].json == {**CHAT, "temperature": 0.25}
    upstream_saw_only_the_server_key(fake, key)


def test_an_unmodified_app_with_only_proxy_and_ca_in_its_environment(
    proxy: SidecarProcess, fake: FakeUpstream
) -> None:
    """The app is a separate process whose code names Venice and nothing else."""
    key = proxy.key()
    app = (
        "from openai import OpenAI\n"
        f"client = OpenAI(base_url={VENICE!r})\n"
        "reply = client.chat.completions.create(model='llama-3.3-70b',\n"
        "    messages=[{'role': 'user', 'content': 'Hello'}])\n"
        "print(reply.choices[0].message.content)\n"
    )
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HTTPS_PROXY=proxy.proxy, SSL_CERT_FILE=str(proxy.ca_bundle), OPENAI_API_KEY=key)
    result = subprocess.run([sys.executable, "-c", app], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("This is chunk 0")
    upstream_saw_only_the_server_key(fake, key)


def test_the_ca_bundle_holds_the_public_roots_and_the_gateway_ca(proxy: SidecarProcess) -> None:
    bundle = proxy.ca_bundle.read_bytes()
    ca_cert = (proxy.ca_dir / CERT_FILE).read_bytes()
    assert bundle.endswith(ca_cert)
    assert bundle.count(b"-----BEGIN CERTIFICATE-----") > 10  # the system's roots as well
    assert b"PRIVATE KEY" not in bundle
    assert (proxy.ca_dir / "tls.key").stat().st_mode & 0o777 == 0o600
    log = (proxy.ca_dir.parent / "sidecar.log").read_text()
    assert "SHA-256" in log and "PRIVATE KEY" not in log  # the fingerprint, never the key


def test_admin_port_is_not_the_proxy(proxy: SidecarProcess) -> None:
    assert httpx.get(proxy.admin + "/healthz").json() == {"status": "ok"}
    assert httpx.get(proxy.admin + "/readyz").json()["status"] == "ready"
    assert httpx.get(proxy.admin + "/tls.key").status_code == 404
    # The proxy port answers proxy requests only; its health is not served there.
    assert proxy.admin != proxy.proxy


# ---- 2. streams are relayed, not buffered -----------------------------------------------


def test_stream_is_not_buffered(proxy: SidecarProcess, fake: FakeUpstream) -> None:
    """With 300 ms between upstream chunks, the client holds the first content chunk
    before the upstream has sent the second one."""
    client = openai.OpenAI(base_url=VENICE, api_key=proxy.key(), max_retries=0,
                           http_client=proxy.client())
    assert_stream_not_buffered(client, fake)


# ---- 3. rejections are the sidecar's own and never reach the upstream -------------------


def revoke(database_url: str, key: str) -> None:
    async def work() -> None:
        store = SqliteStore.from_url(database_url)
        try:
            record = await store.find_key(key[:12])
            assert record is not None
            await store.revoke_key(record.id, time.time())
        finally:
            await store.close()

    asyncio.run(work())


def test_rejections_never_reach_the_upstream(proxy: SidecarProcess, fake: FakeUpstream) -> None:
    revoked = proxy.key(name="revoked")
    revoke(proxy.database_url, revoked)
    with proxy.client() as client:
        assert_openai_error(chat(client, VENICE, None), 401, "invalid_api_key")
        assert_openai_error(chat(client, VENICE, "llmg_not-a-real-key"), 401, "invalid_api_key")
        assert_openai_error(chat(client, VENICE, revoked), 401, "invalid_api_key")
        # The provider's own key is no gateway key: refused like any unknown key.
        assert_openai_error(chat(client, VENICE, SERVER_KEY), 401, "invalid_api_key")
        key = proxy.key(name="busy")
        for method, url in [
            ("GET", VENICE + "/billing/usage"),
            ("POST", VENICE + "/api_keys"),
            ("GET", "https://api.venice.ai/dashboard"),
            ("DELETE", VENICE + "/models"),
        ]:
            response = client.request(method, url, headers={"authorization": f"Bearer {key}"})
            assert_openai_error(response, 403, "endpoint_not_allowed")
            assert BILLING_SECRET not in response.text
            assert response.headers["x-request-id"] and response.headers["x-trace-id"]
        too_large = {**CHAT, "padding": "x" * 1_100_000}
        refused = chat(client, VENICE, key, too_large)
        assert_openai_error(refused, 413, "request_too_large")
        assert refused.headers["x-request-id"]
        assert fake.requests == [] and fake.connections == 0

        limited = proxy.key(name="limited", rate_limit_requests=1)
        assert chat(client, VENICE, limited).status_code == 200
        refused = chat(client, VENICE, limited)
        assert_openai_error(refused, 429, "rate_limit_exceeded")
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(fake.requests) == 1  # the one the limit allowed


def test_sdk_reads_the_sidecar_errors(proxy: SidecarProcess, fake: FakeUpstream) -> None:
    client = openai.OpenAI(base_url=VENICE, api_key="llmg_not-a-real-key", max_retries=0,
                           http_client=proxy.client())
    with pytest.raises(openai.AuthenticationError) as raised:
        client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert raised.value.code == "invalid_api_key"
    assert fake.requests == []


# ---- 4. other hosts: untouched ----------------------------------------------------------


class EchoHandler(BaseHTTPRequestHandler):
    """Answers with the request it received, as JSON."""

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def echo_server(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def origin_certificate(tmp_path_factory) -> tuple[Path, ssl.SSLContext, bytes]:  # type: ignore[no-untyped-def]
    """A self-signed certificate for a local TLS origin, made now (no key is committed)."""
    cert_path, key_path, der = self_signed_certificate(tmp_path_factory.mktemp("origin"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return cert_path, context, der


def connect_through(proxy_url: str, target: str) -> tuple[socket.socket, bytes]:
    """Open a CONNECT tunnel by hand; returns the socket and the proxy's whole answer
    (status line, headers and, when the tunnel is refused, the body)."""
    host, port = httpx.URL(proxy_url).host, httpx.URL(proxy_url).port
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(4096)
        if not data:
            break
        answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            while len(body) < int(value):
                body += sock.recv(4096)
    return sock, head + b"\r\n\r\n" + body


def test_other_https_hosts_keep_their_own_certificate(
    proxy: SidecarProcess, origin_certificate: tuple[Path, ssl.SSLContext, bytes]
) -> None:
    cert_path, server_context, origin_der = origin_certificate
    with echo_server(server_context) as port:
        sock, head = connect_through(proxy.proxy, f"127.0.0.1:{port}")
        assert head.startswith(b"HTTP/1.1 200"), head
        client_context = ssl.create_default_context(cafile=str(cert_path))  # not the gateway CA
        with client_context.wrap_socket(sock, server_hostname="localhost") as tls:
            assert tls.getpeercert(binary_form=True) == origin_der
        # The same with an ordinary client: the request arrives as the app sent it.
        with httpx.Client(proxy=proxy.proxy, verify=trusting(cert_path)) as client:
            response = client.get(f"https://localhost:{port}/anything?x=1",
                                  headers={"authorization": "Bearer app-own-token"})
    assert response.status_code == 200
    assert response.json()["path"] == "/anything?x=1"
    assert response.json()["headers"]["authorization"] == "Bearer app-own-token"


def test_plain_http_to_other_hosts_is_forwarded_unmodified(proxy: SidecarProcess) -> None:
    with echo_server() as port, httpx.Client(proxy=proxy.proxy) as client:
        response = client.get(f"http://127.0.0.1:{port}/status?q=1",
                              headers={"authorization": "Bearer app-own-token", "x-app": "1"})
    assert response.status_code == 200
    seen = response.json()
    assert seen["path"] == "/status?q=1"
    assert seen["headers"]["authorization"] == "Bearer app-own-token"
    assert seen["headers"]["x-app"] == "1"


def test_egress_policy_deny_refuses_other_hosts(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path,
    origin_certificate: tuple[Path, ssl.SSLContext, bytes],
) -> None:
    gateway = in_process_gateway(tmp_path, fake_url, egress_policy=EgressPolicy.DENY)
    key = create_key(gateway.settings.database_url)[1]
    with (sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar,
          echo_server(origin_certificate[1]) as tls_port, echo_server() as http_port):
        sock, head = connect_through(sidecar.proxy, f"127.0.0.1:{tls_port}")
        sock.close()
        assert head.startswith(b"HTTP/1.1 403"), head
        assert json.loads(head.partition(b"\r\n\r\n")[2])["error"]["code"] == "egress_denied"
        with sidecar.client() as client:
            denied = client.get(f"http://127.0.0.1:{http_port}/")
            assert_openai_error(denied, 403, "egress_denied")
            assert denied.headers["x-request-id"] and denied.headers["x-trace-id"]
            assert chat(client, VENICE, key).status_code == 200  # LLM hosts still work


# ---- 5. reverse mode: a base URL instead of a CA ----------------------------------------


def test_reverse_mode_needs_no_ca(
    fake_server: tuple[FakeUpstream, str], fake: FakeUpstream, tmp_path: Path
) -> None:
    with sidecar_process(fake_server[1], tmp_path, "--mode", "reverse") as sidecar:
        key = sidecar.key()
        base_url = sidecar.proxy + "/v1"
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        completion = client.chat.completions.create(
            model="qwen3-4b", messages=MESSAGES  # type: ignore[arg-type]
        )
        assert completion.choices[0].message.content
        stream = client.chat.completions.create(
            model="qwen3-4b", messages=MESSAGES, stream=True  # type: ignore[arg-type]
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with httpx.Client() as plain:
            assert_openai_error(chat(plain, base_url, None), 401, "invalid_api_key")
            response = plain.get(base_url + "/billing/usage",
                                 headers={"authorization": f"Bearer {key}"})
            # The sidecar is the base URL here, as `serve` is: no such route (in regular
            # mode, the provider's own path is refused: 403 endpoint_not_allowed).
            assert_openai_error(response, 404, "not_found")
    assert [seen.path for seen in fake.requests] == ["/api/v1/chat/completions"] * 2
    upstream_saw_only_the_server_key(fake, key)


# ---- 6. mitmdump -s, for development -----------------------------------------------------


def test_mitmdump_script_works_with_the_same_variables(
    fake_server: tuple[FakeUpstream, str], fake: FakeUpstream, tmp_path: Path
) -> None:
    port = free_port()
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    key = create_key(database_url)[1]
    confdir = tmp_path / "mitmproxy"
    command = [
        str(BIN / "mitmdump"), "-q", "-s", str(REPO / "addons" / "gateway_addon.py"),
        "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set", f"confdir={confdir}",
    ]
    env = {"DATABASE_URL": database_url, "VENICE_API_KEY": SERVER_KEY,
           "VENICE_BASE_URL": fake_server[1]}
    with (_mitmdump(command, env, tmp_path / "mitmdump.log", port),
          httpx.Client(proxy=f"http://127.0.0.1:{port}",
                       verify=trusting(confdir / "mitmproxy-ca-cert.pem")) as http_client):
        client = openai.OpenAI(base_url=VENICE, api_key=key, max_retries=0,
                               http_client=http_client)
        completion = client.chat.completions.create(
            model="llama-3.3-70b", messages=MESSAGES  # type: ignore[arg-type]
        )
        assert completion.choices[0].message.content
        assert_openai_error(chat(http_client, VENICE, None), 401, "invalid_api_key")
    assert len(fake.requests) == 1
    upstream_saw_only_the_server_key(fake, key)


@contextlib.contextmanager
def _mitmdump(command: list[str], env: dict[str, str], log_file: Path,
              port: int) -> Iterator[None]:
    with log_file.open("wb") as log_output:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=log_output,
                                   stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                assert process.poll() is None, log_file.read_text()
                assert time.monotonic() < deadline, log_file.read_text()
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                time.sleep(0.05)
            yield
        finally:
            stop_process(process)


# ---- 7. one engine, two adapters ---------------------------------------------------------

TIMINGS = ("duration_ms", "ttfb_ms", "first_chunk_ms", "max_gap_ms")


def comparable(record: UsageRecord) -> dict[str, object]:
    fields = dataclasses.asdict(record)
    for name in ("request_id", "trace_id", "adapter", "response_id", "started_at", *TIMINGS):
        fields.pop(name)
    return fields


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_asgi_and_sidecar_write_the_same_finish_record(
    start_gateway, tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path,  # type: ignore[no-untyped-def]
    stream: bool,
) -> None:
    asgi = start_gateway()
    key = asgi.key(name="twin")
    body = {**CHAT, "stream": True} if stream else CHAT
    with httpx.Client(timeout=10) as plain:
        assert chat(plain, asgi.url + "/v1", key, body).status_code == 200
    [asgi_record] = asgi.finished.wait_for(1)

    gateway = in_process_gateway(tmp_path, fake_url)  # the same database, hence the same key
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        assert chat(client, VENICE, key, body).status_code == 200
        [sidecar_record] = sidecar.records()

    assert (asgi_record.adapter, sidecar_record.adapter) == ("asgi", "sidecar")
    assert comparable(sidecar_record) == comparable(asgi_record)
    assert sidecar_record.total_tokens > 0 and sidecar_record.finish_reasons == ["stop"]
    assert sidecar_record.provider_cost_usd is not None
    for record in (asgi_record, sidecar_record):
        assert record.response_id and record.response_id.startswith("chatcmpl-")
        present = TIMINGS if stream else TIMINGS[:2]
        assert all(getattr(record, name) is not None for name in present), record
    assert [seen.json for seen in fake.requests] == [body, body]


def test_upstream_connections_are_reused(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    """One upstream connection for many requests on one client connection: the engine's
    pool sends every request, streams included (mitmproxy carries streams from the
    engine's relay, whose loopback connections close with each stream)."""
    gateway = in_process_gateway(tmp_path, fake_url)
    key = create_key(gateway.settings.database_url)[1]
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        for body in (CHAT, {**CHAT, "stream": True}, CHAT, {**CHAT, "stream": True},
                     {**CHAT, "stream": True}, CHAT):
            assert chat(client, VENICE, key, body).status_code == 200
    assert len(fake.requests) == 6 and fake.connections == 1


# ---- 8. the engine sends what is not a stream: its retries, timeouts and errors ----------


def test_an_unreachable_upstream_gets_the_gateways_502(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{closed_port()}/api/v1"
    with sidecar_process(closed, tmp_path, "--mode", "reverse",
                         env={"VENICE_MAX_RETRIES": "1"}) as sidecar:
        client = openai.OpenAI(base_url=sidecar.proxy + "/v1", api_key=sidecar.key(),
                               max_retries=0)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(
                model="llama-3.3-70b", messages=MESSAGES  # type: ignore[arg-type]
            )
        assert raised.value.status_code == 502
        assert raised.value.code == "upstream_unreachable"
        assert raised.value.response.headers["content-type"] == "application/json"


def test_retries_and_timeouts_are_the_engines(
    fake_server: tuple[FakeUpstream, str], fake: FakeUpstream, tmp_path: Path
) -> None:
    with (sidecar_process(fake_server[1], tmp_path, "--mode", "reverse",
                          env={"REQUEST_TIMEOUT_SECONDS": "0.5"}) as sidecar,
          httpx.Client(timeout=10) as client):
        key, base_url = sidecar.key(), sidecar.proxy + "/v1"
        fake.push_fault(Fault(status=503, retry_after="0"))
        assert chat(client, base_url, key).status_code == 200
        assert len(fake.requests) == 2  # the 503, then the retry
        fake.push_fault(Fault(delay=2))
        started = time.monotonic()
        assert_openai_error(chat(client, base_url, key), 504, "upstream_timeout")
        assert time.monotonic() - started < 1.5
    upstream_saw_only_the_server_key(fake, key)


def test_a_retried_request_records_its_attempts(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    gateway = in_process_gateway(tmp_path, fake_url)
    key = create_key(gateway.settings.database_url)[1]
    fake.push_fault(Fault(status=503, retry_after="0"))
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        assert chat(client, VENICE, key).status_code == 200
        [record] = sidecar.records()
    assert (record.status, record.attempts, record.error_code) == (200, 2, None)
    assert record.total_tokens and record.finish_reasons == ["stop"]


def test_client_gone_mid_stream_is_recorded(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    gateway = in_process_gateway(tmp_path, fake_url)
    key = create_key(gateway.settings.database_url)[1]
    slow = {"x-fake-chunks": "20", "x-fake-chunk-delay-ms": "100"}
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        with client.stream("POST", VENICE + "/chat/completions", json={**CHAT, "stream": True},
                           headers={"authorization": f"Bearer {key}", **slow}) as response:
            assert next(response.iter_bytes()).startswith(b"data: ")
        # Leaving the block closed the connection half-way through the stream.
        [record] = sidecar.records()
    assert record.error_code == "client_disconnected"
    # 499: the client closed the request, though its stream had started with a 200.
    assert record.status == 499 and record.stream and record.first_chunk_ms is not None
    deadline = time.monotonic() + 5
    while not fake.requests[0].client_hung_up and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.requests[0].client_hung_up  # the upstream stream was closed as well


def test_upstream_gone_mid_stream_is_recorded(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    gateway = in_process_gateway(tmp_path, fake_url)
    key = create_key(gateway.settings.database_url)[1]
    fake.push_fault(Fault(cut_after_chunks=2))
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        with client.stream("POST", VENICE + "/chat/completions", json={**CHAT, "stream": True},
                           headers={"authorization": f"Bearer {key}"}) as response:
            body = b"".join(response.iter_bytes())
        [record] = sidecar.records()
    # As serve ends it: an error event in OpenAI's shape, then [DONE] (SDKs raise).
    *_, error, done = body.strip().split(b"\n\n")
    assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == (
        "upstream_stream_interrupted")
    assert done == b"data: [DONE]"
    assert record.error_code == "upstream_stream_interrupted"
    assert record.status == 200 and record.finish_reasons == []


def test_client_gone_while_the_engine_waits_is_recorded(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    gateway = in_process_gateway(tmp_path, fake_url)
    key = create_key(gateway.settings.database_url)[1]
    fake.push_fault(Fault(delay=3))
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar:
        with sidecar.client() as client, pytest.raises(httpx.ReadTimeout):
            client.post(VENICE + "/chat/completions", json=CHAT, timeout=0.5,
                        headers={"authorization": f"Bearer {key}"})
        started = time.monotonic()
        [record] = sidecar.records()
        assert time.monotonic() - started < 1  # recorded as the client left, not at 3 s
    assert (record.status, record.error_code) == (499, "client_disconnected")
    assert len(fake.requests) == 1


# ---- 9. fail closed ----------------------------------------------------------------------


class ExplodingKeyStore:
    """The real store, except that key lookups raise while ``exploding`` is set."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.exploding = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def key_by_prefix(self, prefix: str) -> object:
        if self.exploding:
            raise RuntimeError("the key store exploded")
        return await self.inner.key_by_prefix(prefix)


@pytest.mark.parametrize("mode", ["regular", "reverse"])
def test_fail_closed_when_the_key_store_raises(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path, mode: str
) -> None:
    settings: Settings = make_settings(tmp_path, fake_url)
    key = create_key(settings.database_url)[1]
    store = ExplodingKeyStore(open_store(settings.database_url))
    gateway = in_process_gateway(tmp_path, fake_url, store=store)  # type: ignore[arg-type]
    with sidecar_in_thread(gateway, ca_dir, tmp_path, mode=mode) as sidecar:
        if mode == "regular":
            client = sidecar.client()
            # Through a CONNECT tunnel, and in plain HTTP straight at the upstream's own
            # address (an LLM host too): had the flow gone on unchanged, the fake had it.
            base_urls = [VENICE, fake_url]
        else:
            client = httpx.Client(timeout=10)
            base_urls = [sidecar.proxy + "/v1"]
        with client:
            for base_url in base_urls:
                assert_openai_error(chat(client, base_url, key), 500, "gateway_error")
            assert fake.requests == [] and fake.connections == 0
            # The control: with the store back, the same requests do reach the fake.
            store.exploding = False
            for base_url in base_urls:
                assert chat(client, base_url, key).status_code == 200
    assert len(fake.requests) == len(base_urls)


def crash_after_admission(gateway: Gateway) -> Gateway:
    """Admits as usual, then the exchange breaks while the request is being rewritten."""
    admit = gateway.admit

    async def admit_then_break(request: IncomingRequest) -> Exchange | Rejection:
        admitted = await admit(request)
        if isinstance(admitted, Exchange):
            def explode() -> list[tuple[str, str]]:
                raise RuntimeError("crashed after the gateway key was checked")

            admitted.upstream_headers = explode  # type: ignore[method-assign]
        return admitted

    gateway.admit = admit_then_break  # type: ignore[method-assign]
    return gateway


def test_fail_closed_after_the_key_was_checked(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    gateway = crash_after_admission(in_process_gateway(tmp_path, fake_url))
    key = create_key(gateway.settings.database_url)[1]
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        for base_url in (VENICE, fake_url):
            assert_openai_error(chat(client, base_url, key), 500, "gateway_error")
        records = sidecar.records(2)
    assert fake.requests == [] and fake.connections == 0
    assert [(r.status, r.error_code) for r in records] == [(500, "gateway_error")] * 2


def logs_an_error_as_it_starts(gateway: Gateway) -> Gateway:
    """Logs an error while the sidecar starts, as a request the key store failed does."""
    start = gateway.start

    async def start_and_log() -> None:
        await start()
        logging.getLogger("llm_gateway.engine").error("a request failed while starting")

    gateway.start = start_and_log  # type: ignore[method-assign]
    return gateway


def test_an_error_the_gateway_logs_while_starting_does_not_stop_the_sidecar(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    """mitmproxy's start-up check exits on any error logged before start-up is over: that
    is for its own (a failed bind), never for one request the gateway answered 500."""
    gateway = logs_an_error_as_it_starts(in_process_gateway(tmp_path, fake_url))
    key = create_key(gateway.settings.database_url)[1]
    with sidecar_in_thread(gateway, ca_dir, tmp_path) as sidecar, sidecar.client() as client:
        time.sleep(0.2)  # had the check seen the error, the proxy would be gone by now
        assert chat(client, VENICE, key).status_code == 200
        assert httpx.get(sidecar.admin + "/readyz").status_code == 200


def sidecar_that_cannot_start(tmp_path: Path, fake_url: str, port: int,
                              database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "llm-gateway"), "sidecar", "--listen", f"127.0.0.1:{port}",
         "--admin", f"127.0.0.1:{free_port()}", "--ca-dir", str(tmp_path / "ca")],
        env={**os.environ, "DATABASE_URL": database_url, "VENICE_API_KEY": SERVER_KEY,
             "VENICE_BASE_URL": fake_url},
        capture_output=True, text=True, timeout=60,
    )


def test_a_proxy_port_in_use_stops_the_sidecar(tmp_path: Path, fake_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = sidecar_that_cannot_start(tmp_path, fake_url, port,
                                             f"sqlite:///{tmp_path / 'gateway.db'}")
    assert finished.returncode == 1
    assert f"failed to listen on 127.0.0.1:{port}" in finished.stderr


def test_a_key_store_down_at_start_stops_the_sidecar_with_one_line(
    tmp_path: Path, fake_url: str
) -> None:
    port = free_port()
    finished = sidecar_that_cannot_start(
        tmp_path, fake_url, port, f"postgresql://postgres@127.0.0.1:{closed_port()}/test")
    assert finished.returncode == 1
    [line] = [line for line in finished.stderr.splitlines() if " ERROR " in line]
    assert "cannot start: the key store is unreachable" in line
    assert "Traceback" not in finished.stderr
    with pytest.raises(OSError):  # the proxy port never opened
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_readiness_waits_for_the_ca_bundle(
    tmp_path: Path, fake_url: str, fake: FakeUpstream, ca_dir: Path
) -> None:
    bundle = tmp_path / "not-yet" / "ca-bundle.pem"
    gateway = in_process_gateway(tmp_path, fake_url)
    with sidecar_in_thread(gateway, ca_dir, tmp_path, ca_bundle=bundle) as sidecar:
        assert httpx.get(sidecar.admin + "/healthz").status_code == 200
        not_ready = httpx.get(sidecar.admin + "/readyz")
        assert not_ready.status_code == 503 and "CA bundle" in not_ready.text
        bundle.parent.mkdir()
        bundle.write_bytes((ca_dir / CERT_FILE).read_bytes())
        assert httpx.get(sidecar.admin + "/readyz").status_code == 200


def test_clients_that_offer_http2(proxy: SidecarProcess, fake: FakeUpstream) -> None:
    """mitmproxy settles such clients on HTTP/1.1 (or HTTP/2); either way they work."""
    key = proxy.key()
    with proxy.client(http2=True) as client:
        assert chat(client, VENICE, key).status_code == 200
        with client.stream("POST", VENICE + "/chat/completions", json={**CHAT, "stream": True},
                           headers={"authorization": f"Bearer {key}"}) as streamed:
            assert b"data: [DONE]" in b"".join(streamed.iter_bytes())
        assert_openai_error(chat(client, VENICE, None), 401, "invalid_api_key")
    assert len(fake.requests) == 2
    upstream_saw_only_the_server_key(fake, key)
