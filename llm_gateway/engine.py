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
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from llm_gateway import errors
from llm_gateway.auth import Authenticator
from llm_gateway.billing.metering import UsageRecord, UsageWriter
from llm_gateway.billing.model import Price
from llm_gateway.billing.prices import cost_of
from llm_gateway.billing.quotas import QuotaDecision, Quotas
from llm_gateway.config import EgressPolicy, Settings, host_and_api_root
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange, RecordSink
from llm_gateway.keys import KeyRecord
from llm_gateway.limits import Guard, LimitDecision, LimiterUnavailable, RateLimiter
from llm_gateway.messages import (
    KIND_BY_PATH,
    Endpoint,
    EndpointKind,
    GatewayResponse,
    IncomingRequest,
    next_request_id,
)
from llm_gateway.providers import UnsupportedParameter, profile_named
from llm_gateway.relay import Relay, failed_requests_bucket
from llm_gateway.request_body import parse_request_body
from llm_gateway.routing.router import Plan, Router
from llm_gateway.routing.shared_health import SharedHealth
from llm_gateway.routing.source import RouteSource
from llm_gateway.stores import Store
from llm_gateway.telemetry import Telemetry, Trace
from llm_gateway.tokens import estimate_prompt

log = logging.getLogger("llm_gateway")

