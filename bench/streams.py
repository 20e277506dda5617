"""Long-lived streams at scale: thousands of paced SSE streams open at once (issue 15).

The phase opens ``streams`` concurrent streams (one chunk every ``delay_ms``, lasting
``seconds``) through a target, in steps (1/8, 1/4, 1/2, then all of them, when the streams last
long enough for four steps), and at each step, once every stream of the step is open, measures
during a window:

- the RSS of the target's process tree (median over the window), against its RSS before the
  first stream: memory per open stream = (RSS at the step - RSS before) / open streams;
- the gaps between consecutive content chunks as the client receives them (nominally
  ``delay_ms``): their p50/p99, and *added* = the target's minus direct's at the same step;
- the client's own CPU (this process's ``process_time`` over wall time): the harness's share.

Then it waits for every stream to end and checks each one: HTTP 200, every content chunk, ending
with ``[DONE]``; anything else (an in-band error, a reset, no data for a while) is an error.

The client is one asyncio ``Protocol`` per connection on raw sockets (uvloop when installed): per
chunk it only counts markers in the received bytes and appends one gap to an array, so it holds
5 000 streams at 50 000 chunks a second in a fraction of one core (its share is reported). The
upstream is ``bench.paced_upstream``, which costs a few microseconds per chunk, for the same
reason: the project's fake upstream cannot feed 50 000 chunks a second on one core.

The same client holds Anthropic Messages and OpenAI Responses streams (``MARKERS``): each
protocol's content event, end and in-band error are its own markers (``content_block_delta``
and ``message_stop``; ``response.output_text.delta`` and ``response.completed``). It also
counts every SSE frame it receives, and with a target's pid gives the target's CPU over the
window and over the whole run with the content events received in each: CPU per content event
(the protocols phase, ``bench.phases.protocols``).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.procstat import CpuSample, rss_bytes
from bench.stats import percentile

CONTENT_MARK = b"is chunk "  # once in every content frame ("This is chunk N of the fake reply.")
DONE_MARK = b"[DONE]"
ERROR_MARK = b'"error"'
END_MARK = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body
FRAME_END = b"\n\n"  # the end of every SSE frame (the paced upstream and serve write no CR)


@dataclass(frozen=True)
class Markers:
    """What the client looks for in a protocol's stream: once in every content event, in
    the event that ends the stream, in an in-band error. ``content`` is the longest, so that
    the bytes kept from one read for the next (one fewer than the longest) never hold a
    whole one, which would be counted twice."""

    content: bytes
    done: bytes
    error: bytes

    @functools.cached_property
    def tail(self) -> int:
        return max(len(self.content), len(self.done), len(self.error), len(END_MARK)) - 1


MARKERS = {
    "chat": Markers(CONTENT_MARK, DONE_MARK, ERROR_MARK),
    # The event lines: the text deltas' payloads hold the chunk's sentence, the .done events
    # and response.completed the whole text again, and response.created an "error": null.
    "messages": Markers(b"event: content_block_delta\n", b"event: message_stop\n",
                        b"event: error\n"),
    "responses": Markers(b"event: response.output_text.delta\n",
                         b"event: response.completed\n", b"event: error\n"),
}
PROTOCOLS = tuple(MARKERS)
OPEN_RATE_PER_SECOND = 1000  # new connections a second while a step opens its streams
SETTLE_SECONDS = 1.0  # after a step's streams are open, before its window starts
KIB = 1024


@dataclass
class StreamShape:
    streams: int
    seconds: float
    delay_ms: int = 100
    stepped: bool = True  # False: every stream opens at once, one window (bench.protocols)

    @property
    def chunks(self) -> int:
        return max(2, round(self.seconds * 1000 / self.delay_ms))

    def steps(self) -> list[int]:
        """Open streams at each measuring step: four steps when the streams last long enough
        for each to open, settle and be measured before the first stream ends (and
        ``stepped``)."""
        if self.stepped and self.seconds >= 20 and self.streams >= 64:
            return sorted({max(1, self.streams // 8), max(1, self.streams // 4),
                           max(1, self.streams // 2), self.streams})
        return [self.streams]


class Window:
    """Where gaps go while a measuring window is open (None: nowhere but the totals)."""

    def __init__(self) -> None:
        self.gaps: array.array[float] | None = None


class PacedStream(asyncio.Protocol):
    """One stream on its own connection, counted and timed chunk by chunk."""

    __slots__ = (
        "all_gaps",
        "content",
        "done",
        "ended",
        "error",
        "error_body",
        "expected",
        "finished",
        "frames",
        "head",
        "last_at",
        "markers",
        "opened_at",
        "payload",
        "previous_at",
        "problem",
        "status",
        "tail",
        "transport",
        "window",
    )

    def __init__(self, payload: bytes, expected: int, window: Window,
                 all_gaps: array.array[float], finished: asyncio.Future[None],
                 markers: Markers = MARKERS["chat"]) -> None:
        self.payload = payload
        self.markers = markers
        self.frames = 0  # SSE frames received (every event, framing ones too)
        self.expected = expected
        self.window = window
        self.all_gaps = all_gaps
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.head = b""
        self.tail = b""
        self.content = 0
        self.done = False
        self.ended = False
        self.error = False
        self.problem: str | None = None
        self.last_at = 0.0
        self.opened_at = 0.0
        self.finished = finished
        self.error_body = b""
        self.previous_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.opened_at = self.last_at = time.perf_counter()
        transport.write(self.payload)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.last_at = now
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                self.status = int(self.head.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
            data = self.head[end + 4:]
            self.head = b""
            if self.status != 200:
                self.error_body = data[:300]
                self.fail(f"HTTP {self.status}")
                return
        markers = self.markers
        # A frame's end split across two reads is counted with the second.
        self.frames += data.count(FRAME_END) + (self.tail[-1:] == b"\n" and data[:1] == b"\n")
        scan = self.tail + data
        found = scan.count(markers.content)
        if found:
            if self.content:  # the first content frame has no gap before it
                gap = now - self.previous_at
                self.all_gaps.append(gap)
                if self.window.gaps is not None:
                    self.window.gaps.append(gap)
                # Frames that arrived together: the later ones had a gap of nothing.
                for _ in range(found - 1):
                    self.all_gaps.append(0.0)
                    if self.window.gaps is not None:
                        self.window.gaps.append(0.0)
            elif found > 1:
                for _ in range(found - 1):
                    self.all_gaps.append(0.0)
            self.content += found
            self.previous_at = now
        if markers.error in scan:
            self.error = True
        if not self.done and markers.done in scan:
            self.done = True
        if self.done and END_MARK in scan:
            self.ended = True
            self.close()
        self.tail = scan[-markers.tail:]

    def fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.problem is None:
            if self.error:
                self.problem = "in-band error"
            elif not self.done:
                self.problem = (f"connection closed after {self.content} of {self.expected} "
                                f"chunks" + (f" ({type(exc).__name__})" if exc else ""))
            elif self.content != self.expected:
                self.problem = f"got {self.content} of {self.expected} chunks"
        if not self.finished.done():
            self.finished.set_result(None)

    @property
    def ok(self) -> bool:
        return self.problem is None and self.done and self.content == self.expected


class RssWatch:
    """The target's RSS every ``interval_s`` seconds, in a thread (never on the client's loop)."""

    def __init__(self, pid: int | None, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="stream-rss")

    def __enter__(self) -> RssWatch:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        assert self.pid is not None
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), rss_bytes(self.pid)))
            self._stop.wait(self.interval_s)

    def median_between(self, start: float, end: float) -> int | None:
        values = [value for at, value in self.samples if start <= at <= end and value]
        return int(statistics.median(values)) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _gap_figures(gaps: Sequence[float]) -> dict[str, object]:
    ordered = sorted(gaps)
    if not ordered:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"count": len(ordered), "p50_ms": _ms(percentile(ordered, 50)),
            "p99_ms": _ms(percentile(ordered, 99)), "max_ms": _ms(ordered[-1])}


async def run_streams(
    host: str, port: int, payload: bytes, shape: StreamShape, pid: int | None,
    say: Callable[[str], None] = lambda _: None, upstream_pid: int | None = None,
    markers: Markers = MARKERS["chat"], window_s: float = 3.0,
) -> dict[str, object]:
    """Open ``shape.streams`` streams in steps, measure each step (a window of at most
    ``window_s``), wait for all to end."""
    loop = asyncio.get_running_loop()
    window = Window()
    all_gaps: array.array[float] = array.array("d")
    streams: list[PacedStream] = []
    finished: list[asyncio.Future[None]] = []
    connect_failures: list[str] = []
    idle_limit = max(10.0, 50 * shape.delay_ms / 1000)
    deadline_s = shape.seconds * 2 + 60
    steps_out: list[dict[str, object]] = []
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    baseline = rss_bytes(pid) if pid is not None else None
    target_started = CpuSample.take(pid) if pid is not None else None

    async def open_one() -> None:
        done: asyncio.Future[None] = loop.create_future()
        stream = PacedStream(payload, shape.chunks, window, all_gaps, done, markers)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: stream, host, port), 15)
        except (OSError, TimeoutError) as exc:
            stream.problem = f"connect: {type(exc).__name__}: {exc}"[:160]
            connect_failures.append(stream.problem)
            done.set_result(None)
        streams.append(stream)
        finished.append(done)

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.perf_counter()
            for stream in streams:
                if stream.transport is not None and now - stream.last_at > idle_limit:
                    stream.fail(f"no data for {idle_limit:.0f}s after {stream.content} chunks")
                elif (stream.transport is not None
                      and now - stream.opened_at > deadline_s):
                    stream.fail(f"not finished after {deadline_s:.0f}s")

    guard = asyncio.create_task(watchdog())
    with RssWatch(pid) as rss:
        first_opened = time.perf_counter()
        created = 0
        for level in shape.steps():
            opening_started = time.perf_counter()
            pending: list[asyncio.Task[None]] = []
            while created < level:
                batch = min(max(1, OPEN_RATE_PER_SECOND // 20), level - created)
                pending += [asyncio.create_task(open_one()) for _ in range(batch)]
                created += batch
                await asyncio.sleep(0.05)
            await asyncio.gather(*pending)
            opened_s = time.perf_counter() - opening_started
            await asyncio.sleep(SETTLE_SECONDS)
            # The window must close before the first stream of the phase ends.
            left = shape.seconds - (time.perf_counter() - first_opened) - 0.5
            length = max(0.5, min(window_s, left))
            window.gaps = array.array("d")
            target_cpu = CpuSample.take(pid) if pid is not None else None
            upstream_cpu = CpuSample.take(upstream_pid) if upstream_pid is not None else None
            cpu_before, started = time.process_time(), time.perf_counter()
            await asyncio.sleep(length)
            ended = time.perf_counter()
            client_cpu = time.process_time() - cpu_before
            gaps, window.gaps = window.gaps, None
            # Connected: the client's socket is open. Streaming: it has received content and
            # not ended (a gateway that cannot keep up leaves streams connected but waiting).
            open_now = sum(1 for s in streams if s.transport is not None)
            streaming = sum(1 for s in streams if s.transport is not None and s.content)
            rss_now = rss.median_between(started, ended) if pid is not None else None
            if rss_now is None and pid is not None:
                rss_now = rss_bytes(pid)
            step: dict[str, object] = {
                "streams": level, "open_in_window": open_now, "streaming_in_window": streaming,
                "opened_in_s": round(opened_s, 2), "window_s": round(ended - started, 2),
                "gaps": _gap_figures(gaps),
                "client_cpu_share": round(client_cpu / (ended - started), 3),
            }
            if upstream_cpu is not None:
                step["upstream_cpu_share"] = round(upstream_cpu.elapsed() / (ended - started), 3)
            if target_cpu is not None:
                spent = target_cpu.elapsed()
                step["target_cpu_share"] = round(spent / (ended - started), 3)
                # Every content event received in the window left a gap (a stream's first
                # has none, and every stream had its first before the window).
                step["content_events"] = len(gaps)
                step["target_cpu_s"] = round(spent, 3)
            if pid is not None and baseline is not None and rss_now is not None:
                step["rss_mib"] = round(rss_now / 2**20, 1)
                # Per stream being served (one refused, broken off or still waiting for its
                # answer holds little or nothing).
                step["rss_kib_per_stream"] = round((rss_now - baseline) / KIB
                                                   / max(1, streaming), 1)
            steps_out.append(step)
            say(f"    {level} streams opened, {streaming} streaming: chunk gap p50/p99 "
                f"{step['gaps']['p50_ms']}/{step['gaps']['p99_ms']} ms"  # type: ignore[index]
                + (f", RSS {step['rss_mib']} MiB ({step['rss_kib_per_stream']} KiB/stream)"
                   if "rss_mib" in step else "")
                + "; CPU shares: "
                + ", ".join(f"{who} {step[f'{who}_cpu_share']}" for who in
                            ("target", "client", "upstream") if f"{who}_cpu_share" in step))
        await asyncio.gather(*finished)
    guard.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await guard
    wall = time.perf_counter() - wall_started
    target_spent = target_started.elapsed() if target_started is not None else None
    ok = sum(stream.ok for stream in streams)
    problems: dict[str, int] = {}
    for stream in streams:
        if not stream.ok:
            problem = stream.problem or "incomplete"
            problems[problem] = problems.get(problem, 0) + 1
    error_bodies = [s.error_body.decode("utf-8", "replace") for s in streams if s.error_body][:2]
    return {
        "streams": shape.streams, "seconds": shape.seconds, "delay_ms": shape.delay_ms,
        "chunks": shape.chunks, "ok": ok, "errors": shape.streams - ok,
        "problems": dict(sorted(problems.items(), key=lambda item: -item[1])[:5]),
        "error_bodies": error_bodies,
        "rss_before_mib": round(baseline / 2**20, 1) if baseline else None,
        "steps": steps_out,
        "gaps_all": _gap_figures(all_gaps),
        "wall_s": round(wall, 1),
        "client_cpu_share": round((time.process_time() - cpu_started) / wall, 3),
        # Over the whole run, every stream from its connection to its end.
        "content_events": sum(stream.content for stream in streams),
        "frames": sum(stream.frames for stream in streams),
        "target_cpu_s": round(target_spent, 3) if target_spent is not None else None,
    }


def stream_payload(host: str, port: int, path: str, authorization: str, model: str,
                   shape: StreamShape) -> bytes:
    """The request every stream sends (max_tokens large enough for every chunk)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                       "stream": True, "max_tokens": shape.chunks * 8 + 64},
                      separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"authorization: {authorization}\r\nx-fake-chunks: {shape.chunks}\r\n"
            f"x-fake-chunk-delay-ms: {shape.delay_ms}\r\ncontent-length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


