"""One request to the fake upstream: reading it, recording it, waiting without outliving its
client, and the ways of answering it (JSON, an injected error, a fault's broken answer)."""

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from llm_gateway.asgi_types import Receive, Send, encode_headers, send_body
from llm_gateway.testing.fake_errors import error_payload, validation_error_payload
from llm_gateway.testing.fake_faults import DeliberateConnectionCut, Fault

_JSON_HEADERS = [("content-type", "application/json")]
# What Anthropic and OpenAI send with a stream of named events.
EVENT_STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
# Anthropic's 429 when a fault does not say how long to wait.
DEFAULT_ANTHROPIC_RETRY_AFTER = "30"


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # every header; lower-case names; repeated ones joined with ", "
    body: bytes
    json: object | None  # the parsed body, or None when it is empty or not JSON
    received_at: float  # time.monotonic() once the whole body was read
    chunk_sent_at: list[float] = field(default_factory=list)  # monotonic, per SSE content chunk
    # True when the client hung up while the fake was deliberately waiting (fault delay or chunk
    # delay). Without a delay the fake never waits, so it cannot notice and this stays False.
    client_hung_up: bool = False
    sent: bytearray = field(default_factory=bytearray)  # every body byte the fake answered


async def read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body  # the common single-message case, without building a list
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
    return b"".join(parts)


def header_dict(raw_headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def parse_json(body: bytes) -> object | None:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return None


def encode_json(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


async def send_json(
    send: Send, status: int, payload: object, extra_headers: Sequence[tuple[str, str]] = ()
) -> None:
    await send_body(send, status, encode_json(payload), [*_JSON_HEADERS, *extra_headers])


def fault_shape(fault: Fault, provider: str) -> str:
    """The shape a fault's error takes: its own, else the imitated provider's default."""
    if fault.shape is not None:
        return fault.shape
    return provider if provider in ("anthropic", "gemini") else "venice"


async def send_fault_status(
    send: Send, fault: Fault, provider: str = "venice", request_id: str | None = None,
) -> None:
    """The injected error: ``fault.body`` verbatim, else ``fault.message`` in the fault's shape
    (see :func:`fault_shape`). Anthropic's 429s say when to come back, as the real ones do."""
    assert fault.status is not None
    shape = fault_shape(fault, provider)
    headers = fault.error_headers()
    # A fault naming its own request id wins, in the body as in the header.
    request_id = next((value for name, value in headers if name == "request-id"), request_id)
    body = fault.body
    if body is None:
        body = encode_json(
            error_payload(shape, fault.status, fault.message, request_id=request_id))
    if shape == "anthropic" and fault.status == 429:
        headers = _with_anthropic_rate_limits(headers, fault.retry_after)
    await send_body(send, fault.status, body, headers)


def _with_anthropic_rate_limits(
    headers: list[tuple[str, str]], retry_after: str | None
) -> list[tuple[str, str]]:
    """Anthropic's 429 headers (retry-after and the exhausted anthropic-ratelimit-* family,
    platform.claude.com/docs/en/api/rate-limits), unless the fault set one itself."""
    seconds = retry_after or DEFAULT_ANTHROPIC_RETRY_AFTER
    try:
        wait = timedelta(seconds=float(seconds))
    except ValueError:  # an HTTP date: the reset is then "now"
        wait = timedelta()
    reset = (datetime.now(UTC) + wait).strftime("%Y-%m-%dT%H:%M:%SZ")
    limits = [("retry-after", seconds)]
    for kind, limit in (("requests", "50"), ("tokens", "40000"),
                        ("input-tokens", "30000"), ("output-tokens", "8000")):
        prefix = f"anthropic-ratelimit-{kind}"
        limits += [(f"{prefix}-limit", limit), (f"{prefix}-remaining", "0"),
                   (f"{prefix}-reset", reset)]
    present = {name for name, _ in headers}
    return [*headers, *((name, value) for name, value in limits if name not in present)]


class ClientPresence:
    """Lets the fake wait without outliving a client that has hung up.

    Only created when the fake has something to wait for; the watcher task that listens for
    ``http.disconnect`` is started lazily on the first wait, so undelayed requests pay nothing.
    """

    __slots__ = ("_hung_up", "_receive", "_watcher")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._hung_up = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    async def wait(self, seconds: float) -> bool:
        """Wait at least ``seconds``; return False as soon as the client hangs up instead."""
        # A monotonic deadline rather than one plain sleep: event-loop timers may fire a hair
        # early, and tests assert that chunk gaps are at least the configured delay.
        deadline = time.monotonic() + seconds
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch_for_hang_up())
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._hung_up.wait(), remaining)
            except TimeoutError:
                continue
            return False
        return not self._hung_up.is_set()

    async def _watch_for_hang_up(self) -> None:
        # The body has been read already, so the next message is the disconnect (the server also
        # reports one once the response is complete; by then nobody waits any more).
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._hung_up.set()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


