"""The policy engine: admit → send → observe → finish, once for every adapter.

Adapters translate their own request objects into an ``IncomingRequest`` and call
``Gateway.admit``. The answer is a ``Rejection`` (answer it; nothing reaches an upstream)
or an ``Exchange``, the admitted request's state. ``Gateway.respond`` sends it and gives
the client's response (streams stay streams). The adapter writes it and says when it is
done (``GatewayResponse.close``: written, or the client left) or that the answer will
never be asked for (``Gateway.abandon``); finishing is the engine's (``finishing.py``):
exactly one usage record per admitted request, handed to every record sink.

What differs between the APIs callers speak (the body's fields, the prompt's size, the
output cap, error shapes, how a stream ends, where usage is) is the endpoint's client
protocol's (``protocols/``); the engine holds every rule once and asks it.

The engine's own failures are answers too: ``admit`` and ``respond`` answer the 500
``gateway_error`` (in a stream: in band) rather than raise. Every answer carries
``x-request-id`` and ``x-trace-id``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

from llm_gateway import caller_text, errors
from llm_gateway.auth import Authenticator
from llm_gateway.billing.alerts_watch import BudgetAlerts
from llm_gateway.billing.ledger import Owner
from llm_gateway.billing.metering import UsageWriter
from llm_gateway.billing.model import Price
from llm_gateway.billing.prices import merge_prices
from llm_gateway.billing.quotas import (
    BudgetLimits,
    BudgetsUnavailable,
    LedgerUnavailable,
    QuotaDecision,
    QuotaRefusal,
    Quotas,
    reservation_json,
)
from llm_gateway.config import Settings
from llm_gateway.errors import Headers, Rejection, UpstreamFailure
from llm_gateway.exchange import Exchange, RecordSink
from llm_gateway.finishing import ENGINE_FAILED, Finisher, finish_response, guarded_stream
from llm_gateway.http_types import (
    GatewayResponse,
    IncomingRequest,
    next_request_id,
    process_tag,
)
from llm_gateway.interception import Interception
from llm_gateway.keys import KeyRecord
from llm_gateway.limits import Guard, LimitDecision, LimiterUnavailable, RateLimiter, request_burst
from llm_gateway.protocols import (
    RESOURCE,
    Endpoint,
    OpenAICompatible,
    crossing,
    matches,
    operation_of,
    protocol_at,
)
from llm_gateway.providers import profile_named
from llm_gateway.readiness import Readiness, probe
from llm_gateway.relay import Relay, failed_requests_bucket, failure_response
from llm_gateway.request_body import parse_request_body
from llm_gateway.routing.router import Plan, Router
from llm_gateway.routing.shared_health import SharedHealth
from llm_gateway.routing.source import RouteSource
from llm_gateway.stored_responses import StoredResponses
from llm_gateway.stores import Store
from llm_gateway.stores.responses import ResponseOwners
from llm_gateway.telemetry import Telemetry, Trace

log = logging.getLogger("llm_gateway")

# last_used_at is written in batches off the request path, this often.
TOUCH_FLUSH_SECONDS = 5.0
TAGS_HEADER = "x-llm-gateway-tags"
_trace_ids = random.Random()  # trace ids need to be unique, not secret: no syscall each


def answer_ids(request_id: str | None = None, trace_id: str | None = None) -> Headers:
    """``x-request-id`` and ``x-trace-id``. Where no request stands behind an answer (the
    connection layer's 408, 413 and 431) they are minted here: the request id from the one
    sequence, the trace new, as for a request that brought no ``traceparent``."""
    return [("x-request-id", request_id or next_request_id()),
            ("x-trace-id", trace_id or f"{_trace_ids.getrandbits(128):032x}")]


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
        response_owners: ResponseOwners | None = None,
        alerts: BudgetAlerts | None = None,
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
            (method, path): Endpoint(method, path, operation_of(method, path))
            for method, _, path in (e.partition(" ") for e in settings.allowed_endpoints)
        }
        # Endpoints whose path names a resource (/responses/{id}): matched in turn.
        self._patterned = [e for e in self.endpoints.values() if RESOURCE in e.path]
        self.interception = Interception(settings, router)
        # Asked by the sidecar's hooks (interception.py).
        self.api_root_for_host = self.interception.api_root_for_host
        self.path_under_root = self.interception.path_under_root
        self.egress_rejection = self.interception.egress_rejection
        self.finisher = Finisher(usage, quotas, telemetry, alerts)
        self.stored = (StoredResponses(response_owners, router, settings.responses_retention_days)
                       if response_owners is not None else None)
        self._started = False
        self._start_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._touch_task: asyncio.Task[None] | None = None

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            # First: a spool that cannot be written is a setting to fix, said in one line
            # before anything else happens (SpoolUnwritable).
            self.usage.check_spool()
            await self.store.migrate()
            self._loop = asyncio.get_running_loop()
            await self._refresh_prices()  # what a dead process's last streams cost
            await self.usage.replay_orphans(self.finisher.account_orphan)
            await self.quotas.keep_alive(process_tag())
            await self.routes.start()
            if self.shared_health is not None:
                await self.shared_health.start()
            self.usage.start()
            self._touch_task = self._loop.create_task(self._touch_loop())
            self._started = True

    async def close(self) -> None:
        if self._touch_task is not None:
            self._touch_task.cancel()
        await self.routes.close()
        if self.shared_health is not None:
            await self.shared_health.close()
        await self.usage.close()
        await self._flush_touches()
        await self.relay.aclose()
        await self.limiter.close()
        await self.finisher.close()  # the last records' settlements and alerts: before the ledger
        await self.quotas.ledger.close()
        if self.stored is not None:
            await self.stored.owners.close()
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
        return self.router.view(self.routes.last_error)

    async def ready(self) -> bool:
        return (await self.readiness()).ready

    async def readiness(self) -> Readiness:
        """Ask each backend now; the failure policies say what an outage means."""
        return await probe(self.store, self.auth.outage, self.limiter, self.quotas, self.router)

    async def _touch_loop(self) -> None:
        """Housekeeping off the request path: last-use times out, prices in."""
        while True:
            await asyncio.sleep(TOUCH_FLUSH_SECONDS)
            try:
                await self.quotas.keep_alive(process_tag())
                await self._flush_touches()
                await self._refresh_prices()
            except Exception as exc:
                log.warning("housekeeping failed: %s", type(exc).__name__)

    async def _refresh_prices(self) -> None:
        """The price table: the settings file's seed, and the store's (which wins)."""
        stored = getattr(self.store, "prices", None)
        from_store = await stored() if stored is not None else []
        self.quotas.prices.replace(merge_prices(self.seed_prices, from_store))

    async def _flush_touches(self) -> None:
        touches = self.auth.take_touches()
        if touches:
            await self.store.touch_keys(touches)

    # ---- finished requests --------------------------------------------------------

    def add_record_sink(self, sink: RecordSink) -> None:
        """Call ``sink(record, exchange)`` for every finished request, after the writer."""
        self.finisher.add_sink(sink)

    # ---- admission ----------------------------------------------------------------

    def endpoint_for(self, method: str, path: str) -> Endpoint | None:
        path = path.rstrip("/") or "/"
        found = self.endpoints.get((method, path))
        if found is None and self._patterned:
            found = next((endpoint for endpoint in self._patterned if endpoint.method == method
                          and matches(endpoint.path, path) is not None), None)
        return found

    async def admit(self, request: IncomingRequest) -> Exchange | Rejection:
        """Every request gets an id and a place in a trace first, so that every answer,
        a refusal too, names both (x-request-id, x-trace-id)."""
        if not self._started:
            await self.start()
        request_id = next_request_id()
        current = self.telemetry.begin(request.method, request.path,
                                       request.header("traceparent"))
        try:
            admitted, key = await self._admit(request, request_id, current)
        except Exception:  # a bug: the OpenAI-shaped 500, and nothing admitted (no record)
            log.exception("the engine failed while admitting request %s", request_id)
            admitted, key = errors.gateway_error(), None
        if isinstance(admitted, Rejection):
            return self.refuse(request, admitted, request_id, current, key)
        return admitted

    def refuse(self, request: IncomingRequest, rejection: Rejection, request_id: str = "",
               current: Trace | None = None, key: KeyRecord | None = None) -> Rejection:
        """A refusal, with ids, a span, a metric, an access-log line and a count in the
        store (it has no usage record); adapters call it for what they turn away before
        admission (a path not served, a body too large)."""
        request_id = request_id or next_request_id()
        current = current or self.telemetry.begin(request.method, request.path,
                                                  request.header("traceparent"))
        answer = dataclasses.replace(
            rejection, headers=[*rejection.headers, *answer_ids(request_id, current.trace_id)],
            shape=protocol_at(request.path).error_shape_for(request))
        self.telemetry.rejected(current, answer, request_id=request_id, adapter=request.adapter,
                                method=request.method, path=request.path, key=key)
        self.usage.refused(answer, key)
        return answer

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
               else await self.auth.authenticate(endpoint.protocol.credential(request)))
        if isinstance(key, Rejection):
            return key, None
        return await self._admit_key(request, request_id, current, endpoint, key), key

    async def _admit_key(self, request: IncomingRequest, request_id: str, current: Trace,
                         endpoint: Endpoint, key: KeyRecord) -> Exchange | Rejection:
        payload = parse_request_body(endpoint, request.body)
        if isinstance(payload, Rejection):
            return payload
        tags = _tags_of(request)
        if isinstance(tags, Rejection):
            return tags
        model = payload["model"] if payload else None
        if model is not None and not key.allows_model(model):
            return errors.model_not_allowed(model)
        plan = self._plan(endpoint, payload, request.called_host)
        if isinstance(plan, Rejection):
            return plan
        pinned = (await self.stored.plan(endpoint, request.path.rstrip("/"), payload, key)
                  if self.stored is not None else None)
        if pinned is not None:  # a stored response's: where it was made, or refused
            if isinstance(pinned, Rejection):
                return pinned
            plan = pinned
        try:  # a key store that does not answer: its policy (fail-open never raises)
            budgets = (await self.quotas.limits_for(key.id, key.subject_id)
                       if payload and endpoint.operation.billed else None)
        except BudgetsUnavailable:
            return errors.key_store_unavailable()
        if budgets is not None and budgets.charges_usd:  # priced targets only, or refused
            plan = plan.priced(self.quotas.priced_now)
            if isinstance(plan, Rejection):
                return plan
        if budgets is None:
            limit, quota = await self._limits(key), None
        else:  # asked at once: one write, one wait; one task, run eagerly (no loop turn)
            limiting = asyncio.eager_task_factory(asyncio.get_running_loop(), self._limits(key))
            quota = await self._reserve(budgets, plan, payload, request_id, endpoint.protocol)
            try:
                limit = await limiting
            except BaseException:
                self.finisher.release(quota)
                raise
            if isinstance(limit, Rejection):  # not sent: nothing spent
                self.finisher.release(quota)
        for refusal in (limit, quota):  # the rate limit's first, as it was asked first
            if isinstance(refusal, Rejection):
                return refusal
        try:
            exchange = Exchange(request, endpoint, key, limit, payload, plan,
                                self.finisher.finished,
                                quota, request_id=request_id, trace=current, tags=tags,
                                on_progress=self.usage.progress)
            self.usage.admitted(exchange.admission_record(), reservation_json(
                quota.reservation if isinstance(quota, QuotaDecision) else None))
        except BaseException:  # admitted by every limit, then failed: nothing is held
            self.finisher.release(quota)
            raise
        return exchange

    async def _reserve(self, budgets: BudgetLimits, plan: Plan, payload: dict,
                       request_id: str, protocol: OpenAICompatible) -> QuotaDecision | Rejection:
        try:  # the estimate on the key's and subject's budgets; the counters' policy
            decision = await self.quotas.reserve(
                budgets, prompt_tokens=protocol.prompt_tokens(payload),
                requested_cap=protocol.output_cap(payload),
                default_cap=plan.route.max_output_tokens,
                targets=[(target.provider, target.model) for target in plan.targets],
                owner=Owner(process_tag(), request_id), choices=protocol.choices(payload),
            )
        except LedgerUnavailable:
            return errors.budget_ledger_unavailable()
        if isinstance(decision, QuotaRefusal):
            self.finisher.budget_refused(decision.limit, budgets.budgets)
            if decision.limit == "cap":
                return errors.max_tokens_too_large(budgets.cap or 0)
            if decision.limit.startswith("tpm:"):
                return errors.tokens_per_minute_exceeded(decision.headers)
            return errors.insufficient_quota(decision.limit, decision.headers)
        return decision

    async def _limits(self, key: KeyRecord) -> LimitDecision | Rejection:
        """The key's rate limit, guarded by its budget of failed upstream requests (one
        call: the guard is looked at, not counted)."""
        table = self.router.table
        guard = Guard(failed_requests_bucket(key.id), table.failed_requests_limit,
                      table.failed_requests_window_seconds)
        burst = request_burst(self.settings.rate_limit_algorithm, key)  # None: fixed window
        try:
            limit = await self.limiter.take(key.id, key.rate_limit_requests,
                                            key.rate_limit_window_seconds, guard=guard, burst=burst)
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

    def _plan(self, endpoint: Endpoint, payload: dict | None,
              called_host: tuple[str, int] | None) -> Plan | Rejection:
        """Where the request may go: the alias's targets that are up, fit its prompt and
        whose provider can take its parameters; no alias: the provider of the host it
        was sent to (the sidecar's), else the default provider."""
        protocol = endpoint.protocol
        if payload is None:
            return self.router.plan_default(called_host, protocol.wire)
        plan = self.router.plan(payload["model"], protocol.prompt_tokens(payload), called_host,
                                protocol.wire)
        if isinstance(plan, Rejection):
            return plan
        stream = payload.get("stream") is True
        takers, refused = [], ""
        for target in plan.targets:
            provider = plan.provider(target)
            wire = provider.wire_for(protocol.wire)
            problem = (crossing.refusal(protocol, wire, profile_named(provider.profile),
                                        payload, target.model, stream=stream)
                       if endpoint.operation.crosses or wire in (None, protocol.wire) else
                       f"{endpoint.path} has no translation for a target that speaks {wire}")
            if problem is None:
                takers.append(target)
            else:
                refused = problem
        if not takers:
            return errors.unsupported_parameter(refused)
        return plan if len(takers) == len(plan.targets) else Plan(plan.table, plan.route,
                                                                  tuple(takers))

    async def respond(self, exchange: Exchange) -> GatewayResponse:
        """Send an admitted request and give the client's response (streams stay streams).
        The engine's own failure is an answer too: the 500 ``gateway_error`` with the
        exchange's headers, or inside a stream an error event that ends it; the exchange
        records it. The adapter writes the answer and then closes it
        (``GatewayResponse.close``): the engine finishes the request then, exactly once
        (one usage record). Cancelled before it answered (the client left), the adapter
        says so with ``abandon``."""
        try:
            response = await self.relay.respond(exchange)
        except Exception:
            log.exception("the engine failed while relaying request %s", exchange.request_id)
            response = failure_response(exchange, UpstreamFailure("gateway_error",
                                                                  ENGINE_FAILED))
        if response.chunks is not None:
            response.chunks = guarded_stream(exchange, response, response.chunks,
                                                self._stream_keeper(exchange))
        elif self.stored is not None:
            await self.stored.after(exchange)
        response.on_finish = functools.partial(finish_response, exchange, response)
        return response

    def _stream_keeper(self, exchange: Exchange) -> Callable[[], None] | None:
        """For a stream that creates a stored response: what binds it to its caller, once
        its id has been seen (its first event), in the background."""
        stored = self.stored
        if stored is None or not stored.keeps(exchange):
            return None
        return lambda: self.finisher.background(stored.after(exchange))

    def abandon(self, exchange: Exchange, *, client_gone: bool = True,
                failure: tuple[int, str, str | None] | None = None) -> None:
        """An admitted request whose answer will never be asked for (its client left
        first, the adapter's own transport failed, the gateway shuts down): finished now,
        as ``failure`` (status, code, message) says or as a client that left."""
        if failure is not None:
            exchange.fail(*failure)
        exchange.finish(client_disconnected=client_gone)

    def body_too_large(self) -> Rejection:
        return errors.request_too_large(self.settings.request_body_limit_bytes)

    # ---- interception: adapters in front of provider hosts (the sidecar) ----------

    @property
    def llm_host_roots(self) -> dict[str, str]:
        return self.interception.llm_host_roots


def _tags_of(request: IncomingRequest) -> dict[str, str] | Rejection:
    """The caller's ``x-llm-gateway-tags``, admitted by the one check for caller strings."""
    header = request.header(TAGS_HEADER)
    if header is None:
        return {}
    tags = caller_text.tags_of(header)
    return errors.invalid_request_header(tags) if isinstance(tags, str) else tags
