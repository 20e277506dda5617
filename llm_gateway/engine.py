"""The policy engine: admit → send → observe → finish, once for every adapter.

Adapters (ASGI, mitmproxy) translate their own request objects into an
``IncomingRequest`` and call ``Gateway.admit``. The answer is a ``Rejection`` (answer
it, nothing reaches an upstream) or an ``Exchange``: the admitted request's state,
which either sends the request itself (``Exchange.respond``: the ASGI adapter, and
mitmproxy for everything but streams) or tells an adapter that forwards on its own
(mitmproxy, for streams) what to send and observes what comes back.
``Exchange.finish`` runs exactly once per admitted request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from enum import StrEnum

from opentelemetry.trace import TracerProvider

from llm_gateway.auth import Authenticator
from llm_gateway.config import FailurePolicy, Settings
from llm_gateway.errors import Headers, Rejection, error_body, normalise_upstream_error, reject
from llm_gateway.keys import KeyRecord
from llm_gateway.limits import (
    FailoverRateLimiter,
    LimitDecision,
    LimiterUnavailable,
    RateLimiter,
    open_limiter,
)
from llm_gateway.metering import UsageRecord, UsageWriter
from llm_gateway.outage import OutageCollector
from llm_gateway.sse import StreamObserver
from llm_gateway.stores import Store, open_store
from llm_gateway.telemetry import Telemetry
from llm_gateway.upstream import Upstream, UpstreamClient, UpstreamFailure, UpstreamResponse
from llm_gateway.usage import usage_from_payload

log = logging.getLogger("llm_gateway")

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


# Request ids: a random prefix per process and a counter. Unique across replicas without
# the cost of uuid4() per request (it showed in profiles).
_PROCESS_TAG = os.urandom(6).hex()
_request_counter = itertools.count(1)


def next_request_id() -> str:
    return f"req_{_PROCESS_TAG}{next(_request_counter):012x}"


class EndpointKind(StrEnum):
    CHAT = "chat.completions"
    EMBEDDINGS = "embeddings"
    MODELS = "models"
    OTHER = "other"


_KIND_BY_PATH = {
    "/chat/completions": EndpointKind.CHAT,
    "/embeddings": EndpointKind.EMBEDDINGS,
    "/models": EndpointKind.MODELS,
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str
    kind: EndpointKind


@dataclass(slots=True)
class IncomingRequest:
    """What an adapter hands the engine. ``path`` is relative to the API root."""

    method: str
    path: str
    headers: Headers  # names lower-case
    body: bytes
    adapter: str
    query: str = ""

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Readiness:
    """What /readyz says: "ready", "degraded" (serving, on a substitute for a backend
    that is down: fail-open) or "unavailable" (refusing: fail-closed); and why."""

    status: str
    checks: dict[str, dict[str, str]]

    @property
    def ready(self) -> bool:
        return self.status != "unavailable"


@dataclass(slots=True)
class GatewayResponse:
    """A response the engine produced for an adapter that lets the engine send."""

    status: int
    headers: Headers
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None  # set for streams; relay each as it comes


class Exchange:
    """One admitted request, from admission to its usage record."""

    def __init__(
        self,
        gateway: Gateway,
        request: IncomingRequest,
        endpoint: Endpoint,
        key: KeyRecord,
        limit: LimitDecision,
        model: str | None,
        stream: bool,
    ) -> None:
        self.gateway = gateway
        self.request = request
        self.endpoint = endpoint
        self.key = key
        self.limit = limit
        self.model = model
        self.stream = stream
        self.upstream: Upstream = gateway.upstream
        self.request_id = next_request_id()
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.status: int | None = None
        self.error_type: str | None = None
        self.attempts = 1
        self.response_started_at: float | None = None
        self.is_sse = False
        self.observer: StreamObserver | None = None
        self.body_summary: dict = {}
        self.client_disconnected = False
        self._finished = False

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
                self.observer = StreamObserver()
            client_headers.append((lower, value))
        if status >= 400:
            self.error_type = "upstream_error"
            # The body is rewritten to OpenAI's shape: say so in the content type.
            client_headers = [(k, v) for k, v in client_headers if k != "content-type"]
            client_headers.append(("content-type", "application/json"))
        client_headers.extend(self.gateway_headers())
        return client_headers

    def gateway_headers(self) -> Headers:
        return [*self.limit.headers(), ("x-request-id", self.request_id)]

    def on_chunk(self, chunk: bytes) -> None:
        if self.observer is not None:
            self.observer.feed(chunk, time.monotonic())

    def complete_body(self, body: bytes) -> bytes:
        """Observe a whole (non-stream) body; returns the body the client gets."""
        if self.status is not None and self.status >= 400:
            return normalise_upstream_error(body, self.status)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            return body
        if not isinstance(payload, dict):
            return body
        if self.endpoint.kind is EndpointKind.MODELS and self.key.allowed_models:
            data = payload.get("data")
            if isinstance(data, list):
                payload["data"] = [
                    m for m in data if isinstance(m, dict) and self.key.allows_model(m.get("id"))
                ]
                return json.dumps(payload).encode()
        self.body_summary = payload
        return body

    def fail(self, status: int, error_type: str) -> None:
        """The exchange failed in transport (timeout, broken connection)."""
        self.status = self.status if self.is_sse and self.status else status
        self.error_type = error_type

    # ---- the engine sends ---------------------------------------------------------

    async def respond(self) -> GatewayResponse:
        """Send upstream and produce the client's response (streams stay streams)."""
        try:
            response, self.attempts = await self.gateway.client.open(
                self.upstream, self.request.method, self.upstream_url(),
                self.upstream_headers(), self.request.body,
            )
        except UpstreamFailure as failure:
            self.attempts = failure.attempts
            return self._failure_response(failure)
        headers = self.on_response_start(response.status, response.headers)
        if self.is_sse:
            return GatewayResponse(self.status or 200, headers, chunks=self._relay(response))
        try:
            raw = await response.read()
        except UpstreamFailure as failure:
            return self._failure_response(failure)
        body = self.complete_body(raw)
        return GatewayResponse(self.status or 502, headers, body)

    def _failure_response(self, failure: UpstreamFailure) -> GatewayResponse:
        self.fail(failure.status, failure.code)
        return GatewayResponse(
            failure.status, [("content-type", "application/json"), *self.gateway_headers()],
            error_body(str(failure), "upstream_error", failure.code),
        )

    async def _relay(self, response: UpstreamResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.chunks():
                self.on_chunk(chunk)
                yield chunk
        except UpstreamFailure as failure:
            # Headers are gone already: the status cannot change. Tell the client in
            # band, the way providers do, so SDKs raise instead of ending quietly.
            self.fail(failure.status, failure.code)
            message = "The upstream provider's stream broke off before it was complete."
            yield b"data: " + error_body(message, "upstream_error", failure.code) + b"\n\n"
        finally:
            response.close()

    # ---- finish -------------------------------------------------------------------

    def finish(self, *, client_disconnected: bool = False) -> UsageRecord | None:
        """Write the usage record: exactly once, whatever happened. Safe to call again."""
        if self._finished:
            return None
        self._finished = True
        now = time.monotonic()
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
            duration_ms=(now - self.started) * 1000,
            error_type=self.error_type,
            attempts=self.attempts,
        )
        if self.response_started_at is not None:
            record.ttfb_ms = (self.response_started_at - self.started) * 1000
        observer = self.observer
        if observer is not None:
            observer.close()
            usage = observer.usage
            record.response_id = observer.response_id
            record.finish_reasons = list(observer.finish_reasons)
            record.model = observer.model or self.model
            if observer.first_event_at is not None:
                record.first_chunk_ms = (observer.first_event_at - self.started) * 1000
                record.max_gap_ms = observer.max_gap * 1000
            if observer.error is not None and record.error_type is None:
                record.error_type = "upstream_inband_error"
            elif not observer.done and record.error_type is None:
                record.error_type = "stream_incomplete"
        else:
            usage = usage_from_payload(self.body_summary) if self.body_summary else None
            summary = self.body_summary
            if isinstance(summary.get("id"), str):
                record.response_id = summary["id"]
            reported_model = summary.get("model")
            if isinstance(reported_model, str) and self.endpoint.kind is not EndpointKind.MODELS:
                record.model = reported_model
            choices = summary.get("choices")
            if isinstance(choices, list):
                record.finish_reasons = [
                    c["finish_reason"] for c in choices
                    if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
                ]
        if usage is not None:
            record.prompt_tokens = usage.prompt_tokens
            record.completion_tokens = usage.completion_tokens
            record.total_tokens = usage.total_tokens
            record.cost_usd = usage.cost_usd
            record.cost_diem = usage.cost_diem
        if client_disconnected or self.client_disconnected:
            record.error_type = "client_disconnected"
            if self.status is None or not self.is_sse:
                record.status = 499  # the client closed the request (nginx's convention)
        self.gateway.record(record, self)
        return record


