"""The route sections' keys, one row each: where a key sits, what it takes, its default
and what it means.

The parser (``routing.config``) allows exactly the keys listed here under each place, and
the configuration reference (docs/reference/configuration.md, ``make docs-reference``) is
generated from these rows; so a key is added here, once, or it is refused. A default is
the value the route table's own dataclasses hold where they hold one, so the page cannot
drift from what an omitted key becomes.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

from llm_gateway.providers import PROFILES, PROTOCOLS
from llm_gateway.routing.table import (
    HealthPolicy,
    ModelRoute,
    ProviderConfig,
    RouteTable,
    Target,
    Timeouts,
)

# What a model without a price does for a key with a USD budget (``unpriced:``).
UNPRICED = ("refuse", "allow")


@dataclass(frozen=True, slots=True)
class RouteKey:
    """One key: ``path`` spells its place (``NAME``: a provider's name, ``ALIAS`` a model
    alias, ``[]`` an item of a list); ``default`` is a value, or a text in words."""

    path: str
    accepts: str
    default: Any
    meaning: str


class Required:
    """The default of a key that has none: it must be given."""

    def __repr__(self) -> str:
        return "required"


REQUIRED = Required()


def _default_of(cls: type, name: str) -> Any:
    """The dataclass's own default for ``name``: what an omitted key becomes."""
    for item in fields(cls):
        if item.name == name:
            if item.default is not MISSING:
                return item.default
            if item.default_factory is not MISSING:
                return item.default_factory()
    raise KeyError(f"{cls.__name__}.{name} has no default")


_SECONDS = "seconds (a number > 0)"
_COUNT = "whole number, at least 0"
_P = "providers.NAME"
_M = "models.ALIAS"
_T = "models.ALIAS.targets[]"
_H = "routing.health"

