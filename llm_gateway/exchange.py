"""One admitted request, from admission to its usage record: state only, no I/O.

Whoever sends the request (the engine's relay, or the sidecar for what mitmproxy relays)
tells the exchange what came back: the status line, each chunk, a whole body, a transport
failure. ``finish`` turns that into exactly one ``UsageRecord`` and hands it to the
gateway's record sinks, once, whatever happened.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.errors import Headers
from llm_gateway.keys import KeyRecord
from llm_gateway.limits import LimitDecision
from llm_gateway.messages import Endpoint, EndpointKind, IncomingRequest, next_request_id
from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.providers import Profile
from llm_gateway.routing.client import Upstream

# Never forwarded upstream: the caller's credentials, hop-by-hop headers, and anything
# the gateway sets itself.
_DROP_REQUEST_HEADERS = frozenset({
    "authorization", "host", "content-length", "connection", "keep-alive",
    "proxy-authorization", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "accept-encoding", "cookie", "x-api-key", "api-key",
})
# Never relayed to the client: hop-by-hop headers, and what the gateway recomputes
# (length, encoding: bodies are decoded before they are observed).
_DROP_RESPONSE_HEADERS = frozenset({
    "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
    "proxy-connection", "trailer", "upgrade", "set-cookie", "date", "server",
})
# nginx's convention for "the client closed the request".
CLIENT_CLOSED_REQUEST = 499

RecordSink = Callable[[UsageRecord, "Exchange"], None]


class Exchange:
    """One admitted request's state. Built by ``Gateway.admit``."""

    def __init__(
        self,
        request: IncomingRequest,
        endpoint: Endpoint,
        key: KeyRecord,
        limit: LimitDecision,
        model: str | None,
        stream: bool,
        upstream: Upstream,
        profile: Profile,
        on_finish: RecordSink,
    ) -> None:
        self.request = request
        self.endpoint = endpoint
        self.key = key
        self.limit = limit
        self.model = model  # as the caller named it
        self.stream = stream
        self.upstream = upstream
        self.profile = profile
        self._on_finish = on_finish
        self.request_id = next_request_id()
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.status: int | None = None
        self.error_code: str | None = None
        self.attempts = 1
        self.response_started_at: float | None = None
        self.is_sse = False
        self.facts: ResponseFacts | None = None  # a JSON body's, or the stream observer
        self._finished = False

    @property
    def server_address(self) -> str:
        return self.upstream.host

    @property
    def request_body(self) -> bytes:
        return self.request.body

    # ---- what to send -------------------------------------------------------------

    def upstream_url(self) -> str:
        return self.upstream.url(self.endpoint.path, self.request.query)

    def upstream_headers(self) -> Headers:
        headers = [(k, v) for k, v in self.request.headers if k not in _DROP_REQUEST_HEADERS]
        headers.append(("authorization", f"Bearer {self.upstream.api_key.reveal()}"))
        headers.append(("accept-encoding", "identity"))
        return headers

    # ---- what came back -----------------------------------------------------------

    def on_response_start(self, status: int, headers: Iterable[tuple[str, str]]) -> Headers:
        """Record the upstream's status line; returns the headers to give the client."""
        self.status = status
        self.response_started_at = time.monotonic()
        client_headers: Headers = []
        for name, value in headers:
            lower = name.lower()
            if lower in _DROP_RESPONSE_HEADERS or lower.startswith("x-ratelimit-"):
                continue
            if lower == "content-type" and status == 200 and value.startswith("text/event-stream"):
                self.is_sse = True
                self.facts = StreamObserver(self.profile)
            client_headers.append((lower, value))
        if status >= 400:
            self.error_code = "upstream_error"
            # The body is rewritten to OpenAI's shape: say so in the content type.
            client_headers = [(k, v) for k, v in client_headers if k != "content-type"]
            client_headers.append(("content-type", "application/json"))
        client_headers.extend(self.gateway_headers())
        return client_headers

    def gateway_headers(self) -> Headers:
        return [*self.limit.headers(), ("x-request-id", self.request_id)]

    def on_chunk(self, chunk: bytes) -> None:
        if isinstance(self.facts, StreamObserver):
            self.facts.feed(chunk, time.monotonic())

    def complete_body(self, body: bytes) -> bytes:
        """Observe a whole (non-stream) body; returns the body the client gets."""
        if self.status is not None and self.status >= 400:
            return self.profile.error_body(body, self.status)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            return body
        if not isinstance(payload, dict):
            return body
        if self.endpoint.kind is EndpointKind.MODELS:
            return self._models_for_key(payload, body)
        self.facts = ResponseFacts(self.profile)
        self.facts.observe(payload)
        return body

    def _models_for_key(self, payload: dict, body: bytes) -> bytes:
        data = payload.get("data")
        if not self.key.allowed_models or not isinstance(data, list):
            return body
        payload["data"] = [
            m for m in data if isinstance(m, dict) and self.key.allows_model(m.get("id"))
        ]
        return json.dumps(payload).encode()

    def fail(self, status: int, code: str) -> None:
        """The exchange failed in transport (timeout, broken connection). A stream keeps
        the status its client already received."""
        self.status = self.status if self.is_sse and self.status else status
        self.error_code = code

    # ---- finish -------------------------------------------------------------------

    def finish(self, *, client_disconnected: bool = False) -> UsageRecord | None:
        """Make the usage record and hand it on: exactly once, whatever happened. Safe
        to call again (returns None)."""
        if self._finished:
            return None
        self._finished = True
        record = UsageRecord(
            request_id=self.request_id,
            key_id=self.key.id,
            subject_id=self.key.subject_id,
            adapter=self.request.adapter,
            endpoint=self.endpoint.kind.value,
            model=self.model,
            upstream=self.upstream.name,
            stream=self.stream,
            status=self.status if self.status is not None else 502,
            started_at=self.started_wall,
            duration_ms=(time.monotonic() - self.started) * 1000,
            error_type=self.error_code,
            attempts=self.attempts,
        )
        if self.response_started_at is not None:
            record.ttfb_ms = (self.response_started_at - self.started) * 1000
        if self.facts is not None:
            self._apply_facts(record, self.facts)
        if client_disconnected:
            record.error_type = "client_disconnected"
            if self.status is None or not self.is_sse:
                record.status = CLIENT_CLOSED_REQUEST
        self._on_finish(record, self)
        return record

    def _apply_facts(self, record: UsageRecord, facts: ResponseFacts) -> None:
        record.response_id = facts.response_id
        record.finish_reasons = list(facts.finish_reasons)
        record.model = facts.model or self.model
        if facts.usage is not None:
            record.prompt_tokens = facts.usage.prompt_tokens
            record.completion_tokens = facts.usage.completion_tokens
            record.total_tokens = facts.usage.total_tokens
            record.cost_usd = facts.usage.cost_usd
            record.cost_diem = facts.usage.cost_diem
        if not isinstance(facts, StreamObserver):
            return
        facts.close()
        if facts.first_event_at is not None:
            record.first_chunk_ms = (facts.first_event_at - self.started) * 1000
            record.max_gap_ms = facts.max_gap * 1000
        if record.error_type is None and facts.error is not None:
            record.error_type = "upstream_inband_error"
        elif record.error_type is None and not facts.done:
            record.error_type = "stream_incomplete"
