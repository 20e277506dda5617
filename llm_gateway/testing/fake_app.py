"""The fake upstream itself: a pure ASGI app that checks the key, records the request, applies
any queued fault and hands the request to its endpoint."""

import hmac
import re
import secrets
import time

from llm_gateway.asgi_types import Message, Receive, Scope, Send, answer_lifespan
from llm_gateway.testing import fake_endpoints
from llm_gateway.testing.fake_content import DEFAULT_FAKE_API_KEY, billing_payload
from llm_gateway.testing.fake_errors import error_payload
from llm_gateway.testing.fake_exchange import (
    ClientPresence,
    Exchange,
    RecordedRequest,
    header_dict,
    parse_json,
    read_body,
    send_fault_status,
    send_json,
)
from llm_gateway.testing.fake_faults import Fault, FaultQueue, hide_deliberate_cut_tracebacks

USAGE_MODES = ("venice", "openai")

# The endpoints the fake implements (relative to the prefix); every other path is "billing".
_ENDPOINT_METHODS = {"/chat/completions": "POST", "/embeddings": "POST", "/models": "GET"}

# An HTTP field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class FakeUpstream:
    """An OpenAI/Venice-compatible upstream as a pure ASGI app.

    ``usage_mode`` selects the provider being imitated: "venice" always sends a usage chunk in
    streams and adds ``usage.cost``; "openai" sends stream usage only when the request asked for
    it with ``stream_options.include_usage`` and never adds cost. It also picks the shape of the
    fake's own errors (401, 400, 404, 405) and the chat fields accepted: like the real APIs, both
    modes refuse a chat completion with a top-level field that provider does not document, unless
    ``strict_fields=False``. Injected faults choose their error shape with ``Fault.shape``.

    ``auth_header`` is where the key is expected: "authorization" (``Bearer <key>``), or another
    header carrying the bare key, as Azure's ``api-key`` or Anthropic's ``x-api-key``.
    """

    def __init__(
        self,
        api_key: str = DEFAULT_FAKE_API_KEY,
        *,
        api_prefix: str = "/api/v1",
        usage_mode: str = "venice",
        chunk_count: int = 8,
        chunk_delay: float = 0.0,
        record: bool = True,
        auth_header: str = "authorization",
        strict_fields: bool = True,
    ) -> None:
        if usage_mode not in USAGE_MODES:
            raise ValueError(f"usage_mode must be one of {USAGE_MODES}, not {usage_mode!r}")
        if chunk_count < 0 or chunk_delay < 0:
            raise ValueError("chunk_count and chunk_delay must not be negative")
        if not _HEADER_NAME.fullmatch(auth_header):
            raise ValueError(f"auth_header must be an HTTP header name, not {auth_header!r}")
        self.api_key = api_key
        # Normalised to "/x/y" (or "" for the root) so prefix matching is a plain string test.
        self.api_prefix = "/" + api_prefix.strip("/") if api_prefix.strip("/") else ""
        self.usage_mode = usage_mode
        self.chunk_count = chunk_count
        self.chunk_delay = chunk_delay
        self.record = record
        self.auth_header = auth_header.lower()  # header names are case-insensitive
        self.strict_fields = strict_fields
        self.requests: list[RecordedRequest] = []
        self.connections = 0  # incremented by the runner's protocol on every accepted connection
        # Requests being answered now, and the most at once since the last reset: what a
        # bulkhead in front of the fake must keep under its limit.
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults = FaultQueue()
        hide_deliberate_cut_tracebacks()

    # -- test controls --

    def push_fault(self, fault: Fault) -> None:
        self._faults.push(fault)

    @property
    def pending_faults(self) -> list[Fault]:
        """Faults not yet used up, in the order they will be applied."""
        return self._faults.pending()

    def reset(self) -> None:
        self._faults.clear()
        self.requests.clear()
        self.connections = 0
        self.max_in_flight = self.in_flight

    # -- ASGI entry point --

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._handle_non_http(scope, receive, send)
            return
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._answer(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        send = _with_request_id(send)
        body = await read_body(receive)
        headers = header_dict(scope["headers"])
        body_json = parse_json(body)
        method: str = scope["method"]
        path: str = scope["path"]
        query: str = scope.get("query_string", b"").decode("latin-1")
        recorded: RecordedRequest | None = None
        if self.record:
            # Before any check, so a test can see what a refused request carried too.
            recorded = RecordedRequest(
                method, path, query, headers, body, body_json, received_at=time.monotonic()
            )
            self.requests.append(recorded)
            send = _recording(send, recorded.sent)

        prefix = self.api_prefix
        if path != prefix and not path.startswith(prefix + "/"):
            await send_json(send, 404, error_payload(self.usage_mode, 404, "Not found"))
            return
        if not self._authenticated(headers):
            await self._send_unauthorized(send)
            return

        fault = self._faults.take(path) if self._faults else None
        exchange = Exchange(
            method=method,
            path=path,
            query=query,
            headers=headers,
            body_json=body_json,
            send=send,
            presence=ClientPresence(receive),
            recorded=recorded,
            provider=self.usage_mode,
        )
        try:
            if fault is not None:
                if fault.delay > 0 and not await exchange.wait(fault.delay):
                    return
                if fault.status is not None:
                    await send_fault_status(send, fault)
                    return
            await self._route(exchange, path[len(prefix) :], fault)
        finally:
            exchange.presence.stop()

    def _authenticated(self, headers: dict[str, str]) -> bool:
        presented = headers.get(self.auth_header)
        if presented is None:
            return False
        if self.auth_header == "authorization":
            # The scheme is case-insensitive (RFC 9110 section 11.1); the key is not.
            scheme, _, presented = presented.partition(" ")
            if scheme.lower() != "bearer":
                return False
        # Constant time, as a real provider compares secrets. Header values arrive as latin-1.
        return hmac.compare_digest(presented.encode("latin-1"), self.api_key.encode())

    async def _handle_non_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _send_unauthorized(self, send: Send) -> None:
        if self.usage_mode == "openai":
            message = "Incorrect API key provided."
        else:
            message = "Authentication failed"
        await send_json(send, 401, error_payload(self.usage_mode, 401, message))

    async def _route(self, exchange: Exchange, endpoint: str, fault: Fault | None) -> None:
        expected_method = _ENDPOINT_METHODS.get(endpoint)
        if expected_method is None:
            await exchange.send_success(billing_payload(), fault)
        elif exchange.method != expected_method:
            payload = error_payload(self.usage_mode, 405, "Method not allowed")
            await send_json(exchange.send, 405, payload, [("allow", expected_method)])
        elif endpoint == "/chat/completions":
            await fake_endpoints.chat_completions(
                exchange,
                fault,
                chunk_count=self.chunk_count,
                chunk_delay=self.chunk_delay,
                strict_fields=self.strict_fields,
            )
        elif endpoint == "/embeddings":
            await fake_endpoints.embeddings(exchange, fault)
        else:
            await fake_endpoints.models(exchange, fault)


def _with_request_id(send: Send) -> Send:
    """``send``, with the provider's own ``x-request-id`` on every answer, as OpenAI (and
    most OpenAI-compatible servers) send one: a gateway must not pass it off as its own."""
    request_id = f"req_fake{secrets.token_hex(8)}".encode()

    async def identified_send(message: Message) -> None:
        headers = message.get("headers", [])
        if message["type"] == "http.response.start" and not any(
                name.lower() == b"x-request-id" for name, _ in headers):  # a fault's own wins
            message = {**message, "headers": [*headers, (b"x-request-id", request_id)]}
        await send(message)

    return identified_send


def _recording(send: Send, sent: bytearray) -> Send:
    """``send``, keeping a copy of every body byte: what a test compares a relay with."""

    async def recording_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.extend(message.get("body", b""))
        await send(message)

    return recording_send
