"""Reading routes: ``providers:``, ``models:`` and their companions, from the YAML file or
an admin change, into a ``RouteTable``; every mistake refused with one line naming where.

Without a ``providers:`` section the VENICE_* settings describe the one provider
``venice``, as before routing existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from llm_gateway.config import ROUTE_KEYS, ConfigError, Secret, Settings
from llm_gateway.providers import PROFILES, PROTOCOLS
from llm_gateway.routing.schema import UNPRICED, keys_under
from llm_gateway.routing.table import (
    HealthPolicy,
    ModelRoute,
    ProviderConfig,
    RouteTable,
    Target,
    Timeouts,
)


class RouteError(ConfigError, ValueError):
    """A route document that cannot serve; str() is the one-line reason, which starts
    with where the problem is (``models.chat-fast.targets[0].provider: ...``). A
    ConfigError: at start-up it stops a command as every bad setting does (one line,
    exit 2)."""

    def __init__(self, reason: str) -> None:
        where, sep, problem = reason.partition(": ")
        if not sep:
            where, problem = "routes", reason
        super().__init__(where, problem)


def merge_routes(file_document: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """The file's routes with an overlay (admin changes) on top: an overlay provider or
    model replaces the file's of the same name; ``null`` removes it."""
    merged = {key: file_document[key] for key in ROUTE_KEYS if key in file_document}
    for section in ("providers", "models"):
        entries = dict(merged.get(section) or {})
        for name, entry in (overlay.get(section) or {}).items():
            if entry is None:
                entries.pop(name, None)
            else:
                entries[name] = entry
        if entries or section in merged:
            merged[section] = entries
    for key in ("default_provider", "unknown_models", "routing"):
        if key in overlay:
            merged[key] = overlay[key]
    return merged


def parse_routes(
    document: Mapping[str, Any], environ: Mapping[str, str], settings: Settings | None = None,
) -> RouteTable:
    """The table a route document describes. ``settings`` supply the legacy provider when
    the document has no ``providers:``."""
    unknown = sorted(set(document) - set(ROUTE_KEYS))
    if unknown:
        raise RouteError(f"routes: unknown key {unknown[0]!r}")
    raw_providers = document.get("providers")
    if raw_providers:
        providers = {str(name): _provider(str(name), entry, environ)
                     for name, entry in _mapping("providers", raw_providers).items()}
    else:
        legacy = legacy_provider(settings or Settings())
        providers = {legacy.name: legacy}
    default = str(document.get("default_provider") or next(iter(providers)))
    if default not in providers:
        raise RouteError(f"default_provider: {default!r} is not a provider")
    unknown_models = str(document.get("unknown_models", "passthrough"))
    if unknown_models not in ("passthrough", "reject"):
        raise RouteError(f"unknown_models: expected passthrough or reject, got {unknown_models!r}")
    models = {str(name): _model(str(name), entry, providers)
              for name, entry in _mapping("models", document.get("models") or {}).items()}
    return RouteTable(
        providers=MappingProxyType(providers), models=MappingProxyType(models),
        default_provider=default, unknown_models=unknown_models,
        **_routing_options(document.get("routing") or {}, settings),
    )


def legacy_provider(settings: Settings) -> ProviderConfig:
    """The provider the VENICE_* settings describe."""
    timeout = settings.request_timeout_seconds
    return ProviderConfig(
        name="venice", base_url=settings.venice_base_url, profile="venice",
        api_key=settings.venice_api_key, api_key_env="VENICE_API_KEY",
        admin_key_env="VENICE_ADMIN_KEY",  # a Venice ADMIN key, for `reconcile` only
        timeouts=Timeouts(connect=5.0, first_byte=timeout, read=timeout, stream_idle=timeout),
    )


