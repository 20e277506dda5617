"""The composition root: ``build_gateway(settings)`` builds every part the settings name
and hands them to the engine. The one place that knows which concrete store, limiter,
client and provider profile go together."""

from __future__ import annotations

from opentelemetry.trace import TracerProvider

from llm_gateway.auth import KEY_CACHE_SECONDS, Authenticator
from llm_gateway.billing.metering import UsageWriter
from llm_gateway.config import Settings, is_postgres_url
from llm_gateway.engine import Gateway
from llm_gateway.limits import MemoryRateLimiter, RateLimiter
from llm_gateway.limits.failover import FailoverRateLimiter
from llm_gateway.outage import OutageCollector
from llm_gateway.providers import profile_named
from llm_gateway.relay import Relay
from llm_gateway.routing.client import Upstream, UpstreamClient
from llm_gateway.stores import Store, open_store
from llm_gateway.telemetry import Telemetry


def build_gateway(
    settings: Settings,
    *,
    store: Store | None = None,
    limiter: RateLimiter | None = None,
    client: UpstreamClient | None = None,
    upstream: Upstream | None = None,
    key_cache_seconds: float = KEY_CACHE_SECONDS,
    tracer_provider: TracerProvider | None = None,
) -> Gateway:
    """The engine the settings describe; tests pass their own parts."""
    store = store or open_store(settings.database_url)
    limiter = limiter or open_limiter(settings, store)
    auth = Authenticator(
        store, failure_policy=settings.auth_failure_policy, cache_seconds=key_cache_seconds,
        backend="postgres" if is_postgres_url(settings.database_url) else "sqlite",
    )
    telemetry = Telemetry(settings, tracer_provider)
    outages = [auth.outage] + ([limiter.outage] if limiter.outage is not None else [])
    telemetry.registry.register(OutageCollector(outages))
    return Gateway(
        settings,
        store=store,
        limiter=limiter,
        auth=auth,
        relay=Relay(client or UpstreamClient()),
        upstream=upstream or default_upstream(settings),
        profile=profile_named("venice"),
        usage=UsageWriter(store),
        telemetry=telemetry,
    )


def default_upstream(settings: Settings) -> Upstream:
    """The provider the VENICE_* settings describe."""
    return Upstream(
        name="venice",
        base_url=settings.venice_base_url,
        api_key=settings.require_provider_key(),
        max_retries=settings.venice_max_retries,
        timeout=settings.request_timeout_seconds,
    )


def open_limiter(settings: Settings, store: Store) -> RateLimiter:
    """The limiter the settings name: Redis when REDIS_URL is set, else the Postgres
    fixed window when the store is Postgres, else in-process counting."""
    if settings.redis_url:
        from llm_gateway.limits.redis import RedisRateLimiter

        return FailoverRateLimiter(
            RedisRateLimiter(settings.redis_url), settings.rate_limit_failure_policy
        )
    if is_postgres_url(settings.database_url):
        from llm_gateway.limits.postgres import PostgresRateLimiter
        from llm_gateway.stores.postgres import PostgresStore

        if isinstance(store, PostgresStore):
            return FailoverRateLimiter(
                PostgresRateLimiter(store), settings.rate_limit_failure_policy
            )
    return MemoryRateLimiter()
