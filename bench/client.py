"""A small asyncio HTTP/1.1 client for what wrk cannot do: streams, and HTTPS through a proxy.

Raw sockets rather than httpx: the client shares a CPU with the fake upstream, and every
microsecond it spends per request or per chunk is one the target under test may not get.
It speaks just enough HTTP/1.1 for the fake upstream and the gateways: keep-alive,
Content-Length and chunked bodies, CONNECT through a proxy, TLS.

Limits (stated in the results as well): one Python process on one event loop, so under high
concurrency the client saturates before wrk would (some tens of thousands of small responses
per second at best), and its timings include its own event-loop latency. That latency is in
the direct measurement too, so figures *added over direct* are fair; absolute figures from
this client are somewhat higher than wrk's.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.stats import LatencySummary, summarize_latencies

CONNECT_TIMEOUT_SECONDS = 10.0
RESPONSE_TIMEOUT_SECONDS = 30.0

_CHUNK_INDEX = re.compile(r"chunk (\d+) of")


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: a plain-HTTP server, or an HTTPS host reached through a proxy."""

    host: str
    port: int
    tls: bool = False
    proxy: tuple[str, int] | None = None  # an HTTP proxy that understands CONNECT
    ca_file: str | None = None  # trust anchors for TLS (the sidecar's CA), else the system's

    @property
    def authority(self) -> str:
        default_port = 443 if self.tls else 80
        return self.host if self.port == default_port else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class RequestSpec:
    """One request, serialised once and sent many times."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def encode(self, endpoint: Endpoint) -> bytes:
        lines = [f"{self.method} {self.path} HTTP/1.1", f"host: {endpoint.authority}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        if self.body or self.method == "POST":
            lines.append(f"content-length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


@dataclass
class Reply:
    status: int
    body: bytes
    sent_at: float  # perf_counter() seconds, just before the request was written
    first_body_byte_at: float | None
    finished_at: float
    head: bytes = b""  # the status line and headers, as received

    def header(self, name: str) -> str | None:
        """The first header called ``name`` (case-insensitive), or None."""
        wanted = name.lower().encode("latin-1")
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == wanted:
                return value.strip().decode("latin-1")
        return None

    @property
    def latency_s(self) -> float:
        return self.finished_at - self.sent_at

    @property
    def ttfb_s(self) -> float | None:
        return None if self.first_body_byte_at is None else self.first_body_byte_at - self.sent_at


class ProtocolError(Exception):
    pass


class HttpConnection:
    """One keep-alive connection; reconnects by itself when the server closed it."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        endpoint = self.endpoint
        if endpoint.proxy is None:
            reader, writer = await asyncio.open_connection(
                endpoint.host, endpoint.port, ssl=_ssl_context(endpoint) if endpoint.tls else None
            )
        else:
            reader, writer = await asyncio.open_connection(*endpoint.proxy)
            target = f"{endpoint.host}:{endpoint.port}"
            writer.write(f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                writer.close()
                raise ProtocolError(f"proxy refused CONNECT {target}: {status}")
            if endpoint.tls:
                await writer.start_tls(_ssl_context(endpoint), server_hostname=endpoint.host)
        self._reader, self._writer = reader, writer

    async def request(self, spec: RequestSpec, payload: bytes | None = None) -> Reply:
        """Send ``spec`` (pre-encoded as ``payload`` when the caller has it) and read all."""
        if self._writer is None:
            await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT_SECONDS)
        assert self._reader is not None and self._writer is not None
        sent_at = time.perf_counter()
        self._writer.write(payload if payload is not None else spec.encode(self.endpoint))
        try:
            return await asyncio.wait_for(
                self._read_reply(self._reader, sent_at, spec.method == "HEAD"),
                RESPONSE_TIMEOUT_SECONDS,
            )
        except BaseException:
            self.close()
            raise

    async def _read_reply(
        self, reader: asyncio.StreamReader, sent_at: float, head_only: bool
    ) -> Reply:
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, _, header_block = head.partition(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        content_length: int | None = None
        chunked = False
        keep_alive = True
        for line in header_block.split(b"\r\n"):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                content_length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep_alive = b"close" not in value.lower()
        parts: list[bytes] = []
        first_body_byte_at: float | None = None
        if head_only:
            pass
        elif chunked:
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # no trailers expected: the blank line
                    break
                data = await reader.readexactly(size + 2)
                if first_body_byte_at is None:
                    first_body_byte_at = time.perf_counter()
                parts.append(data[:-2])
        elif content_length is not None:
            if content_length:
                data = await reader.readexactly(content_length)
                first_body_byte_at = time.perf_counter()
                parts.append(data)
        else:
            keep_alive = False
            while data := await reader.read(65536):
                if first_body_byte_at is None:
                    first_body_byte_at = time.perf_counter()
                parts.append(data)
        finished_at = time.perf_counter()
        if not keep_alive:
            self.close()
        return Reply(status, b"".join(parts), sent_at, first_body_byte_at, finished_at, head)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


_SSL_CONTEXTS: dict[str | None, ssl.SSLContext] = {}


def _ssl_context(endpoint: Endpoint) -> ssl.SSLContext:
    context = _SSL_CONTEXTS.get(endpoint.ca_file)
    if context is None:
        context = ssl.create_default_context(cafile=endpoint.ca_file)
        _SSL_CONTEXTS[endpoint.ca_file] = context
    return context


# ---- closed-loop load ----------------------------------------------------------------------


@dataclass
class ClosedLoopResult:
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    latencies_s: list[float] = field(repr=False)
    error_samples: list[str] = field(default_factory=list)

    def summary(self) -> LatencySummary:
        return summarize_latencies(self.latencies_s)


async def closed_loop(
    endpoint: Endpoint,
    spec: RequestSpec,
    concurrency: int,
    *,
    total_requests: int | None = None,
    duration_s: float | None = None,
) -> ClosedLoopResult:
    """``concurrency`` connections, each sending its next request when the last one answered.

    Stops after ``total_requests`` answers or ``duration_s`` seconds, whichever comes first.
    A non-2xx status or a transport failure counts as an error (and its latency is not kept).
    """
    if total_requests is None and duration_s is None:
        raise ValueError("give total_requests or duration_s")
    payload = spec.encode(endpoint)
    latencies: list[float] = []
    errors = 0
    error_samples: list[str] = []
    issued = 0
    started = time.perf_counter()
    deadline = started + duration_s if duration_s is not None else float("inf")

    async def worker() -> None:
        nonlocal issued, errors
        connection = HttpConnection(endpoint)
        try:
            while time.perf_counter() < deadline and (
                total_requests is None or issued < total_requests
            ):
                issued += 1
                try:
                    reply = await connection.request(spec, payload)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                        TimeoutError, ProtocolError, ValueError) as exc:
                    errors += 1
                    if len(error_samples) < 5:
                        error_samples.append(f"{type(exc).__name__}: {exc}")
                    continue
                if 200 <= reply.status < 300:
                    latencies.append(reply.latency_s)
                else:
                    errors += 1
                    if len(error_samples) < 5:
                        error_samples.append(f"HTTP {reply.status}: {reply.body[:200]!r}")
        finally:
            connection.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return ClosedLoopResult(concurrency, len(latencies) + errors, errors, elapsed, latencies,
                            error_samples)