def _provider(name: str, raw: Any, environ: Mapping[str, str]) -> ProviderConfig:
    where = f"providers.{name}"
    entry = _mapping(where, raw)
    _only(where, entry, keys_under("providers.NAME"))
    base_url = str(entry.get("base_url") or "").rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise RouteError(f"{where}.base_url: expected an http(s) URL, got {base_url!r}")
    profile = str(entry.get("profile", "openai"))
    if profile not in PROFILES:
        raise RouteError(f"{where}.profile: expected {' | '.join(PROFILES)}, got {profile!r}")
    key_env = entry.get("api_key_env")
    key = environ.get(str(key_env)) if key_env else None
    headers = _mapping(f"{where}.headers", entry.get("headers") or {})
    limits = _mapping(f"{where}.limits", entry.get("limits") or {})
    _only(f"{where}.limits", limits, keys_under("providers.NAME.limits"))
    return ProviderConfig(
        name=name, base_url=base_url, profile=profile,
        api_key=Secret(key) if key else None, api_key_env=str(key_env) if key_env else None,
        admin_key_env=_variable(f"{where}.admin_key_env", entry.get("admin_key_env")),
        auth_header=(_auth_header(where, entry["auth"]) if "auth" in entry
                     else PROFILES[profile].auth_header),
        protocols=_protocols(where, entry.get("protocols"), PROFILES[profile].protocols),
        headers=tuple((str(k).lower(), str(v)) for k, v in headers.items()),
        max_concurrency=_count(f"{where}.max_concurrency", entry.get("max_concurrency", 0)),
        timeouts=_timeouts(f"{where}.timeouts", entry.get("timeouts") or {}),
        requests_per_minute=_count(f"{where}.limits.requests_per_minute",
                                   limits.get("requests_per_minute", 0)),
        tokens_per_minute=_count(f"{where}.limits.tokens_per_minute",
                                 limits.get("tokens_per_minute", 0)),
        unpriced=(_unpriced(f"{where}.unpriced", entry["unpriced"])
                  if "unpriced" in entry else None),
    )


