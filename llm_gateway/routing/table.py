"""The route table: providers, model aliases and their targets, as one immutable value.

A new table replaces the old one whole (a file edit, an admin change), so a request sees
one consistent version from admission to its last attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import urlsplit

from llm_gateway.config import Secret
from llm_gateway.providers import PROFILES
from llm_gateway.translate import target_protocol


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``first_byte``: from sending to the response's headers; ``read``: between
    reads of a whole (non-stream) body; ``stream_idle``: between chunks of a stream."""

    connect: float = 5.0
    first_byte: float = 30.0
    read: float = 120.0
    stream_idle: float = 60.0


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str
    base_url: str  # the API root, e.g. https://api.venice.ai/api/v1
    profile: str = "openai"  # which translator speaks to it (llm_gateway.providers)
    api_key: Secret | None = None
    api_key_env: str | None = None
    # The variable holding its admin key (OpenAI's and Anthropic's admin keys, Venice's
    # ADMIN key), which only ``llm-gateway reconcile`` reads, to fetch the provider's own
    # usage and cost report; never sent with a request.
    admin_key_env: str | None = None
    # Where the key goes: "authorization" (as "Bearer <key>"), another header (the bare
    # key, e.g. "api-key"), or None (no key: a local vLLM or Ollama).
    auth_header: str | None = "authorization"
    headers: tuple[tuple[str, str], ...] = ()
    max_concurrency: int = 0  # 0: no bulkhead
    timeouts: Timeouts = field(default_factory=Timeouts)
    requests_per_minute: int = 0  # provider-wide, 0: none
    tokens_per_minute: int = 0
    # The client protocols it speaks natively (chat, embeddings, messages, responses):
    # a request goes only to targets whose provider speaks its protocol. Empty: the
    # profile's.
    protocols: frozenset[str] = frozenset()
    # A model of it without a price, for a key with a USD budget: "refuse" (400
    # model_not_priced) or "allow" (charged what the provider reports, if anything). None,
    # the default: refused unless its profile reports each answer's cost (Venice). A
    # target's own setting wins.
    unpriced: str | None = None
    # The request headers this provider's configuration sets (its static headers, its key's
    # header): the gateway's alone, so a caller's copy of any of them is never sent along.
    owned_headers: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        if not self.protocols:
            object.__setattr__(self, "protocols", PROFILES[self.profile].protocols)
        owned = {name.lower() for name, _ in self.headers}
        if self.auth_header is not None:
            owned.add(self.auth_header.lower())
        object.__setattr__(self, "owned_headers", frozenset(owned))

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    def serves_host(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is this provider's API host, as the sidecar intercepts it:
        the name (any case, a trailing dot aside), and the port when the URL names one."""
        parts = urlsplit(self.base_url)
        if (parts.hostname or "") != host.lower().rstrip("."):
            return False
        return parts.port is None or parts.port == port

    def speaks(self, protocol: str | None) -> bool:
        """Whether it takes requests of ``protocol`` (None: any, a model list say)."""
        return protocol is None or protocol in self.protocols

    def wire_for(self, protocol: str | None) -> str | None:
        """The protocol a request of ``protocol`` is sent to it in: its own when this
        provider speaks it, else one it is translated to (None: neither)."""
        if protocol is None or protocol in self.protocols:
            return protocol
        return target_protocol(protocol, self.protocols)

    def url(self, path: str, query: str = "") -> str:
        return f"{self.base_url}{path}" + (f"?{query}" if query else "")

    def auth_headers(self) -> list[tuple[str, str]]:
        if self.auth_header is None or not self.api_key:
            return []
        key = self.api_key.reveal()
        if self.auth_header == "authorization":
            return [("authorization", f"Bearer {key}")]
        return [(self.auth_header, key)]


@dataclass(frozen=True, slots=True)
class Target:
    """One place an alias can be served: a provider and that provider's model name."""

    provider: str
    model: str
    weight: int = 1
    priority: int = 0  # lower first; a higher priority serves only when the lower cannot
    context_window: int | None = None
    # A model name that is no alias, sent to the default provider as it is: its health is
    # the provider's ("venice/*"), so names callers make up cannot grow the health book.
    passthrough: bool = False
    unpriced: str | None = None  # "refuse" or "allow"; None: its provider's

    @property
    def key(self) -> str:
        return f"{self.provider}/*" if self.passthrough else f"{self.provider}/{self.model}"


@dataclass(frozen=True, slots=True)
class ModelRoute:
    name: str
    targets: tuple[Target, ...]
    context_window: int | None = None
    max_output_tokens: int | None = None  # the default output cap, for budget estimates
    read_timeout: float | None = None  # overrides its providers' read timeout


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Passive health: thresholds of consecutive outcomes, and the cooldown of a target
    that is DOWN (longer when the provider asks, never past the maximum)."""

    failures_to_degraded: int = 3
    failures_to_down: int = 5
    successes_to_healthy: int = 3
    cooldown_seconds: float = 60.0
    max_cooldown_seconds: float = 600.0
    degraded_weight: float = 0.1  # a DEGRADED target keeps this share of its weight


@dataclass(frozen=True, slots=True)
class RouteTable:
    providers: Mapping[str, ProviderConfig]
    models: Mapping[str, ModelRoute]
    default_provider: str
    unknown_models: str = "passthrough"  # or "reject": 404 model_not_found
    max_attempts: int = 3
    # Attempts on a 429 from the last target left wait out its Retry-After up to this.
    max_retry_wait_seconds: float = 20.0
    health: HealthPolicy = field(default_factory=HealthPolicy)
    # Upstream 4xx failures a key may cause in a window before it is cut off (429
    # too_many_failed_requests): one broken client must not get the shared key locked.
    failed_requests_limit: int = 10
    failed_requests_window_seconds: int = 30
    version: int = 0
    # Where each route was defined: "file", "db v3", "environment".
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def route_for(self, model: str, provider: str | None = None,
                  protocol: str | None = None) -> ModelRoute | None:
        """The alias ``model``, or for another name that provider's model of that name
        (passthrough: ``provider``, else the one that speaks ``protocol``); None when
        unknown names are refused."""
        route = self.models.get(model)
        if route is not None:
            return route
        if self.unknown_models != "passthrough":
            return None
        owner = provider if provider in self.providers else self.provider_for(protocol)
        return ModelRoute(model, (Target(owner, model, passthrough=True),))

    def provider_for(self, protocol: str | None) -> str:
        """Where a request that names no alias goes: the default provider when it speaks
        the protocol, else the first one listed that does (else the default, which then
        refuses it: unsupported_protocol)."""
        if self.providers[self.default_provider].speaks(protocol):
            return self.default_provider
        return next((name for name, provider in self.providers.items()
                     if provider.speaks(protocol)), self.default_provider)

    def provider_for_host(self, host: str, port: int) -> str | None:
        """The provider whose API host an intercepted request was sent to: the default
        provider when several share the host, else the first listed; None for no match."""
        matching = [name for name, provider in self.providers.items()
                    if provider.serves_host(host, port)]
        if self.default_provider in matching:
            return self.default_provider
        return matching[0] if matching else None

    def may_go_unpriced(self, target: Target) -> bool:
        """Whether a key with a USD budget may be sent to ``target`` without a price: as
        ``unpriced:`` says (the target's, else its provider's), else when its provider's
        profile reports every answer's cost, which the budget is then charged."""
        provider = self.providers[target.provider]
        setting = target.unpriced or provider.unpriced
        if setting is None:
            return PROFILES[provider.profile].reports_cost
        return setting == "allow"

    def all_targets(self) -> list[Target]:
        seen: dict[str, Target] = {}
        for route in self.models.values():
            for target in route.targets:
                seen.setdefault(target.key, target)
        return list(seen.values())