# ---- streams ---------------------------------------------------------------------------------


@dataclass
class StreamCheck:
    """One SSE reply, timed and checked frame by frame."""

    ok: bool
    problem: str | None
    ttfb_s: float | None  # the first body byte: the first SSE frame
    ttlb_s: float  # the end of the body
    content_chunks: int


def check_stream(reply: Reply, expected_chunks: int) -> StreamCheck:
    """Every content chunk present, in order, and the stream closed with [DONE]."""
    problem: str | None = None
    indexes: list[int] = []
    saw_done = False
    if reply.status != 200:
        problem = f"HTTP {reply.status}"
    else:
        for frame in reply.body.split(b"\n\n"):
            frame = frame.strip()
            if not frame.startswith(b"data:"):
                continue
            data = frame[5:].strip()
            if data == b"[DONE]":
                saw_done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                problem = "a frame is not JSON"
                break
            if "error" in event:
                problem = f"in-band error: {str(event['error'])[:120]}"
                break
            for choice in event.get("choices") or ():
                content = (choice.get("delta") or {}).get("content") or ""
                indexes.extend(int(found) for found in _CHUNK_INDEX.findall(content))
        if problem is None and indexes != list(range(expected_chunks)):
            problem = f"chunks out of order or missing: got {len(indexes)} of {expected_chunks}"
        elif problem is None and not saw_done:
            problem = "no [DONE]"
    return StreamCheck(problem is None, problem, reply.ttfb_s, reply.latency_s, len(indexes))


async def stream_once(endpoint: Endpoint, spec: RequestSpec, expected_chunks: int) -> StreamCheck:
    """One stream on a fresh connection (a stream holds its connection for its whole life)."""
    connection = HttpConnection(endpoint)
    try:
        reply = await connection.request(spec)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
            ProtocolError, ValueError) as exc:
        return StreamCheck(False, f"{type(exc).__name__}: {exc}", None, 0.0, 0)
    finally:
        connection.close()
    return check_stream(reply, expected_chunks)


async def stream_on(
    connection: HttpConnection, spec: RequestSpec, expected_chunks: int
) -> StreamCheck:
    """One stream on a kept-alive connection (for sequential TTFB/TTLB measurements)."""
    try:
        reply = await connection.request(spec)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
            ProtocolError, ValueError) as exc:
        return StreamCheck(False, f"{type(exc).__name__}: {exc}", None, 0.0, 0)
    return check_stream(reply, expected_chunks)


async def held_streams(
    endpoint: Endpoint, spec: RequestSpec, streams: int, expected_chunks: int
) -> list[StreamCheck]:
    """``streams`` streams opened at once, each on its own connection; every one checked."""
    return list(await asyncio.gather(
        *(stream_once(endpoint, spec, expected_chunks) for _ in range(streams))
    ))


def first_problems(checks: Sequence[StreamCheck], limit: int = 3) -> list[str]:
    seen: list[str] = []
    for check in checks:
        if check.problem and check.problem not in seen:
            seen.append(check.problem)
            if len(seen) == limit:
                break
    return seen


async def wait_for_http(endpoint: Endpoint, spec: RequestSpec, timeout_s: float) -> int:
    """Poll until the server answers ``spec`` at all; returns the last status seen."""
    deadline = time.monotonic() + timeout_s
    last_problem = "no answer"
    while time.monotonic() < deadline:
        connection = HttpConnection(endpoint)
        try:
            reply = await connection.request(spec)
            return reply.status
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ProtocolError,
                ValueError) as exc:
            last_problem = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no answer from {endpoint.authority} in {timeout_s}s ({last_problem})")