ROUTE_SCHEMA: tuple[RouteKey, ...] = (
    RouteKey("providers", "mapping of a provider's name to its settings",
             "the one provider `venice` of the `VENICE_*` settings",
             "the providers requests may go to; without it `VENICE_API_KEY` is required"),
    RouteKey(f"{_P}.base_url", "http:// or https:// URL", REQUIRED,
             "the provider's API root, e.g. `https://api.openai.com/v1`"),
    RouteKey(f"{_P}.api_key_env", "variable name", "unset",
             "the variable holding its key (or a key stored with `providers set-key NAME`; "
             "the environment wins)"),
    RouteKey(f"{_P}.admin_key_env", "variable name", "unset",
             "the variable holding its admin key (OpenAI's or Anthropic's admin key, a "
             "Venice ADMIN key), which only `llm-gateway reconcile` uses, to read the "
             "provider's own usage and cost report"),
    RouteKey(f"{_P}.auth", "bearer, none or {header: NAME}", "the profile's",
             "where its key goes: `Authorization: Bearer`, nowhere, or the bare key in a "
             "header (`anthropic`: `x-api-key`, `gemini`: `x-goog-api-key`)"),
    RouteKey(f"{_P}.headers", "mapping of header to value", {},
             "static headers added to every request to it; a caller's header of the same "
             "name is dropped"),
    RouteKey(f"{_P}.profile", " or ".join(PROFILES), _default_of(ProviderConfig, "profile"),
             "which translator speaks to it: parameters, usage, cost and errors"),
    RouteKey(f"{_P}.protocols", "list of " + ", ".join(sorted(PROTOCOLS)), "the profile's",
             "the client protocols it speaks natively; a request of another one is "
             "translated, or goes to a target that speaks it"),
    RouteKey(f"{_P}.max_concurrency", _COUNT, _default_of(ProviderConfig, "max_concurrency"),
             "the requests one process may have open to it (a bulkhead); 0: no bound"),
    RouteKey(f"{_P}.timeouts", "mapping", {}, "its timeouts, below"),
    RouteKey(f"{_P}.timeouts.connect", _SECONDS, _default_of(Timeouts, "connect"),
             "to open the connection"),
    RouteKey(f"{_P}.timeouts.first_byte", _SECONDS, _default_of(Timeouts, "first_byte"),
             "from sending to the response's headers (the wait is connect + first_byte)"),
    RouteKey(f"{_P}.timeouts.read", _SECONDS, _default_of(Timeouts, "read"),
             "between reads of a whole (non-stream) body"),
    RouteKey(f"{_P}.timeouts.stream_idle", _SECONDS, _default_of(Timeouts, "stream_idle"),
             "between chunks of a stream"),
    RouteKey(f"{_P}.limits", "mapping", {}, "provider-wide limits, below"),
    RouteKey(f"{_P}.limits.requests_per_minute", _COUNT,
             _default_of(ProviderConfig, "requests_per_minute"),
             "requests a minute to it, shared like the keys' limits; a provider over it is "
             "skipped; 0: none"),
    RouteKey(f"{_P}.limits.tokens_per_minute", _COUNT,
             _default_of(ProviderConfig, "tokens_per_minute"),
             "tokens a minute to it (estimated as sent, corrected by the answer's usage); "
             "0: none"),
    RouteKey(f"{_P}.unpriced", " or ".join(UNPRICED), "unset",
             "a model of it without a price, for a key with a USD budget: refused (400 "
             "`model_not_priced`) or allowed; unset: refused unless the profile reports each "
             "answer's cost (`venice`)"),
    RouteKey("models", "mapping of an alias to its route", {},
             "the model aliases callers name"),
    RouteKey(f"{_M}.targets", "non-empty list", REQUIRED, "where the alias is served"),
    RouteKey(f"{_T}.provider", "a provider's name", REQUIRED, "the provider of this target"),
    RouteKey(f"{_T}.model", "text", REQUIRED, "the model name the provider knows"),
    RouteKey(f"{_T}.weight", "whole number, at least 1", _default_of(Target, "weight"),
             "its share of the traffic among the targets of its priority"),
    RouteKey(f"{_T}.priority", _COUNT, _default_of(Target, "priority"),
             "lower first: a higher priority serves only when no lower one can"),
    RouteKey(f"{_T}.context_window", "tokens (a whole number)", "the alias's",
             "the prompt it can hold; a target that cannot is left out"),
    RouteKey(f"{_T}.unpriced", " or ".join(UNPRICED), "its provider's",
             "as `providers.NAME.unpriced`, for this target"),
    RouteKey(f"{_M}.context_window", "tokens (a whole number)", "unset (no check)",
             "the prompt its targets can hold: 400 `context_length_exceeded` before any call "
             "when none can"),
    RouteKey(f"{_M}.max_output_tokens", "tokens (a whole number)",
             _default_of(ModelRoute, "max_output_tokens"),
             "the output cap budgets assume when a request sets none (else 4096)"),
    RouteKey(f"{_M}.timeouts", "mapping", {}, "its timeouts, below"),
    RouteKey(f"{_M}.timeouts.read", _SECONDS, "its providers'",
             "replaces its providers' read and stream_idle timeouts (a slow model)"),
    RouteKey("default_provider", "a provider's name", "the first provider",
             "where a model name that is no alias goes (`passthrough`)"),
    RouteKey("unknown_models", "passthrough or reject",
             _default_of(RouteTable, "unknown_models"),
             "a name that is no alias: sent to the default provider unchanged, or 404 "
             "`model_not_found`"),
    RouteKey("routing", "mapping", {}, "retries, health and the failed-request budget, below"),
    RouteKey("routing.max_attempts", "whole number, at least 1", "VENICE_MAX_RETRIES + 1",
             "attempts per request over the alias's targets"),
    RouteKey("routing.max_retry_wait_seconds", _SECONDS,
             _default_of(RouteTable, "max_retry_wait_seconds"),
             "how long a request may wait out a lone target's 429 `Retry-After` in all"),
    RouteKey(_H, "mapping", {}, "passive health, below"),
    RouteKey(f"{_H}.failures_to_degraded", "whole number, at least 1",
             _default_of(HealthPolicy, "failures_to_degraded"),
             "consecutive failures that make a HEALTHY target DEGRADED"),
    RouteKey(f"{_H}.failures_to_down", "whole number, at least 1",
             _default_of(HealthPolicy, "failures_to_down"),
             "failures in all that make it DOWN (no traffic)"),
    RouteKey(f"{_H}.successes_to_healthy", "whole number, at least 1",
             _default_of(HealthPolicy, "successes_to_healthy"),
             "consecutive successes that make a DEGRADED target HEALTHY"),
    RouteKey(f"{_H}.cooldown_seconds", _SECONDS, _default_of(HealthPolicy, "cooldown_seconds"),
             "how long a DOWN target (or one that answered 429) rests, or longer when the "
             "provider asks"),
    RouteKey(f"{_H}.max_cooldown_seconds", _SECONDS,
             _default_of(HealthPolicy, "max_cooldown_seconds"),
             "the longest cooldown a provider's wait can ask for"),
    RouteKey(f"{_H}.degraded_weight", "number, 0 < w <= 1",
             _default_of(HealthPolicy, "degraded_weight"),
             "the share of its weight a DEGRADED target keeps"),
    RouteKey("routing.failed_requests", "mapping", {},
             "the shared provider key's failed-request budget, below"),
    RouteKey("routing.failed_requests.limit", _COUNT,
             _default_of(RouteTable, "failed_requests_limit"),
             "upstream 4xx answers (408 and 429 aside) one gateway key may cause per window "
             "before it gets 429 `too_many_failed_requests`"),
    RouteKey("routing.failed_requests.window_seconds", _COUNT,
             _default_of(RouteTable, "failed_requests_window_seconds"),
             "that window, in seconds"),
)


def keys_under(path: str) -> frozenset[str]:
    """The keys allowed directly under ``path`` (``providers.NAME``, ``routing.health``)."""
    prefix = f"{path}."
    return frozenset(row.path[len(prefix):] for row in ROUTE_SCHEMA
                     if row.path.startswith(prefix) and "." not in row.path[len(prefix):])