class Gateway:
    """The engine: holds every rule once. Adapters call admit() and drive the Exchange."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        limiter: RateLimiter | None = None,
        client: UpstreamClient | None = None,
        upstream: Upstream | None = None,
        key_cache_seconds: float | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.store = store or open_store(settings.database_url)
        self.limiter = limiter or open_limiter(settings, self.store)
        self.client = client or UpstreamClient()
        self.upstream = upstream or Upstream(
            name="venice",
            base_url=settings.venice_base_url,
            api_key=settings.require_provider_key(),
            max_retries=settings.venice_max_retries,
            timeout=settings.request_timeout_seconds,
        )
        auth_options = {} if key_cache_seconds is None else {"cache_seconds": key_cache_seconds}
        store_backend = (
            "postgres" if settings.database_url.startswith(("postgresql:", "postgres:"))
            else "sqlite"
        )
        self.auth = Authenticator(
            self.store, failure_policy=settings.auth_failure_policy, backend=store_backend,
            **auth_options,
        )
        self.usage = UsageWriter(self.store)
        self.telemetry = Telemetry(settings, tracer_provider)
        outages = [self.auth.outage]
        if isinstance(self.limiter, FailoverRateLimiter):
            outages.append(self.limiter.outage)
        self.telemetry.registry.register(OutageCollector(outages))
        self.endpoints = {
            (method, path): Endpoint(method, path, _KIND_BY_PATH.get(path, EndpointKind.OTHER))
            for method, _, path in (e.partition(" ") for e in settings.allowed_endpoints)
        }
        self.llm_host_roots = settings.llm_host_roots()
        self.last_records: list[UsageRecord] = []  # the most recent few, for tests and demo
        self._started = False
        self._start_lock = asyncio.Lock()
        self._touch_task: asyncio.Task[None] | None = None

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            await self.store.migrate()
            self.usage.start()
            self._touch_task = asyncio.get_running_loop().create_task(self._touch_loop())
            self._started = True

    async def close(self) -> None:
        if self._touch_task is not None:
            self._touch_task.cancel()
        await self.usage.close()
        await self._flush_touches()
        await self.client.aclose()
        await self.limiter.close()
        await self.store.close()
        self.telemetry.shutdown()
        self._started = False

    async def flush(self) -> None:
        """Make every finished request's usage record durable now."""
        await self.usage.flush()
        await self._flush_touches()

    async def ready(self) -> bool:
        return (await self.readiness()).ready

    async def readiness(self) -> Readiness:
        """Ask each backend now; the failure policies say what an outage means."""
        checks: dict[str, dict[str, str]] = {}
        statuses = []
        store_outage = self.auth.outage
        try:
            await self.store.ping()
        except Exception as exc:  # whatever keeps the store from answering
            store_outage.failed(exc)
        else:
            store_outage.recovered()
        statuses.append(_check(checks, "key_store", store_outage.backend,
                               self.settings.auth_failure_policy,
                               store_outage.last_error if store_outage.is_down else None))
        limiter = self.limiter
        if isinstance(limiter, FailoverRateLimiter):
            answered = await limiter.check()
            statuses.append(_check(checks, "rate_limiter", limiter.backend, limiter.policy,
                                   None if answered else limiter.outage.last_error))
        else:
            checks["rate_limiter"] = {"backend": "memory", "state": "ok"}
        for status in ("unavailable", "degraded"):
            if status in statuses:
                return Readiness(status, checks)
        return Readiness("ready", checks)

    async def _touch_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            try:
                await self._flush_touches()
            except Exception as exc:
                log.warning("last_used_at update failed: %s", type(exc).__name__)

    async def _flush_touches(self) -> None:
        touches = self.auth.take_touches()
        if touches:
            await self.store.touch_keys(touches)

    def record(self, record: UsageRecord, exchange: Exchange) -> None:
        self.usage.add(record)
        self.telemetry.finished(exchange, record)
        self.last_records.append(record)
        del self.last_records[:-100]

    # ---- admission ----------------------------------------------------------------

    def endpoint_for(self, method: str, path: str) -> Endpoint | None:
        return self.endpoints.get((method, path.rstrip("/") or "/"))

    async def admit(self, request: IncomingRequest) -> Exchange | Rejection:
        if not self._started:
            await self.start()
        admitted = await self._admit(request)
        if isinstance(admitted, Rejection):
            self.telemetry.rejected(request.adapter, admitted)
        return admitted

    async def _admit(self, request: IncomingRequest) -> Exchange | Rejection:
        endpoint = self.endpoint_for(request.method, request.path)
        if endpoint is None:
            return self.endpoint_not_allowed(request.method, request.path)
        if len(request.body) > self.settings.request_body_limit_bytes:
            return self.body_too_large()
        key = await self.auth.authenticate(request.header("authorization"))
        if isinstance(key, Rejection):
            return key
        parsed = parse_request_body(endpoint, request.body)
        if isinstance(parsed, Rejection):
            return parsed
        model, stream = parsed
        if model is not None and not key.allows_model(model):
            return reject(
                403, f"This gateway key may not use model '{model}'.",
                "permission_error", "model_not_allowed",
            )
        try:
            limit = await self.limiter.take(key.id, key.rate_limit_requests,
                                            key.rate_limit_window_seconds)
        except LimiterUnavailable:  # only under fail-closed: fail-open never raises
            return reject(
                503, "The gateway's rate limiter is not reachable, so the request cannot be "
                "counted against its limit. Retry shortly.",
                "service_unavailable", "rate_limiter_unavailable", [("retry-after", "1")],
            )
        if not limit.allowed:
            return reject(
                429,
                f"Rate limit reached for this gateway key: {limit.limit} requests per "
                f"{key.rate_limit_window_seconds}s. Retry after {limit.headers()[-1][1]}s.",
                "rate_limit_error", "rate_limit_exceeded", limit.headers(),
            )
        return Exchange(self, request, endpoint, key, limit, model, stream)

    def endpoint_not_allowed(self, method: str, path: str) -> Rejection:
        return reject(
            403, f"{method} {path} is not an endpoint this gateway serves.",
            "permission_error", "endpoint_not_allowed",
        )

    # ---- interception: adapters that sit in front of provider hosts (the sidecar) -----

    def api_root_for_host(self, host: str, port: int) -> str | None:
        """The API root path of an intercepted LLM host; None for any other host, which
        the egress policy decides about."""
        name = host.lower().rstrip(".")
        root = self.llm_host_roots.get(f"{name}:{port}")
        return root if root is not None else self.llm_host_roots.get(name)

    @staticmethod
    def path_under_root(root: str, path: str) -> str | None:
        """``path`` relative to the API root ``root``, or None when it lies outside: such a
        path on an LLM host (a dashboard, billing) is never forwarded."""
        if root and not path.startswith(root + "/"):
            return None
        return path[len(root):]

    def egress_rejection(self, host: str, port: int) -> Rejection | None:
        """The answer for traffic to a host that is not an LLM host; None: pass it through
        untouched (no TLS interception, nothing observed)."""
        if self.settings.egress_policy != "deny":
            return None
        return reject(
            403, f"Egress to {host}:{port} is not allowed: this pod may reach LLM providers only.",
            "permission_error", "egress_denied",
        )

    def body_too_large(self) -> Rejection:
        limit = self.settings.request_body_limit_bytes
        return reject(
            413, f"Request body is larger than the gateway's limit of {limit} bytes.",
            "invalid_request_error", "request_too_large",
        )