# last_used_at is written in batches off the request path, this often.
TOUCH_FLUSH_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Readiness:
    """What /readyz says: "ready", "degraded" (serving, on a substitute for a backend
    that is down: fail-open) or "unavailable" (refusing: fail-closed); and why."""

    status: str
    checks: dict[str, dict[str, str]]
    # Each routing target's passive health: information, not readiness (a restart does
    # not bring a provider back).
    targets: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status != "unavailable"

    def body(self) -> bytes:
        payload: dict[str, object] = {"status": self.status, "checks": self.checks,
                                      "targets": self.targets}
        failing = [name for name, check in self.checks.items() if check["state"] == "unavailable"]
        if failing:
            # The code of the request-level answer the first one causes (503
            # key_store_unavailable, rate_limiter_unavailable).
            names = " and ".join(f"the {name.replace('_', ' ')}" for name in failing)
            code = f"{failing[0]}_unavailable"
            payload["error"] = json.loads(errors.error_body_for(
                code if code in errors.CATALOGUE else "not_ready",
                self.checks[failing[0]].get("error") or f"{names.capitalize()} is not reachable."
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
        router: Router,
        routes: RouteSource,
        shared_health: SharedHealth | None,
        quotas: Quotas,
        seed_prices: list[Price],
        usage: UsageWriter,
        telemetry: Telemetry,
    ) -> None:
        self.settings = settings
        self.store = store
        self.limiter = limiter
        self.auth = auth
        self.relay = relay
        self.router = router
        self.routes = routes
        self.shared_health = shared_health
        self.quotas = quotas
        self.seed_prices = seed_prices  # from the settings file's prices:
        self.usage = usage
        self.telemetry = telemetry
        self.endpoints = {
            (method, path): Endpoint(method, path, KIND_BY_PATH.get(path, EndpointKind.OTHER))
            for method, _, path in (e.partition(" ") for e in settings.allowed_endpoints)
        }
        self.llm_host_roots = llm_host_roots(settings, router)
        self._sinks: list[RecordSink] = [self._write_record]
        self._started = False
        self._start_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._touch_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            await self.store.migrate()
            await self.usage.replay_orphans()
            self._loop = asyncio.get_running_loop()
            await self.routes.start()
            await self._refresh_prices()
            self.llm_host_roots = llm_host_roots(self.settings, self.router)
            if self.shared_health is not None:
                await self.shared_health.start()
            self.usage.start()
            self._touch_task = self._loop.create_task(self._touch_loop())
            self._started = True

    async def close(self) -> None:
        if self._touch_task is not None:
            self._touch_task.cancel()
        await self.routes.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shared_health is not None:
            await self.shared_health.close()
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
        self._from_thread(self.flush(), timeout)

    async def refresh(self) -> None:
        """Read prices and budgets again now, rather than within their refresh period:
        after a change made in this process (the admin API) or by a test."""
        await self._refresh_prices()
        self.quotas.budgets.forget()

    def refresh_from_thread(self, timeout: float = 10.0) -> None:
        self._from_thread(self.refresh(), timeout)

    def _from_thread(self, work: Coroutine[Any, Any, None], timeout: float) -> None:
        if self._loop is None:
            work.close()
            return
        asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    def reload_routes(self) -> None:
        """Look at the route file (and the admin overlay) again now: SIGHUP."""
        self.routes.reload_now()

    def routes_view(self) -> dict[str, object]:
        """The routes in force and each target's health: for /readyz, the admin API and
        ``routes show``."""
        table = self.router.table
        states = self.router.states()
        return {
            "version": table.version,
            "refused": self.routes.last_error,
            "default_provider": table.default_provider,
            "unknown_models": table.unknown_models,
            "providers": {
                name: {"base_url": p.base_url, "profile": p.profile,
                       "source": table.sources.get(f"providers.{name}", "file"),
                       "max_concurrency": p.max_concurrency,
                       "in_flight": self.router.bulkhead.in_flight(name)}
                for name, p in table.providers.items()
            },
            "models": {
                name: {"source": table.sources.get(f"models.{name}", "file"),
                       "targets": [{"provider": t.provider, "model": t.model,
                                    "weight": t.weight, "priority": t.priority,
                                    "state": states.get(t.key, "healthy")}
                                   for t in route.targets]}
                for name, route in table.models.items()
            },
        }

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
        targets = {key: state.value for key, state in self.router.states().items()}
        for status in ("unavailable", "degraded"):
            if status in states:
                return Readiness(status, checks, targets)
        return Readiness("ready", checks, targets)

    async def _touch_loop(self) -> None:
        """Housekeeping off the request path: last-use times out, prices in."""
        while True:
            await asyncio.sleep(TOUCH_FLUSH_SECONDS)
            try:
                await self._flush_touches()
                await self._refresh_prices()
            except Exception as exc:
                log.warning("housekeeping failed: %s", type(exc).__name__)

    async def _refresh_prices(self) -> None:
        """The price table: the settings file's seed, and the store's (which wins)."""
        stored = getattr(self.store, "prices", None)
        from_store = await stored() if stored is not None else []
        known = {(p.provider, p.model, p.effective_from) for p in from_store}
        seeded = [p for p in self.seed_prices
                  if (p.provider, p.model, p.effective_from) not in known]
        self.quotas.prices.replace([*seeded, *from_store])

    async def _flush_touches(self) -> None:
        touches = self.auth.take_touches()
        if touches:
            await self.store.touch_keys(touches)

    # ---- finished requests --------------------------------------------------------

    def add_record_sink(self, sink: RecordSink) -> None:
        """Call ``sink(record, exchange)`` for every finished request, after the writer."""
        self._sinks.append(sink)

    def _write_record(self, record: UsageRecord, exchange: Exchange) -> None:
        target = exchange.target
        if target is not None and target.model:
            price = self.quotas.prices.price_at(target.provider, target.model, record.started_at)
            if price is not None:
                record.cost_usd = cost_of(price, record.prompt_tokens, record.completion_tokens,
                                          record.cached_tokens)
        self.usage.add(record)
        reservation = exchange.quota.reservation
        if reservation is not None:
            spent = record.cost_usd if record.cost_usd is not None else record.provider_cost_usd
            self._background(self.quotas.settle(reservation, record.total_tokens, spent))
        self.telemetry.finished(record, exchange)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Off the request path; a failure is logged, never raised into a request."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                log.warning("settling a budget failed: %s",
                            type(finished.exception()).__name__)

        task.add_done_callback(done)

    def _finished(self, record: UsageRecord, exchange: Exchange) -> None:
        for sink in self._sinks:
            sink(record, exchange)

    # ---- admission ----------------------------------------------------------------

    def endpoint_for(self, method: str, path: str) -> Endpoint | None:
        return self.endpoints.get((method, path.rstrip("/") or "/"))

    async def admit(self, request: IncomingRequest) -> Exchange | Rejection:
        """Every request gets an id and a place in a trace first, so that every answer,
        a refusal too, names both (x-request-id, x-trace-id)."""
        if not self._started:
            await self.start()
        request_id = next_request_id()
        current = self.telemetry.begin(request.method, request.path,
                                       request.header("traceparent"))
        admitted, key = await self._admit(request, request_id, current)
        if isinstance(admitted, Rejection):
            admitted.headers = [*admitted.headers, ("x-request-id", request_id),
                                ("x-trace-id", current.trace_id)]
            self.telemetry.rejected(current, admitted, request_id=request_id,
                                    adapter=request.adapter, method=request.method,
                                    path=request.path, key=key)
        return admitted

    async def _admit(self, request: IncomingRequest, request_id: str,
                     current: Trace) -> tuple[Exchange | Rejection, KeyRecord | None]:
        """The admission steps, cheapest first; the first that says no answers."""
        endpoint = self.endpoint_for(request.method, request.path)
        if endpoint is None:
            return errors.endpoint_not_allowed(request.method, request.path), None
        if len(request.body) > self.settings.request_body_limit_bytes:
            return self.body_too_large(), None
        # An in-process adapter that established the caller itself (acting_as) hands the
        # principal over; everyone else is authenticated from the request's credential.
        key = (request.principal if request.principal is not None
               else await self.auth.authenticate(request.header("authorization")))
        if isinstance(key, Rejection):
            return key, None
        return await self._admit_key(request, request_id, current, endpoint, key), key

    async def _admit_key(self, request: IncomingRequest, request_id: str, current: Trace,
                         endpoint: Endpoint, key: KeyRecord) -> Exchange | Rejection:
        payload = parse_request_body(endpoint, request.body)
        if isinstance(payload, Rejection):
            return payload
        model = payload["model"] if payload else None
        if model is not None and not key.allows_model(model):
            return errors.model_not_allowed(model)
        limit = await self._limits(key)
        if isinstance(limit, Rejection):
            return limit
        plan = self._plan(endpoint, payload)
        if isinstance(plan, Rejection):
            return plan
        quota = await self._reserve(key, plan, payload)
        if isinstance(quota, Rejection):
            return quota
        exchange = Exchange(request, endpoint, key, limit, payload, plan, self._finished, quota,
                            request_id=request_id, trace=current)
        self.usage.admitted(exchange.admission_record())
        return exchange

    async def _reserve(self, key: KeyRecord, plan: Plan,
                       payload: dict | None) -> QuotaDecision | Rejection | None:
        """Reserve the request's estimate on its key's and subject's budgets (none: no
        ledger call at all)."""
        if payload is None:
            return None
        limits = await self.quotas.limits_for(key.id, key.subject_id)
        if limits is None:
            return None
        requested = payload.get("max_tokens") or payload.get("max_completion_tokens")
        decision = await self.quotas.reserve(
            limits, prompt_tokens=estimate_prompt(payload), requested_cap=requested,
            default_cap=plan.route.max_output_tokens,
            targets=[(target.provider, target.model) for target in plan.targets],
        )
        if decision == "cap":
            return errors.max_tokens_too_large(limits.cap or 0)
        if isinstance(decision, str):
            if decision.startswith("tpm:"):
                return errors.tokens_per_minute_exceeded([])
            return errors.insufficient_quota(decision, [])
        return decision

    async def _limits(self, key: KeyRecord) -> LimitDecision | Rejection:
        """The key's rate limit, guarded by its budget of failed upstream requests (one
        call: the guard is looked at, not counted)."""
        table = self.router.table
        guard = Guard(failed_requests_bucket(key.id), table.failed_requests_limit,
                      table.failed_requests_window_seconds)
        try:
            limit = await self.limiter.take(key.id, key.rate_limit_requests,
                                            key.rate_limit_window_seconds, guard=guard)
        except LimiterUnavailable:  # only under fail-closed: fail-open never raises
            return errors.rate_limiter_unavailable()
        if limit.guarded:
            return errors.too_many_failed_requests(
                table.failed_requests_limit, table.failed_requests_window_seconds)
        if not limit.allowed:
            return errors.rate_limit_exceeded(
                f"Rate limit reached for this gateway key: {limit.limit} requests per "
                f"{key.rate_limit_window_seconds}s. Retry after {limit.retry_after()}s.",
                limit.headers(),
            )
        return limit

    def _plan(self, endpoint: Endpoint, payload: dict | None) -> Plan | Rejection:
        """Where the request may go: the alias's targets that are up, fit its prompt and
        whose provider can take its parameters; no alias: the default provider."""
        if payload is None:
            table = self.router.table
            return self.router.plan_default(table.default_provider)
        plan = self.router.plan(payload["model"], estimate_prompt(payload))
        if isinstance(plan, Rejection) or endpoint.kind is not EndpointKind.CHAT:
            return plan
        stream = payload.get("stream") is True
        takers, refusal = [], ""
        for target in plan.targets:
            try:
                profile_named(plan.provider(target).profile).prepare(payload, stream=stream)
            except UnsupportedParameter as exc:
                refusal = str(exc)
            else:
                takers.append(target)
        if not takers:
            return errors.unsupported_parameter(refusal)
        return plan if len(takers) == len(plan.targets) else Plan(plan.table, plan.route,
                                                                  tuple(takers))

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


def llm_host_roots(settings: Settings, router: Router) -> dict[str, str]:
    """The hosts the sidecar intercepts, with their API root: the configured ones and every
    provider's (routing sends there, so apps may call them too)."""
    roots = settings.llm_host_roots()
    for provider in router.table.providers.values():
        host, root = host_and_api_root(provider.base_url)
        roots.setdefault(host, root)
    return roots
