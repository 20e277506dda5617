"""The composition root: ``build_gateway(settings)`` builds every part the settings name
and hands them to the engine. The one place that knows which concrete store, limiter,
client, router and provider profiles go together."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import TracerProvider

from llm_gateway.auth import KEY_CACHE_SECONDS, Authenticator
from llm_gateway.billing.alerts import parse_alert_settings
from llm_gateway.billing.alerts_watch import RECHECK_SECONDS, BudgetAlerts, Claims
from llm_gateway.billing.ledger import Ledger, MemoryLedger
from llm_gateway.billing.ledger_leased import LeasedLedger
from llm_gateway.billing.metering import UsageWriter
from llm_gateway.billing.prices import PriceBook, PriceError, prices_from_settings
from llm_gateway.billing.quotas import BudgetBook, Quotas
from llm_gateway.billing.spool import Spool
from llm_gateway.billing.webhooks import WebhookSender
from llm_gateway.config import ConfigError, Settings, is_postgres_url
from llm_gateway.engine import Gateway
from llm_gateway.extras import need
from llm_gateway.limits import (
    LeasingLimiter,
    MemoryRateLimiter,
    RateLimiter,
    SharedRateLimiter,
)
from llm_gateway.limits.failover import FailoverRateLimiter
from llm_gateway.limits.leased import LeasedRateLimiter
from llm_gateway.limits.sqlite import SqliteRateLimiter, WorkersFile
from llm_gateway.outage import Outage, OutageCollector
from llm_gateway.relay import Relay
from llm_gateway.routing.client import UpstreamClient
from llm_gateway.routing.config import parse_routes
from llm_gateway.routing.health import HealthBook, Outcome
from llm_gateway.routing.router import Router
from llm_gateway.routing.shared_health import (
    RedisEvidence,
    SharedEvidence,
    SharedHealth,
    SqliteEvidence,
)
from llm_gateway.routing.source import KeyOpener, RouteSource
from llm_gateway.routing.table import RouteTable
from llm_gateway.stores import Store, StoreUnavailable, open_store
from llm_gateway.stores.responses import ResponseOwners
from llm_gateway.stores.responses_sqlite import SqliteResponseOwners
from llm_gateway.stores.sqlite import SqliteStore
from llm_gateway.telemetry import StateCollector, Telemetry
from llm_gateway.telemetry.alert_metrics import AlertCollector
from llm_gateway.telemetry.reconcile_metrics import ReconcileDriftCollector

if TYPE_CHECKING:
    from llm_gateway.auth_jwt import JwtVerifier
    from llm_gateway.redis_scripts import RedisScripts


def build_gateway(
    settings: Settings,
    *,
    store: Store | None = None,
    limiter: RateLimiter | None = None,
    client: UpstreamClient | None = None,
    routes: RouteTable | None = None,
    key_cache_seconds: float = KEY_CACHE_SECONDS,
    tracer_provider: TracerProvider | None = None,
    backoff_base: float = 0.5,
    rng: random.Random | None = None,
    health_clock: Callable[[], float] = time.time,
    access_log_fd: int = 2,
    meter_provider: Any = None,
) -> Gateway:
    """The engine the settings describe; tests pass their own parts."""
    store = store or open_store(settings.database_url)
    redis = _redis_scripts(settings)
    limiter = limiter or open_limiter(settings, store, redis)
    auth = Authenticator(
        store, failure_policy=settings.auth_failure_policy, cache_seconds=key_cache_seconds,
        backend="postgres" if is_postgres_url(settings.database_url) else "sqlite",
        jwt=_jwt_verifier(settings),
    )
    environ = os.environ if settings.environ is None else settings.environ
    table = routes or parse_routes(settings.routes, environ, settings)
    router = Router(table, HealthBook(table.health, health_clock), rng)
    telemetry = Telemetry(settings, tracer_provider, known_models=router.known_models,
                          access_log_fd=access_log_fd, meter_provider=meter_provider)
    router.on_outcome(lambda target, outcome, _, __: _count_failure(telemetry, target, outcome))
    shared_health = None
    if (shared_evidence := open_shared_evidence(settings)) is not None:
        shared_health = SharedHealth(shared_evidence, router.health, router.target_keys)
        router.on_outcome(shared_health.listener)
    route_source = RouteSource(settings, router, store, environ=environ,
                               open_key=_key_opener(settings))
    try:
        seed_prices = prices_from_settings(settings.prices)
    except PriceError as exc:
        raise ConfigError("prices", str(exc).removeprefix("prices: ")) from None
    quotas = open_quotas(settings, store, auth, redis)
    telemetry.watch(OutageCollector(_outages(auth, limiter, quotas)))
    relay = Relay(
        client or UpstreamClient(), router, limiter,
        response_limit_bytes=settings.upstream_response_limit_bytes,
        max_event_bytes=settings.sse_event_limit_bytes, backoff_base=backoff_base,
    )
    usage = UsageWriter(store, Spool(settings.spool_dir()),
                        retention_days=settings.usage_retention_days)
    telemetry.watch(_state_collector(router, usage, limiter, quotas))
    if (drifts := getattr(store, "reconcile_drifts", None)) is not None:
        telemetry.watch(ReconcileDriftCollector(drifts))  # what `reconcile` last found
    return Gateway(
        settings, store=store, limiter=limiter, auth=auth, relay=relay, router=router,
        routes=route_source, shared_health=shared_health, quotas=quotas,
        seed_prices=seed_prices, usage=usage, telemetry=telemetry,
        response_owners=open_response_owners(settings, store, redis),
        alerts=open_alerts(settings, store, quotas, telemetry, redis, event_fd=access_log_fd),
    )


def _outages(auth: Authenticator, limiter: RateLimiter, quotas: Quotas) -> list[Outage]:
    """The shared backends whose outages /metrics shows (in process, nothing can be down)."""
    found = [auth.outage] + ([limiter.outage] if limiter.outage is not None else [])
    return found + ([quotas.outage] if quotas.ledger.backend != "memory" else [])


def _state_collector(router: Router, usage: UsageWriter, limiter: RateLimiter,
                     quotas: Quotas) -> StateCollector:
    """What /metrics reads at scrape time: health, bulkheads, the spool, budgets, leases."""
    leased = [(component, part.backend, part.book) for component, part in (
        ("rate_limiter", getattr(limiter, "shared", None)), ("budget_ledger", quotas.ledger))
        if isinstance(part, LeasedRateLimiter | LeasedLedger)]
    return StateCollector(
        target_states=lambda: {k: v.value for k, v in router.states().items()},
        bulkheads=lambda: [(name, router.bulkhead.in_flight(name), provider.max_concurrency)
                           for name, provider in router.table.providers.items()],
        spool=lambda: (usage.spooled, usage.replayed, usage.pending, usage.spool_failures),
        budgets=quotas.used_ratios,
        leases=lambda: [(component, backend, len(book), book.decisions)
                        for component, backend, book in leased],
    )


_FAILURE_KINDS = {Outcome.CONNECT: "connect", Outcome.TIMEOUT: "timeout",
                  Outcome.SERVER_ERROR: "5xx", Outcome.RATE_LIMITED: "429"}


def _count_failure(telemetry: Telemetry, target: str, outcome: Outcome) -> None:
    kind = _FAILURE_KINDS.get(outcome)
    if kind is not None:
        telemetry.upstream_failed(target.partition("/")[0], kind)


def _key_opener(settings: Settings) -> KeyOpener | None:
    """Opens provider keys stored encrypted (``providers set-key``), when the secret key
    that sealed them is set."""
    if not settings.secret_key:
        return None
    from llm_gateway.crypto import SecretBox, provider_key_context

    box = SecretBox.from_secret(settings.secret_key)
    return lambda name, nonce, sealed: box.open(nonce, sealed, context=provider_key_context(name))


def workers_file(settings: Settings) -> Path | None:
    """Where the workers of one `serve --workers N` share limits, budgets and health when
    neither Redis nor Postgres does: a SQLite file beside the database. None with one
    process (in-process counting is exact there, and faster) or a Postgres database."""
    if settings.workers <= 1 or is_postgres_url(settings.database_url):
        return None
    database = SqliteStore.from_url(settings.database_url).path
    if database == ":memory:":
        raise ConfigError("WORKERS", "more than one worker needs a database file (or "
                          "Postgres): each worker would have its own in-memory database")
    return Path(database).parent / f"{Path(database).stem}-workers.db"


# The libraries of optional parts (redis-py; PyJWT, cryptography, httpx) are imported only
# when the settings use them: each costs every process megabytes it would never use.
def _redis_scripts(settings: Settings) -> RedisScripts | None:
    """The one pipelined Redis connection the limiter and the ledger share (open_limiter)."""
    if not settings.redis_url:
        return None
    need("redis")
    from llm_gateway.redis_scripts import RedisScripts

    return RedisScripts(settings.redis_url)


def _jwt_verifier(settings: Settings) -> JwtVerifier | None:
    if not (settings.jwt_jwks_url or settings.jwt_public_key):
        return None
    need("jwt")
    from llm_gateway.auth_jwt import jwt_verifier

    return jwt_verifier(settings)


def open_quotas(settings: Settings, store: Store, auth: Authenticator,
                redis: RedisScripts | None = None) -> Quotas:
    """Budgets, kept in the key store (under its failure policy), counted where
    ``open_ledger`` says (under the failure policy of the limiter, which shares its
    backend)."""
    budgets = BudgetBook(store, outage=auth.outage, unavailable=(StoreUnavailable,))
    return Quotas(open_ledger(settings, store, redis), budgets, PriceBook(),
                  failure_policy=settings.rate_limit_failure_policy)


def open_alerts(settings: Settings, store: Store, quotas: Quotas, telemetry: Telemetry,
                redis: RedisScripts | None = None, *, event_fd: int = 2) -> BudgetAlerts | None:
    """Budget alerts (``alerts:``; none with ``thresholds: []``): read from the budget
    ledger, claimed once in the store the replicas share, shown on /metrics."""
    environ = os.environ if settings.environ is None else settings.environ
    try:
        configured = parse_alert_settings(settings.alerts, environ)
    except ValueError as exc:
        raise ConfigError("alerts", str(exc)) from None
    if not configured.thresholds:
        return None
    alerts = BudgetAlerts(
        quotas.ledger, open_alert_claims(settings, store, redis), configured.thresholds,
        sender=WebhookSender(configured.webhooks) if configured.webhooks else None,
        event_fd=event_fd,
        # A lease books what it spent when it is renewed or ends: looked at past that.
        recheck_seconds=max(RECHECK_SECONDS, 3 * settings.limit_lease_seconds + 2))
    telemetry.watch(AlertCollector(alerts))
    return alerts


def open_alert_claims(settings: Settings, store: Store,
                      redis: RedisScripts | None = None) -> Claims:
    """Where the replicas agree who sends an alert (llm_gateway.stores.alert_claims): Redis
    when REDIS_URL is set, as the ledger is, else the key store's database."""
    from llm_gateway.stores import alert_claims

    if settings.redis_url and redis is not None:
        return alert_claims.RedisClaims(redis, namespace=settings.redis_namespace)
    if is_postgres_url(settings.database_url):
        return alert_claims.PostgresClaims(store)  # type: ignore[arg-type]
    return alert_claims.SqliteClaims(store)  # type: ignore[arg-type]


