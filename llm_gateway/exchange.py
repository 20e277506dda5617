"""One admitted request, from admission to its usage record: state only, no I/O.

The relay tells the exchange which target it tries and what came back: the status line,
each stream frame, a whole body, a transport failure. ``finish`` turns that into exactly
one ``UsageRecord`` and hands it to the gateway's record sinks, once, whatever happened.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable

from llm_gateway import jsonio
from llm_gateway.billing.quotas import QuotaDecision, usd_units
from llm_gateway.billing.records import ERROR_MESSAGE_CHARS, UsageRecord, decimal_or_none
from llm_gateway.billing.spool import PROGRESS_SECONDS
from llm_gateway.caller_text import header_value
from llm_gateway.crypto import mask_secret
from llm_gateway.errors import Headers
from llm_gateway.http_types import IncomingRequest, next_request_id
from llm_gateway.keys import KeyRecord
from llm_gateway.limits import LimitDecision
from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.protocols import Endpoint
from llm_gateway.protocols.crossing import Crossing
from llm_gateway.providers import Profile, profile_named
from llm_gateway.routing.router import Plan
from llm_gateway.routing.table import ProviderConfig, Target
from llm_gateway.telemetry.tracing import Trace
from llm_gateway.tokens import OUTPUT_OVER_CAP, estimate_chars, far_over_cap
from llm_gateway.version import VERSION

# Which account the server-held key bills (an OpenAI key may belong to several
# organizations and projects): the gateway's to set (a provider's `headers:`), never a
# caller's, and never told to an app either.
_KEY_ACCOUNT_HEADERS = frozenset({"openai-organization", "openai-project"})
# Never forwarded upstream: the caller's credentials, hop-by-hop headers, and anything
# the gateway sets itself.
_DROP_REQUEST_HEADERS = _KEY_ACCOUNT_HEADERS | {
    "authorization", "host", "content-length", "connection", "keep-alive",
    "proxy-authorization", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "accept-encoding", "cookie", "x-api-key", "api-key", "user-agent",
    "traceparent", "tracestate",
}
# Never relayed to the client: hop-by-hop headers, and what the gateway recomputes
# (length, encoding: bodies are decoded before they are observed).
_DROP_RESPONSE_HEADERS = _KEY_ACCOUNT_HEADERS | {
    "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
    "proxy-connection", "trailer", "upgrade", "set-cookie", "date", "server",
}
# The gateway's own request headers (x-llm-gateway-tags): the gateway's to read, never a
# provider's.
GATEWAY_HEADER_PREFIX = "x-llm-gateway-"
# The provider's own request id: relayed under this name, as the client's x-request-id is
# the gateway's (the one in the usage record), and a second one would garble it.
UPSTREAM_REQUEST_ID = "x-llm-gateway-upstream-request-id"
# nginx's convention for "the client closed the request".
CLIENT_CLOSED_REQUEST = 499
USER_AGENT = f"llm-gateway/{VERSION}"

RecordSink = Callable[[UsageRecord, "Exchange"], None]
ProgressSink = Callable[[str, dict[str, object]], None]
log = logging.getLogger("llm_gateway")


class Exchange:
    """One admitted request's state. Built by ``Gateway.admit``."""

    def __init__(
        self,
        request: IncomingRequest,
        endpoint: Endpoint,
        key: KeyRecord,
        limit: LimitDecision,
        payload: dict | None,
        plan: Plan,
        on_finish: RecordSink,
        quota: QuotaDecision | None = None,
        *,
        request_id: str | None = None,
        trace: Trace | None = None,
        tags: dict[str, str] | None = None,
        on_progress: ProgressSink | None = None,
    ) -> None:
        self.request = request
        # Whom it is for: the caller's x-llm-gateway-tags (admitted), its body's tags and user.
        self.tags, self.end_user = endpoint.protocol.attribution(tags or {}, payload)
        self.endpoint = endpoint
        self.key = key
        self.limit = limit
        self.payload = payload  # the decoded body (POST), for the per-target rewrite
        self.plan = plan
        self._on_finish = on_finish
        self.quota = quota or QuotaDecision()
        self._payload_changed = False
        self.protocol = endpoint.protocol
        # How the request reaches the current target: as it came, or translated.
        self.crossing = Crossing(self.protocol)
        if payload is not None and self.quota.max_tokens is not None and endpoint.operation.capped:
            # The budget's cap, in the field the caller used.
            self.payload = self.protocol.with_output_cap(payload, self.quota.max_tokens)
            self._payload_changed = True
        self.model: str | None = payload.get("model") if payload else None  # as named
        self.stream = bool(payload and payload.get("stream") is True)
        self.client_wants_usage = bool(payload) and self.protocol.wants_stream_usage(payload)
        self.request_id = request_id or next_request_id()
        self.trace = trace or Trace(f"{random.getrandbits(128):032x}",
                                    f"{random.getrandbits(64):016x}", None)
        self.response_bytes = 0  # what the client got, for the access log
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.target: Target | None = None
        self.provider: ProviderConfig | None = None
        self.profile: Profile = profile_named(plan.provider(plan.targets[0]).profile)
        self.status: int | None = None
        self.error_code: str | None = None
        self.error_message: str | None = None
        self.attempts = 0
        self.response_started_at: float | None = None
        self.is_sse = False
        self.facts: ResponseFacts | None = None  # a JSON body's, or the stream observer
        self._unread_body: bytes | None = None  # a JSON body not observed yet
        self._finished = False
        # The relay is yielding a stream's last chunk, an end of the gateway's own.
        self.ending = False
        self._on_progress = on_progress
        self._progress_due = 0.0  # monotonic: a stream's progress is reported from then
        self._prompt_estimate: int | None = None

    @property
    def prompt_estimate(self) -> int:
        """The prompt's tokens, estimated (tokens.py), worked out once."""
        if self._prompt_estimate is None:
            self._prompt_estimate = (self.protocol.prompt_tokens(self.payload)
                                     if self.payload else 0)
        return self._prompt_estimate

    @property
    def output_cap(self) -> int | None:
        """The output the answer may have, its choices together: the cap as sent (the
        budget's where it clamped or added one); None: none. A stream is ended past it,
        a whole answer far above it flagged (tokens.py)."""
        cap = self.protocol.output_cap(self.payload) if self.payload else None
        return cap * self.protocol.choices(self.payload) if cap and self.payload else None

    @property
    def cut_at_cap(self) -> bool:
        """The relay ended the stream past its output cap."""
        return self.is_sse and self.error_code == OUTPUT_OVER_CAP

    @property
    def protocol_name(self) -> str:
        """The record's ``protocol``: the wire protocol (chat, messages, ...), else the
        endpoint's kind (models, other)."""
        return self.protocol.wire or self.protocol.name

    @property
    def end_relayed(self) -> bool:
        """The stream's end went to the client: the protocol's own (the upstream's), or
        the gateway's (an error event that ends it)."""
        return self.ending or (self.facts is not None and self.facts.done)

    @property
    def server_address(self) -> str:
        return self.provider.host if self.provider else ""

    @property
    def request_body(self) -> bytes:
        return self.request.body

    # ---- what to send -------------------------------------------------------------

    def begin_attempt(self, target: Target) -> ProviderConfig:
        """The relay is about to send to ``target``."""
        self.attempts += 1
        self.target = target
        self.provider = self.plan.provider(target)
        self.profile = profile_named(self.provider.profile)
        wire = self.provider.wire_for(self.protocol.wire)
        if wire != self.crossing.wire.wire and self.payload is not None:
            # Another protocol than the last attempt's (or the caller's): raises
            # Untranslatable for what no target of it takes (admission checked the plan).
            self.crossing = Crossing(self.protocol, wire, self.payload, now=self.started_wall)
        return self.provider

    def upstream_url(self) -> str:
        assert self.provider is not None and self.target is not None
        if self.crossing.translation is not None:
            return self.provider.url(*self.crossing.path(self.target.model, self.stream))
        return self.provider.url(self.request.path.rstrip("/") or "/", self.request.query)

    def upstream_headers(self) -> Headers:
        assert self.provider is not None
        owned = self.provider.owned_headers
        foreign = self.crossing.dropped_headers({k for k, _ in self.request.headers})
        headers = [(k, v) for k, v in self.request.headers
                   if k not in _DROP_REQUEST_HEADERS and k not in owned and k not in foreign
                   and not k.startswith(GATEWAY_HEADER_PREFIX)]
        headers.extend(self.provider.headers)
        for name, value in self.profile.default_headers:  # what the caller left out
            if all(name != sent for sent, _ in headers):
                headers.append((name, value))
        headers.extend(self.provider.auth_headers())
        headers.append(("accept-encoding", "identity"))
        headers.append(("user-agent", USER_AGENT))
        headers.append(("traceparent", self.trace.traceparent))
        return headers

    def upstream_body(self) -> bytes:
        """The body for the current target: the model it knows the alias by and the
        provider's spelling; the caller's bytes unchanged when nothing differs."""
        assert self.target is not None
        payload = self.payload
        if payload is None:
            return self.request.body
        if self.crossing.translation is not None:
            return jsonio.dumps(self.crossing.payload(self.profile, self.target.model,
                                                      stream=self.stream))
        prepared = self.protocol.upstream_payload(self.profile, payload, stream=self.stream)
        if self.target.model != payload.get("model"):
            prepared = {**prepared, "model": self.target.model}
        if prepared is payload and not self._payload_changed:
            return self.request.body
        return jsonio.dumps(prepared)

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
            if lower == "x-request-id":
                lower = UPSTREAM_REQUEST_ID
            if lower == "content-type" and status == 200 and value.startswith("text/event-stream"):
                self.is_sse = True
                self.facts = self.crossing.wire.stream_observer(self.profile)
                if self.crossing.translation is not None:
                    self.crossing.start_stream()
            client_headers.append((lower, self._scrub_text(value)))
        if status >= 400:
            self.error_code = "upstream_error"
            # The body is rewritten to the protocol's shape: say so in the content type.
            client_headers = [(k, v) for k, v in client_headers if k != "content-type"]
            client_headers.append(("content-type", "application/json"))
        client_headers.extend(self.gateway_headers())
        return client_headers

    def gateway_headers(self) -> Headers:
        headers = [*self.limit.headers(), *self.quota.headers,
                   ("x-request-id", self.request_id), ("x-trace-id", self.trace.trace_id)]
        if self.quota.max_tokens is not None and self.quota.clamped_from is not None:
            headers.append(("x-llm-gateway-max-tokens-clamped", str(self.quota.max_tokens)))
        if self.target is not None:
            # A passthrough target's model is the caller's string: escaped, as any value
            # the gateway did not choose (caller_text).
            target = self.target
            headers.append(("x-llm-gateway-upstream",
                            header_value(f"{target.provider}/{target.model}")))
        headers.append(("x-llm-gateway-attempts", str(self.attempts)))
        if dropped := self.crossing.dropped:
            # What the target's protocol could not take and only tuned behaviour (a name
            # may hold a caller's string: a tool's type).
            headers.append(("x-llm-gateway-dropped", header_value(", ".join(dropped))))
        return headers

    def client_status(self, status: int) -> int:
        """The status the caller gets for the target's (a translated 529 is a 503)."""
        return self.crossing.client_status(status)

    def stream_error(self, code: str, message: str) -> bytes:
        """The end of a stream that failed after its status was sent, in the caller's
        protocol."""
        if self.crossing.stream is not None:
            return self.crossing.stream_error(code, message)
        return self.protocol.stream_error(code, message, self.facts)

    def on_frame(self, frame: bytes) -> bytes | None:
        """Observe one whole SSE frame; returns what the client gets of it: None for an
        event the protocol keeps from the client (a usage chunk it did not ask for), the
        frame with the provider's key masked should the provider echo it."""
        observer = self.facts
        if isinstance(observer, StreamObserver):
            now = time.monotonic()
            payloads = observer.feed(frame, now)
            if now >= self._progress_due:
                self._report_progress(observer, now)
            if (stream := self.crossing.stream) is not None:
                out = b"".join([stream.feed(payload) for payload in payloads])
                if observer.done:
                    out += stream.end()
                return self._scrub(out) if out else None
            for payload in payloads:
                if not self.protocol.relays(payload, self.client_wants_usage):
                    return None
        return self._scrub(frame)

    def _report_progress(self, observer: StreamObserver, now: float) -> None:
        """How far the stream has got, for the spool: what a kill leaves of it."""
        self._progress_due = now + PROGRESS_SECONDS
        if self._on_progress is not None and self.target is not None:
            self._on_progress(self.request_id, {
                "provider": self.target.provider, "upstream_model": self.target.model,
                "prompt_tokens": self.prompt_estimate, "text_chars": observer.text_chars})

    def _provider_key(self) -> bytes | None:
        if self.provider is None or not self.provider.api_key:
            return None
        return self.provider.api_key.reveal().encode()

    def _scrub(self, data: bytes) -> bytes:
        """The provider's key, should an answer carry it (some echo the Authorization
        they got in an error), never reaches a caller: it is masked."""
        key = self._provider_key()
        if key is None or key not in data:
            return data
        return data.replace(key, mask_secret(key.decode()).encode())

    def _scrub_text(self, value: str) -> str:
        """A header's value, masked as ``_scrub`` masks bytes; in ASCII, as a header's value
        must be (the mask's ellipsis is not Latin-1)."""
        key = self._provider_key()
        if key is None or key.decode() not in value:
            return value
        return value.replace(key.decode(), mask_secret(key.decode()).replace("…", "..."))

    def past_spend_ceiling(self) -> bool:
        """A stream that must stop at its budget has delivered what the budget can pay
        for (its text so far, priced at the output price)."""
        reservation = self.quota.reservation
        if (reservation is None or not reservation.stop_streams
                or reservation.spend_ceiling is None or reservation.output_price is None
                or self.facts is None):
            return False
        price = reservation.output_price
        prompt = self.prompt_estimate
        delivered = estimate_chars(self.facts.text_chars)
        spent = usd_units((prompt * price.input_per_mtok + delivered * price.output_per_mtok)
                          / 1_000_000)
        return spent >= reservation.spend_ceiling

    def complete_body(self, body: bytes) -> bytes:
        """A whole (non-stream) body: the body the client gets. What it says (usage, ids,
        an in-band error) is read later (``observe_body``), unless the client's body is
        made from it: reading it is off the client's wait (measured: 50-75 us of a
        request's 0.5 ms at concurrency 1)."""
        body = self._scrub(body)
        if self.status is not None and self.status >= 400:
            if self.crossing.translation is not None:
                answer = self.crossing.error(self.profile, body, self.status,
                                             self.protocol.error_shape_for(self.request))
                self.error_message = _message_of(self.profile.error_body(body, self.status))
            else:
                answer = self.protocol.upstream_error(self.profile, body, self.status)
                self.error_message = _message_of(answer)
            return answer
        if self.crossing.translation is not None and (
                translated := self.crossing.reply(body)) is not None:
            self._unread_body = body  # metered as the target said it
            return translated
        rewritten = self.protocol.client_body(self.request, body, self.plan.table.models,
                                              self.key.allows_model)
        if rewritten is not None:
            return rewritten
        self._unread_body = body
        return body

    def observe_body(self) -> ResponseFacts | None:
        """The facts of the whole body the client got, read now if not yet."""
        body, self._unread_body = self._unread_body, None
        if body is not None and (payload := jsonio.object_of(body)) is not None:
            self.facts = self.crossing.wire.response_facts(self.profile)
            self.facts.observe(payload)
        return self.facts

    def fail(self, status: int, code: str, message: str | None = None) -> None:
        """The exchange failed in transport (timeout, broken connection). A stream keeps
        the status its client already received."""
        self.status = self.status if self.is_sse and self.status else status
        self.error_code = code
        if message is not None:
            self.error_message = message[:ERROR_MESSAGE_CHARS]

    # ---- finish -------------------------------------------------------------------

    def admission_record(self) -> UsageRecord:
        """What is known at admission: the record a killed process leaves for it."""
        return UsageRecord(
            request_id=self.request_id, key_id=self.key.id, key_prefix=self.key.prefix,
            subject_id=self.key.subject_id, adapter=self.request.adapter,
            endpoint=self.endpoint.operation.name, protocol=self.protocol_name, model=self.model,
            stream=self.stream, status=0, started_at=self.started_wall, duration_ms=0.0,
            trace_id=self.trace.trace_id, tags=self.tags, end_user=self.end_user,
        )

    def finish(self, *, client_disconnected: bool = False) -> UsageRecord | None:
        """Make the usage record and hand it on: exactly once, whatever happened. Safe
        to call again (returns None). Should making it fail (a bug), the record says
        ``gateway_error`` with what admission knew: it is still the request's one record,
        and its reservation is still settled."""
        if self._finished:
            return None
        self._finished = True
        try:
            record = self._record()
        except Exception:
            log.exception("making the usage record of request %s failed", self.request_id)
            record = self.admission_record()
            record.status, record.error_code = 500, "gateway_error"
            record.duration_ms = (time.monotonic() - self.started) * 1000
        if client_disconnected:
            # 499 even when a stream's 200 went out: the status says how it ended.
            record.error_code, record.status = "client_disconnected", CLIENT_CLOSED_REQUEST
        self._on_finish(record, self)
        return record

    def _record(self) -> UsageRecord:
        record = UsageRecord(
            request_id=self.request_id, key_id=self.key.id, key_prefix=self.key.prefix,
            subject_id=self.key.subject_id, adapter=self.request.adapter,
            endpoint=self.endpoint.operation.name, protocol=self.protocol_name, model=self.model,
            stream=self.stream, status=self.status if self.status is not None else 502,
            started_at=self.started_wall, duration_ms=(time.monotonic() - self.started) * 1000,
            provider=self.target.provider if self.target else "",
            upstream_model=self.target.model if self.target and self.target.model else None,
            error_code=self.error_code, error_message=self.error_message,
            attempts=self.attempts, trace_id=self.trace.trace_id, tags=self.tags,
            end_user=self.end_user,
        )
        if self.response_started_at is not None:
            record.ttfb_ms = (self.response_started_at - self.started) * 1000
        if (facts := self.observe_body()) is not None:
            self._apply_facts(record, facts)
        self._estimate_usage(record)
        if self.cut_at_cap:
            record.tokens_estimated = True  # the usage the gateway ended it with: its count
        elif (self.output_cap and not self.is_sse and record.error_code is None
              and far_over_cap(self.output_cap, record.completion_tokens)):
            record.error_code = OUTPUT_OVER_CAP
        return record

    def _apply_facts(self, record: UsageRecord, facts: ResponseFacts) -> None:
        record.response_id = facts.response_id
        record.finish_reasons = list(facts.finish_reasons)
        if facts.model and self.protocol.names_upstream_model:
            record.upstream_model = facts.model
        if facts.usage is not None:
            record.prompt_tokens = facts.usage.prompt_tokens
            record.completion_tokens = facts.usage.completion_tokens
            record.total_tokens = facts.usage.total_tokens
            record.cache_read_tokens = facts.usage.cache_read_tokens
            record.cache_write_tokens = facts.usage.cache_write_tokens
            record.cache_write_1h_tokens = facts.usage.cache_write_1h_tokens
            record.reasoning_tokens = facts.usage.reasoning_tokens
            record.provider_cost_usd = decimal_or_none(facts.usage.cost_usd)
            record.provider_cost_diem = decimal_or_none(facts.usage.cost_diem)
        if facts.error is not None and record.error_message is None:
            record.error_message = str(facts.error.get("message") or "")[:ERROR_MESSAGE_CHARS]
        if not isinstance(facts, StreamObserver):
            if record.error_code is None and facts.error is not None:
                record.error_code = "upstream_inband_error"  # a 200 whose body is an error
            return
        facts.close()
        if facts.first_event_at is not None:
            record.first_chunk_ms = (facts.first_event_at - self.started) * 1000
            record.max_gap_ms = facts.max_gap * 1000
        if record.error_code is None and facts.error is not None:
            record.error_code = "upstream_inband_error"
        elif record.error_code is None and not facts.done:
            record.error_code = "stream_incomplete"

    def _estimate_usage(self, record: UsageRecord) -> None:
        """No usage from the provider for a request it served (a cut stream, an in-band
        error): count the prompt and the text seen so far (tokens.py), flagged."""
        answered = self.facts is not None and (self.facts.usage is None)
        if not answered or not self.protocol.estimates_usage:
            return
        assert self.facts is not None
        record.prompt_tokens = self.prompt_estimate
        record.completion_tokens = estimate_chars(self.facts.text_chars)
        record.total_tokens = record.prompt_tokens + record.completion_tokens
        record.tokens_estimated = True


def _message_of(body: bytes) -> str | None:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(message)[:ERROR_MESSAGE_CHARS]
