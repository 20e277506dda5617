"""serve's own HTTP/1.1 protocol (``adapters/gateway_protocol.py``), on a real socket: what
HTTP clients other than the SDKs do, byte by byte (every other test of `serve` and of the
in-thread gateway goes through it too; the connection limits are in
test_connection_limits.py)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx

from tests.conftest import RunningGateway

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "hi"}]}


def address(gw: RunningGateway) -> tuple[str, int]:
    parts = urlsplit(gw.url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def post(key: str, body: bytes, *, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (b"POST /v1/chat/completions HTTP/" + version + b"\r\nHost: gw\r\n"
            b"authorization: Bearer " + key.encode() + b"\r\ncontent-type: application/json\r\n"
            + extra + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def read_answers(sock: socket.socket, count: int, timeout: float = 10.0) -> list[
        tuple[int, dict[str, str], bytes]]:
    """``count`` whole answers (content-length or chunked), in order."""
    sock.settimeout(timeout)
    buffer = b""
    answers = []
    while len(answers) < count:
        while b"\r\n\r\n" not in buffer:
            data = sock.recv(65536)
            assert data, f"closed after {len(answers)} answers: {buffer!r}"
            buffer += data
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value for name, value in
                   (line.split(": ", 1) for line in lines)}
        status = int(status_line.split(" ")[1])
        if status == 100:
            continue
        if "content-length" in headers:
            length = int(headers["content-length"])
            while len(buffer) < length:
                buffer += sock.recv(65536)
            body, buffer = buffer[:length], buffer[length:]
        else:
            assert headers.get("transfer-encoding") == "chunked"
            body = b""
            while True:
                while b"\r\n" not in buffer:
                    buffer += sock.recv(65536)
                size_line, buffer = buffer.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(buffer) < size + 2:
                    buffer += sock.recv(65536)
                body, buffer = body + buffer[:size], buffer[size + 2:]
                if size == 0:
                    break
        answers.append((status, headers, body))
    return answers


def closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_pipelined_requests_are_answered_in_order_on_one_connection(gw: RunningGateway) -> None:
    key = gw.key()
    body = json.dumps(CHAT).encode()
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n" + post(key, body)
                     + b"GET /nowhere HTTP/1.1\r\nHost: gw\r\n\r\n" + post("llmg_nope", body))
        answers = read_answers(sock, 4)
    assert [status for status, _, _ in answers] == [200, 200, 404, 401]
    assert json.loads(answers[1][2])["object"] == "chat.completion"
    assert json.loads(answers[2][2])["error"]["code"] == "not_found"
    assert all("x-request-id" in headers for _, headers, _ in answers[1:])
    assert len(gw.finished.wait_for(1)) == 1


def test_a_stream_is_chunked_and_the_connection_kept(gw: RunningGateway) -> None:
    key = gw.key()
    with socket.create_connection(address(gw)) as sock:
        for _ in range(2):
            sock.sendall(post(key, json.dumps({**CHAT, "stream": True}).encode()))
            [(status, headers, body)] = read_answers(sock, 1)
            assert (status, headers["content-type"]) == (200, "text/event-stream")
            assert body.endswith(b"data: [DONE]\n\n")
    assert [record.status for record in gw.finished.wait_for(2)] == [200, 200]


def test_expect_100_continue_gets_its_interim_answer(gw: RunningGateway) -> None:
    key = gw.key()
    body = json.dumps(CHAT).encode()
    request = post(key, body, extra=b"expect: 100-continue\r\n")
    head, _ = request.split(b"\r\n\r\n", 1)
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(head + b"\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        [(status, _, _)] = read_answers(sock, 1)
    assert status == 200


def test_a_body_declared_too_large_gets_no_100_continue_whatever_the_header_order(
        start_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = start_gateway(request_body_limit_bytes=1000)
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                     b"expect: 100-continue\r\ncontent-length: 5000\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")


def test_a_body_over_the_limit_is_refused_unread_and_the_connection_serves_on(
        start_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = start_gateway(request_body_limit_bytes=1000)
    key = gw.key()
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nauthorization: Bearer "
               + key.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%b\r\n" % (len(part), part)
                          for part in (big[:2500], big[2500:])) + b"0\r\n\r\n")
    with socket.create_connection(address(gw)) as sock:
        # Declared too large (answered before the body, which is then skipped), sent in
        # chunks and found too large, then one that fits: three answers, one connection.
        sock.sendall(post(key, big) + chunked + post(key, json.dumps(CHAT).encode()))
        answers = read_answers(sock, 3)
    assert [status for status, _, _ in answers] == [413, 413, 200]
    assert json.loads(answers[0][2])["error"]["code"] == "request_too_large"
    assert len(gw.finished.wait_for(1)) == 1


def test_what_is_not_http_gets_an_openai_shaped_400_and_a_close(gw: RunningGateway) -> None:
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(b"HELLO THERE\r\n\r\n")
        [(status, headers, body)] = read_answers(sock, 1)
        assert closed(sock)
    assert (status, headers["connection"]) == (400, "close")
    assert json.loads(body)["error"]["code"] == "malformed_http"
    assert "x-request-id" in headers


def test_http_1_0_and_connection_close_are_closed_after_their_answer(
        gw: RunningGateway) -> None:
    key = gw.key()
    body = json.dumps(CHAT).encode()
    for request in (post(key, body, version=b"1.0"),
                    post(key, body, extra=b"connection: close\r\n")):
        with socket.create_connection(address(gw)) as sock:
            sock.sendall(request)
            [(status, headers, _)] = read_answers(sock, 1)
            assert (status, headers["connection"]) == (200, "close")
            assert closed(sock)


def test_head_gets_the_head_alone(gw: RunningGateway) -> None:
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        sock.settimeout(5)
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b'{"status":"ok"}'):
            received += sock.recv(65536)
    first, second = received.split(b"HTTP/1.1 ")[1:]
    assert first.endswith(b"\r\n\r\n") and b"content-length: 15" in first
    assert second.endswith(b'{"status":"ok"}')


def test_a_client_gone_mid_stream_is_recorded_once_as_499(start_gateway) -> None:  # type: ignore[no-untyped-def]
    from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream

    with running_fake_upstream(FakeUpstream(chunk_delay=0.2)) as (_, slow_url):
        gw = start_gateway(slow_url)
        key = gw.key()
        with socket.create_connection(address(gw)) as sock:
            sock.sendall(post(key, json.dumps({**CHAT, "stream": True}).encode()))
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        [record] = gw.finished.wait_for(1)
        assert (record.status, record.error_code) == (499, "client_disconnected")
        time.sleep(0.5)
        assert len(gw.finished.records) == 1


def test_the_sdk_and_httpx_see_the_same_answers_as_from_the_middleware(
        gw: RunningGateway) -> None:
    key = gw.key()
    with httpx.Client(base_url=gw.url) as client:
        answer = client.post("/v1/chat/completions", json=CHAT,
                             headers={"authorization": f"Bearer {key}"})
        assert answer.status_code == 200 and answer.json()["usage"]["total_tokens"] > 0
        assert client.get("/readyz").json()["status"] in ("ready", "degraded")
        assert "llm_gateway" in client.get("/metrics").text
        assert client.get("/v1/chat/completions").json()["error"]["code"] == "not_found"


def test_a_request_framed_two_ways_is_refused_not_smuggled(gw: RunningGateway) -> None:
    """Content-Length beside Transfer-Encoding, or two Content-Lengths: llhttp's strict
    framing refuses both, so nothing hides a second request inside a body."""
    key = gw.key()
    body = json.dumps(CHAT).encode()
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
    for framing in (b"content-length: 5\r\ntransfer-encoding: chunked\r\n",
                    b"content-length: %d\r\ncontent-length: 5\r\n" % len(body)):
        with socket.create_connection(address(gw)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nauthorization: "
                         b"Bearer " + key.encode() + b"\r\n" + framing + b"\r\n"
                         + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) + smuggled)
            [(status, _, answer)] = read_answers(sock, 1)
            assert closed(sock)
        assert (status, json.loads(answer)["error"]["code"]) == (400, "malformed_http")
    assert gw.finished.records == []


def test_a_pipelined_body_that_never_ends_never_cuts_into_the_answer_before_it(
        start_gateway) -> None:  # type: ignore[no-untyped-def]
    """Its body deadline closes the connection; no 408 is written into a stream under way."""
    from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream

    with running_fake_upstream(FakeUpstream(chunk_delay=0.5)) as (_, slow_url):
        gw = start_gateway(slow_url, body_read_timeout_seconds=1.0)
        key = gw.key()
        with socket.create_connection(address(gw)) as sock:
            sock.sendall(post(key, json.dumps({**CHAT, "stream": True}).encode())
                         + post(key, json.dumps(CHAT).encode())[:-5])  # 5 bytes short
            received, started = b"", time.monotonic()
            sock.settimeout(10)
            while data := sock.recv(65536):
                received += data
        assert time.monotonic() - started < 5
    assert received.startswith(b"HTTP/1.1 200 OK") and b"HTTP/1.1 408" not in received


def test_under_a_root_prefix_the_probes_answer_on_both_paths(
        start_gateway) -> None:  # type: ignore[no-untyped-def]
    """API_PREFIX: / puts the API at the server's root; /healthz, /readyz and /metrics stay
    the probes', served by serve's protocol and by the middleware alike (the middleware
    once sent them to the app: 404)."""
    import asyncio

    from llm_gateway.adapters.asgi import create_app

    gw = start_gateway(api_prefix="")
    key = gw.key()

    async def probe(client: httpx.AsyncClient) -> None:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/v1/chat/completions")).status_code == 404

    async def both() -> None:
        app = create_app(gw.gateway.settings, gateway=gw.gateway)
        async with httpx.AsyncClient(base_url="http://asgi",
                                     transport=httpx.ASGITransport(app=app)) as middleware:
            await probe(middleware)
        async with httpx.AsyncClient(base_url=gw.url) as served:
            await probe(served)
            answer = await served.post("/chat/completions", json=CHAT,
                                       headers={"authorization": f"Bearer {key}"})
            assert answer.status_code == 200

    asyncio.run(both())


def test_a_pipelined_request_that_expects_100_continue_gets_it_when_its_turn_comes(
        gw: RunningGateway) -> None:
    """Its head came while the request before it was answered: the interim answer goes once
    that answer is out, not never (the client would wait out its own expect timeout)."""
    key = gw.key()
    body = json.dumps(CHAT).encode()
    head, _ = post(key, body, extra=b"expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(post(key, body) + head + b"\r\n\r\n")
        received, started = b"", time.monotonic()
        sock.settimeout(5)
        while not received.endswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
            received += sock.recv(65536)
        # Under curl's 1 s: the interim answer came, not the client's own expect timeout.
        assert time.monotonic() - started < 0.8
        assert received.startswith(b"HTTP/1.1 200 OK") and received.count(b"HTTP/1.1") == 2
        sock.sendall(body)
        [(second, _, _)] = read_answers(sock, 1)
    assert second == 200
    assert len(gw.finished.wait_for(2)) == 2


def test_a_request_asking_to_upgrade_is_answered_plainly_and_the_connection_closed(
        gw: RunningGateway) -> None:
    """The gateway upgrades to nothing; the parser reads no further once a request asks to,
    so what follows on the connection is never left waiting: the answer says close."""
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\n\r\nGET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        [(status, headers, body)] = read_answers(sock, 1)
        assert (status, headers.get("connection"), json.loads(body)) == (
            200, "close", {"status": "ok"})
        assert closed(sock)


def test_a_malformed_request_after_good_ones_is_refused_after_their_answers(
        gw: RunningGateway) -> None:
    """In one write: two requests, then bytes that are not HTTP/1.1. Both are answered, in
    order, then the 400, then the close (found by tests/test_http_fuzz.py: the 400 went out
    in place of the first answer, still being admitted, or that answer was lost)."""
    key = gw.key()
    body = json.dumps(CHAT).encode()
    with socket.create_connection(address(gw)) as sock:
        sock.sendall(post(key, body) + b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
                     + b"GET /healthz HTTP/1.1\r\nHost: gw\r\nbad header\r\n\r\n")
        answers = read_answers(sock, 3)
        assert closed(sock)
    assert [status for status, _, _ in answers] == [200, 200, 400]
    assert json.loads(answers[0][2])["object"] == "chat.completion"
    assert json.loads(answers[2][2])["error"]["code"] == "malformed_http"
    assert answers[2][1]["connection"] == "close"