def open_ledger(settings: Settings, store: Store, redis: RedisScripts | None = None) -> Ledger:
    """Where budgets are counted: Redis when REDIS_URL is set, else Postgres when the store
    is, else the workers' file with several workers, else in process (one gateway
    process: exact)."""
    shared: Ledger
    if settings.redis_url:
        from llm_gateway.billing.ledger_redis import RedisLedger

        shared = RedisLedger(settings.redis_url, namespace=settings.redis_namespace,
                             scripts=redis)
    elif is_postgres_url(settings.database_url):
        from llm_gateway.billing.ledger_postgres import PostgresLedger

        shared = PostgresLedger(store)  # type: ignore[arg-type]
    elif (path := workers_file(settings)) is not None:
        from llm_gateway.billing.ledger_sqlite import SqliteLedger

        shared = SqliteLedger(WorkersFile(path))
    else:
        return MemoryLedger()
    if not settings.limit_lease_seconds:
        return shared
    return LeasedLedger(shared, settings.limit_lease_seconds)


def open_limiter(settings: Settings, store: Store,
                 redis: RedisScripts | None = None) -> RateLimiter:
    """The limiter the settings name: Redis when REDIS_URL is set, else the Postgres
    fixed window when the store is Postgres, else the workers' file with several
    workers, else in-process counting. ``redis``: the connection it shares with the
    budget ledger, so that a request's two calls share a write and a read."""
    if settings.redis_url:
        from llm_gateway.limits.redis import RedisRateLimiter

        return FailoverRateLimiter(
            _leased(RedisRateLimiter(settings.redis_url, namespace=settings.redis_namespace,
                                     scripts=redis), settings),
            settings.rate_limit_failure_policy,
        )
    if is_postgres_url(settings.database_url):
        from llm_gateway.limits.postgres import PostgresRateLimiter
        from llm_gateway.stores.postgres import PostgresStore

        if isinstance(store, PostgresStore):
            return FailoverRateLimiter(
                _leased(PostgresRateLimiter(store), settings), settings.rate_limit_failure_policy
            )
    if (path := workers_file(settings)) is not None:
        return FailoverRateLimiter(_leased(SqliteRateLimiter(WorkersFile(path)), settings),
                                   settings.rate_limit_failure_policy)
    return MemoryRateLimiter()