def _check(
    checks: dict[str, dict[str, str]], component: str, backend: str, policy: FailurePolicy,
    error: str | None,
) -> str:
    """Record one backend's state under ``component``; returns the readiness it implies."""
    if error is None:
        checks[component] = {"backend": backend, "state": "ok"}
        return "ready"
    state = "degraded" if policy is FailurePolicy.FAIL_OPEN else "unavailable"
    checks[component] = {"backend": backend, "state": state, "policy": policy.value,
                         "error": error}
    return state


def gateway_failure() -> Rejection:
    """The answer when the gateway itself failed on a request: it was not forwarded."""
    return reject(
        500, "The gateway failed while checking this request; it was not forwarded.",
        "server_error", "gateway_error",
    )


def parse_request_body(
    endpoint: Endpoint, body: bytes
) -> tuple[str | None, bool] | Rejection:
    """Read only what policy needs from the body: (model, stream). Nothing is rewritten."""
    if endpoint.method != "POST":
        return None, False

    def bad(message: str, code: str = "invalid_request_body") -> Rejection:
        return reject(400, message, "invalid_request_error", code)

    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return bad("The request body is not valid JSON.", "invalid_json")
    if not isinstance(payload, dict):
        return bad("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model.strip():
        return bad("'model' must be a non-empty string.")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        return bad("'stream' must be a boolean when present.")
    if endpoint.kind is EndpointKind.CHAT:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return bad("'messages' must be a non-empty list.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return bad(f"messages[{index}] must be an object with a 'role'.")
    return model, stream
