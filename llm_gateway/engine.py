"""The policy engine: admit → send → observe → finish, once for every adapter.

Adapters translate their own request objects into an ``IncomingRequest`` and call
``Gateway.admit``. The answer is a ``Rejection`` (answer it; nothing reaches an upstream)
or an ``Exchange``, the admitted request's state. ``Gateway.respond`` sends it and gives
the client's response (streams stay streams); an adapter that forwards on its own (the
sidecar, for streams) reads from the exchange what to send and tells it what came back.
``Exchange.finish`` runs exactly once per admitted request and hands the usage record to
every record sink: the durable writer, telemetry, and whoever else subscribed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from llm_gateway import errors
from llm_gateway.auth import Authenticator
from llm_gateway.billing.metering import UsageRecord, UsageWriter
from llm_gateway.config import EgressPolicy, Settings
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange, RecordSink
from llm_gateway.limits import LimiterUnavailable, RateLimiter
from llm_gateway.messages import (
    KIND_BY_PATH,
    Endpoint,
    EndpointKind,
    GatewayResponse,
    IncomingRequest,
)
from llm_gateway.providers import Profile
from llm_gateway.relay import Relay
from llm_gateway.routing.client import Upstream
from llm_gateway.stores import Store
from llm_gateway.telemetry import Telemetry

log = logging.getLogger("llm_gateway")

# last_used_at is written in batches off the request path, this often.
TOUCH_FLUSH_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Readiness:
    """What /readyz says: "ready", "degraded" (serving, on a substitute for a backend
    that is down: fail-open) or "unavailable" (refusing: fail-closed); and why."""

    status: str
    checks: dict[str, dict[str, str]]

    @property
    def ready(self) -> bool:
        return self.status != "unavailable"

    def body(self) -> bytes:
        payload: dict[str, object] = {"status": self.status, "checks": self.checks}
        failing = [name for name, check in self.checks.items() if check["state"] == "unavailable"]
        if failing:
            # The code of the request-level answer the first one causes (503
            # key_store_unavailable, rate_limiter_unavailable).
            names = " and ".join(f"the {name.replace('_', ' ')}" for name in failing)
            payload["error"] = json.loads(errors.error_body_for(
                f"{failing[0]}_unavailable", f"{names.capitalize()} is not reachable."
            ))["error"]
        return json.dumps(payload).encode()


class Gateway:
    """The engine: holds every rule once. Built by ``wiring.build_gateway``."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        limiter: RateLimiter,
        auth: Authenticator,
        relay: Relay,
        upstream: Upstream,
        profile: Profile,
        usage: UsageWriter,
        telemetry: Telemetry,
    ) -> None:
        self.settings = settings
        self.store = store
        self.limiter = limiter
        self.auth = auth
        self.relay = relay
        self.upstream = upstream
        self.profile = profile
        self.usage = usage
        self.telemetry = telemetry
        self.endpoints = {
            (method, path): Endpoint(method, path, KIND_BY_PATH.get(path, EndpointKind.OTHER))
            for method, _, path in (e.partition(" ") for e in settings.allowed_endpoints)
        }
        self.llm_host_roots = settings.llm_host_roots()
        self._sinks: list[RecordSink] = [self._write_record]
        self._started = False
        self._start_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._touch_task: asyncio.Task[None] | None = None

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            await self.store.migrate()
            self._loop = asyncio.get_running_loop()
            self.usage.start()
            self._touch_task = self._loop.create_task(self._touch_loop())
            self._started = True

    async def close(self) -> None:
        if self._touch_task is not None:
            self._touch_task.cancel()
        await self.usage.close()
        await self._flush_touches()
        await self.relay.aclose()
        await self.limiter.close()
        await self.store.close()
        self.telemetry.shutdown()
        self._started = False

    async def flush(self) -> None:
        """Make every finished request's usage record durable now."""
        await self.usage.flush()
        await self._flush_touches()

    def flush_from_thread(self, timeout: float = 10.0) -> None:
        """``flush`` from a thread other than the one serving (tests, tools)."""
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.flush(), self._loop).result(timeout)

    async def ready(self) -> bool:
        return (await self.readiness()).ready

    async def readiness(self) -> Readiness:
        """Ask each backend now; the failure policies say what an outage means."""
        store_outage = self.auth.outage
        try:
            await self.store.ping()
        except Exception as exc:  # whatever keeps the store from answering
            store_outage.failed(exc)
        else:
            store_outage.recovered()
        await self.limiter.check()
        limiter_outage = self.limiter.outage
        checks = {
            "key_store": store_outage.check(),
            "rate_limiter": (limiter_outage.check() if limiter_outage is not None
                             else {"backend": self.limiter.backend, "state": "ok"}),
        }
        states = {check["state"] for check in checks.values()}
        for status in ("unavailable", "degraded"):
            if status in states:
                return Readiness(status, checks)
        return Readiness("ready", checks)

    async def _touch_loop(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_FLUSH_SECONDS)
            try:
                await self._flush_touches()
            except Exception as exc:
                log.warning("last_used_at update failed: %s", type(exc).__name__)

    async def _flush_touches(self) -> None:
        touches = self.auth.take_touches()
        if touches:
            await self.store.touch_keys(touches)

    # ---- finished requests --------------------------------------------------------

    def add_record_sink(self, sink: RecordSink) -> None:
        """Call ``sink(record, exchange)`` for every finished request, after the writer."""
        self._sinks.append(sink)

    def _write_record(self, record: UsageRecord, exchange: Exchange) -> None:
        self.usage.add(record)
        self.telemetry.finished(record, exchange)

    def _finished(self, record: UsageRecord, exchange: Exchange) -> None:
        for sink in self._sinks:
            sink(record, exchange)

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
        """The admission steps, cheapest first; the first that says no answers."""
        endpoint = self.endpoint_for(request.method, request.path)
        if endpoint is None:
            return errors.endpoint_not_allowed(request.method, request.path)
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
            return errors.model_not_allowed(model)
        try:
            limit = await self.limiter.take(key.id, key.rate_limit_requests,
                                            key.rate_limit_window_seconds)
        except LimiterUnavailable:  # only under fail-closed: fail-open never raises
            return errors.rate_limiter_unavailable()
        if not limit.allowed:
            return errors.rate_limit_exceeded(
                f"Rate limit reached for this gateway key: {limit.limit} requests per "
                f"{key.rate_limit_window_seconds}s. Retry after {limit.retry_after()}s.",
                limit.headers(),
            )
        return Exchange(request, endpoint, key, limit, model, stream, self.upstream,
                        self.profile, self._finished)

    async def respond(self, exchange: Exchange) -> GatewayResponse:
        """Send an admitted request and give the client's response (streams stay streams)."""
        return await self.relay.respond(exchange)

    def body_too_large(self) -> Rejection:
        return errors.request_too_large(self.settings.request_body_limit_bytes)

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
        if self.settings.egress_policy is not EgressPolicy.DENY:
            return None
        return errors.egress_denied(host, port)


def parse_request_body(
    endpoint: Endpoint, body: bytes
) -> tuple[str | None, bool] | Rejection:
    """Read only what policy needs from the body: (model, stream). Nothing is rewritten."""
    if endpoint.method != "POST":
        return None, False
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return errors.invalid_json()
    if not isinstance(payload, dict):
        return errors.invalid_request_body("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model.strip():
        return errors.invalid_request_body("'model' must be a non-empty string.")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        return errors.invalid_request_body("'stream' must be a boolean when present.")
    if endpoint.kind is EndpointKind.CHAT:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return errors.invalid_request_body("'messages' must be a non-empty list.")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return errors.invalid_request_body(
                    f"messages[{index}] must be an object with a 'role'."
                )
    return model, stream