@dataclass
class Exchange:
    """One authenticated request in flight: what was asked and how to answer."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body_json: object | None
    send: Send
    presence: ClientPresence
    recorded: RecordedRequest | None
    provider: str  # the provider imitated ("venice", "openai", "anthropic"): its errors' shape
    request_id: str = ""  # the id the answer's request-id (or x-request-id) header carries
    api_key: str = ""  # the key it authenticated with: stored responses belong to it

    async def wait(self, seconds: float) -> bool:
        """Wait; False (and noted in the record) when the client hung up meanwhile."""
        still_connected = await self.presence.wait(seconds)
        if not still_connected and self.recorded is not None:
            self.recorded.client_hung_up = True
        return still_connected

    async def reject(self, param: str, problem: str) -> None:
        """A 400 for a missing or mistyped request field."""
        payload = validation_error_payload(self.provider, param, problem,
                                           request_id=self.request_id)
        await send_json(self.send, 400, payload)

    async def send_error(self, status: int, message: str, *, param: str | None = None,
                         code: str | None = None) -> None:
        """An error of the fake's own, in the imitated provider's shape."""
        payload = error_payload(self.provider, status, message, param=param, code=code,
                                request_id=self.request_id)
        await send_json(self.send, status, payload)

    async def start_event_stream(self) -> None:
        await self.send({"type": "http.response.start", "status": 200,
                         "headers": EVENT_STREAM_HEADERS})

    async def send_event(self, event: str, payload: object) -> None:
        """One named SSE event (``event: <name>``, ``data: <json>``), in its own ASGI message
        so it reaches the wire at once."""
        frame = b"event: " + event.encode() + b"\ndata: " + encode_json(payload) + b"\n\n"
        await self.send({"type": "http.response.body", "body": frame, "more_body": True})

    async def send_raw_frame(self, frame: bytes) -> None:
        await self.send({"type": "http.response.body", "body": frame, "more_body": True})

    async def end_stream(self) -> None:
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def send_success(self, payload: object, fault: Fault | None) -> None:
        """Send a 200 JSON answer, or the non-stream counterpart of a stream fault."""
        if fault is None:
            await send_json(self.send, 200, payload)
        elif fault.inband_error is not None:
            if self.provider == "anthropic":  # Anthropic's error body, after a 200
                error = {"type": "overloaded_error", "message": fault.inband_error}
                payload = {"type": "error", "error": error, "request_id": self.request_id}
            elif self.provider == "gemini":  # Gemini's error object, after a 200
                payload = error_payload("gemini", 503, fault.inband_error)
            else:
                payload = {"error": fault.inband_error}
            await send_json(self.send, 200, payload)
        elif fault.malformed_frame:
            await send_body(self.send, 200, b"{not json", _JSON_HEADERS)
        elif fault.cut_after_chunks is not None:
            # Promise the whole body, deliver half, then drop the connection.
            body = encode_json(payload)
            headers = encode_headers([*_JSON_HEADERS, ("content-length", str(len(body)))])
            await self.send({"type": "http.response.start", "status": 200, "headers": headers})
            half = body[: len(body) // 2]
            await self.send({"type": "http.response.body", "body": half, "more_body": True})
            raise DeliberateConnectionCut("fake upstream cut the response body on purpose")
        else:
            await send_json(self.send, 200, payload)