def _leased(shared: LeasingLimiter, settings: Settings) -> SharedRateLimiter:
    """``shared`` with leases (llm_gateway.leases), unless LIMIT_LEASE_SECONDS is 0."""
    if not settings.limit_lease_seconds:
        return shared  # type: ignore[return-value]
    return LeasedRateLimiter(shared, settings.limit_lease_seconds)  # type: ignore[return-value]


def open_response_owners(settings: Settings, store: Store,
                         redis: RedisScripts | None = None) -> ResponseOwners:
    """Who owns each Responses API id (llm_gateway.stores.responses): Redis when REDIS_URL
    is set (``redis``: the connection the limiter and ledger share, else one of its own),
    else the key store's database. Chosen by the settings, as the ledger is, not by the
    store's class: tests wrap stores, and a wrapper passes every call through."""
    if settings.redis_url:
        from llm_gateway.stores.responses_redis import RedisResponseOwners

        return RedisResponseOwners(settings.redis_url, namespace=settings.redis_namespace,
                                   scripts=redis)
    if is_postgres_url(settings.database_url):
        from llm_gateway.stores.responses_postgres import PostgresResponseOwners

        return PostgresResponseOwners(store)  # type: ignore[arg-type]
    return SqliteResponseOwners(store)  # type: ignore[arg-type]


def open_shared_evidence(settings: Settings) -> SharedEvidence | None:
    """Where passive health is shared: Redis between replicas when REDIS_URL is set, else
    the workers' file between the workers of one node; None: each process on its own."""
    if settings.redis_url:
        return RedisEvidence(settings.redis_url, namespace=settings.redis_namespace)
    if (path := workers_file(settings)) is not None:
        return SqliteEvidence(WorkersFile(path))
    return None