def _variable(where: str, raw: Any) -> str | None:
    """An environment variable's name (None: unset)."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip() or "=" in raw or "\0" in raw:
        raise RouteError(f"{where}: expected an environment variable's name, got {raw!r}")
    return raw.strip()


def _unpriced(where: str, raw: Any) -> str:
    if raw not in UNPRICED:
        raise RouteError(f"{where}: expected {' or '.join(UNPRICED)}, got {raw!r}")
    return str(raw)


def _protocols(where: str, raw: Any, default: frozenset[str]) -> frozenset[str]:
    if raw is None:
        return default
    if (not isinstance(raw, list) or not raw
            or any(not isinstance(name, str) or name not in PROTOCOLS for name in raw)):
        raise RouteError(f"{where}.protocols: expected a non-empty list of "
                         f"{', '.join(sorted(PROTOCOLS))}, got {raw!r}")
    return frozenset(raw)


def _auth_header(where: str, raw: Any) -> str | None:
    if raw == "bearer":
        return "authorization"
    if raw == "none":
        return None
    if isinstance(raw, Mapping) and set(raw) == {"header"} and str(raw["header"]).strip():
        return str(raw["header"]).strip().lower()
    raise RouteError(f"{where}.auth: expected bearer, none or {{header: NAME}}, got {raw!r}")


def _timeouts(where: str, raw: Any) -> Timeouts:
    entry = _mapping(where, raw)
    defaults = Timeouts()
    _only(where, entry, keys_under("providers.NAME.timeouts"))
    return Timeouts(**{
        name: _seconds(f"{where}.{name}", entry.get(name, getattr(defaults, name)))
        for name in Timeouts.__dataclass_fields__
    })


def _model(name: str, raw: Any, providers: Mapping[str, ProviderConfig]) -> ModelRoute:
    where = f"models.{name}"
    entry = _mapping(where, raw)
    _only(where, entry, keys_under("models.ALIAS"))
    raw_targets = entry.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise RouteError(f"{where}.targets: expected a non-empty list")
    targets = tuple(_target(f"{where}.targets[{index}]", item, providers)
                    for index, item in enumerate(raw_targets))
    timeouts = _mapping(f"{where}.timeouts", entry.get("timeouts") or {})
    _only(f"{where}.timeouts", timeouts, keys_under("models.ALIAS.timeouts"))
    return ModelRoute(
        name=name, targets=targets,
        context_window=_optional_count(f"{where}.context_window", entry.get("context_window")),
        max_output_tokens=_optional_count(f"{where}.max_output_tokens",
                                          entry.get("max_output_tokens")),
        read_timeout=(_seconds(f"{where}.timeouts.read", timeouts["read"])
                      if "read" in timeouts else None),
    )


def _target(where: str, raw: Any, providers: Mapping[str, ProviderConfig]) -> Target:
    entry = _mapping(where, raw)
    _only(where, entry, keys_under("models.ALIAS.targets[]"))
    provider = str(entry.get("provider", ""))
    if provider not in providers:
        raise RouteError(f"{where}.provider: {provider!r} is not a provider")
    model = str(entry.get("model") or "")
    if not model:
        raise RouteError(f"{where}.model: required")
    weight = _count(f"{where}.weight", entry.get("weight", 1))
    if weight < 1:
        raise RouteError(f"{where}.weight: must be at least 1")
    return Target(provider, model, weight, _count(f"{where}.priority", entry.get("priority", 0)),
                  _optional_count(f"{where}.context_window", entry.get("context_window")),
                  unpriced=(_unpriced(f"{where}.unpriced", entry["unpriced"])
                            if "unpriced" in entry else None))


def _routing_options(raw: Any, settings: Settings | None) -> dict[str, Any]:
    entry = _mapping("routing", raw)
    _only("routing", entry, keys_under("routing"))
    legacy_attempts = (settings.venice_max_retries + 1) if settings else 3
    health = _mapping("routing.health", entry.get("health") or {})
    _only("routing.health", health, keys_under("routing.health"))
    failed = _mapping("routing.failed_requests", entry.get("failed_requests") or {})
    _only("routing.failed_requests", failed, keys_under("routing.failed_requests"))
    attempts = _count("routing.max_attempts", entry.get("max_attempts", legacy_attempts))
    if attempts < 1:
        raise RouteError("routing.max_attempts: must be at least 1")
    return {
        "max_attempts": attempts,
        "max_retry_wait_seconds": _seconds("routing.max_retry_wait_seconds",
                                           entry.get("max_retry_wait_seconds", 20)),
        "health": _health_policy(health),
        "failed_requests_limit": _count("routing.failed_requests.limit",
                                        failed.get("limit", 10)),
        "failed_requests_window_seconds": _count("routing.failed_requests.window_seconds",
                                                 failed.get("window_seconds", 30)),
    }


def _health_policy(entry: Mapping[str, Any]) -> HealthPolicy:
    defaults = HealthPolicy()
    values: dict[str, Any] = {}
    for name in ("failures_to_degraded", "failures_to_down", "successes_to_healthy"):
        values[name] = _count(f"routing.health.{name}", entry.get(name, getattr(defaults, name)))
        if values[name] < 1:
            raise RouteError(f"routing.health.{name}: must be at least 1")
    for name in ("cooldown_seconds", "max_cooldown_seconds"):
        values[name] = _seconds(f"routing.health.{name}", entry.get(name, getattr(defaults, name)))
    weight = entry.get("degraded_weight", defaults.degraded_weight)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1:
        raise RouteError(f"routing.health.degraded_weight: expected 0 < w <= 1, got {weight!r}")
    return HealthPolicy(**values, degraded_weight=float(weight))


# ---- small readers, each naming where a bad value is --------------------------------------

def _mapping(where: str, raw: Any) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise RouteError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return raw


def _only(where: str, entry: Mapping[str, Any], allowed: frozenset[str]) -> None:
    if unknown := sorted(str(key) for key in entry if key not in allowed):
        raise RouteError(f"{where}: unknown key {unknown[0]!r}")


def _count(where: str, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise RouteError(f"{where}: expected a whole number >= 0, got {raw!r}")
    return raw


def _optional_count(where: str, raw: Any) -> int | None:
    return None if raw is None else _count(where, raw)


def _seconds(where: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw > 0:
        raise RouteError(f"{where}: expected a number of seconds > 0, got {raw!r}")
    return float(raw)