ANTHROPIC_VERSION = "2023-06-01"  # what the anthropic SDKs and Claude Code send


def protocol_payload(protocol: str, host: str, port: int, key: str, model: str,
                     shape: StreamShape) -> bytes:
    """The request every stream of ``protocol`` sends, as its SDK would: chat as
    ``stream_payload``; Messages with the key in x-api-key and anthropic-version; Responses
    with ``input`` and ``max_output_tokens``. The output cap covers every chunk."""
    cap = shape.chunks * 8 + 64
    if protocol == "chat":
        return stream_payload(host, port, "/v1/chat/completions", f"Bearer {key}", model, shape)
    if protocol == "messages":
        path, auth = "/v1/messages", f"x-api-key: {key}\r\nanthropic-version: {ANTHROPIC_VERSION}"
        body: dict[str, object] = {"model": model, "max_tokens": cap, "stream": True,
                                   "messages": [{"role": "user", "content": "Say hello."}]}
    elif protocol == "responses":
        path, auth = "/v1/responses", f"authorization: Bearer {key}"
        body = {"model": model, "input": "Say hello.", "stream": True, "max_output_tokens": cap}
    else:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    encoded = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"{auth}\r\nx-fake-chunks: {shape.chunks}\r\n"
            f"x-fake-chunk-delay-ms: {shape.delay_ms}\r\ncontent-length: {len(encoded)}\r\n\r\n")
    return head.encode("latin-1") + encoded


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (the client's cost per chunk is what lets it hold 5 000 streams
    on a shared core), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def hold_streams(host: str, port: int, payload: bytes, shape: StreamShape, pid: int | None,
                 say: Callable[[str], None] = lambda _: None,
                 upstream_pid: int | None = None, markers: Markers = MARKERS["chat"],
                 window_s: float = 3.0) -> dict[str, object]:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(
            run_streams(host, port, payload, shape, pid, say, upstream_pid, markers, window_s))
    finally:
        loop.close()


@dataclass(frozen=True)
class Leg:
    """One of several stream sets held at the same time: where, what, whose CPU, markers."""

    host: str
    port: int
    payload: bytes
    pid: int | None
    markers: Markers


def hold_together(legs: Sequence[Leg], shape: StreamShape, upstream_pid: int | None = None,
                  window_s: float = 3.0) -> list[dict[str, object]]:
    """``shape.streams`` streams of every leg at once, on one client loop: their windows
    coincide, so whatever else the host does falls on every leg alike. The client's and the
    upstream's shares are those of all the legs together."""

    async def every_leg() -> list[dict[str, object]]:
        return list(await asyncio.gather(*(
            run_streams(leg.host, leg.port, leg.payload, shape, leg.pid,
                        upstream_pid=upstream_pid, markers=leg.markers, window_s=window_s)
            for leg in legs)))

    loop = new_event_loop()
    try:
        return loop.run_until_complete(every_leg())
    finally:
        loop.close()
