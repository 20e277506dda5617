"""Settings: environment first, an optional YAML file for the rest.

The same binary runs on a laptop, in Compose and in Kubernetes, so every setting has a
variable; the YAML file (``--config FILE`` or ``LLM_GATEWAY_CONFIG``) carries the same
names in lower case and loses to the environment. A bad value stops start-up with one
line that names the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml


class ConfigError(Exception):
    """A setting is missing or malformed; str() is the one line printed at start-up."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


class Secret:
    """A credential that never shows itself in repr(), str() or a traceback's locals."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


DEFAULT_ENDPOINTS = ("POST /chat/completions", "POST /embeddings", "GET /models")
DEFAULT_VENICE_BASE_URL = "https://api.venice.ai/api/v1"


def host_and_api_root(base_url: str) -> tuple[str, str]:
    """("host" or "host:port", API root path) of a provider base URL."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    return (f"{host}:{parts.port}" if parts.port else host), parts.path.rstrip("/")


# The provider hosts the sidecar intercepts, each with its API root path. Venice's comes
# from the default base URL; the host VENICE_BASE_URL names is always added to these.
DEFAULT_LLM_HOSTS: tuple[tuple[str, str], ...] = (host_and_api_root(DEFAULT_VENICE_BASE_URL),)


class EgressPolicy(StrEnum):
    """What the sidecar does with traffic for a host that is not an LLM host."""

    ALLOW = "allow"  # tunnel it untouched: no TLS interception, the origin's own certificate
    DENY = "deny"  # answer 403: the pod reaches LLM providers and nothing else


class FailurePolicy(StrEnum):
    """What the gateway does when a shared backend (Postgres, Redis) does not answer."""

    FAIL_OPEN = "fail-open"  # keep serving on a local substitute, and say so in /readyz
    FAIL_CLOSED = "fail-closed"  # refuse with 503 until the backend is back


@dataclass(frozen=True, slots=True)
class Settings:
    bind_host: str = "127.0.0.1"
    bind_port: int = 3000
    database_url: str = "sqlite:///./llm-gateway.db"
    redis_url: str | None = None
    venice_api_key: Secret | None = None
    venice_base_url: str = DEFAULT_VENICE_BASE_URL
    otel_service_name: str = "llm-gateway"
    otel_exporter_otlp_endpoint: str | None = None
    request_timeout_seconds: float = 120.0
    request_body_limit_bytes: int = 1_048_576
    venice_max_retries: int = 2
    capture_genai_content: bool = False
    # Auth fails closed by default: a key the store cannot confirm is never guessed valid.
    # fail-open serves keys this process looked up before the outage, never unknown ones.
    auth_failure_policy: FailurePolicy = FailurePolicy.FAIL_CLOSED
    # Limits fail open by default: an outage of Redis should not take the API down;
    # each replica then counts on its own.
    rate_limit_failure_policy: FailurePolicy = FailurePolicy.FAIL_OPEN
    # YAML-only: the provider endpoints the server-held key may be used for, as
    # "METHOD /path" relative to the API root. Nothing else on a provider is reachable.
    allowed_endpoints: tuple[str, ...] = DEFAULT_ENDPOINTS
    # Where the gateway's own routes live in the ASGI adapter (and the sidecar's reverse mode).
    api_prefix: str = "/v1"
    # YAML-only: the LLM hosts the sidecar intercepts ("host" or "host:port") with their
    # API root path; every other host is the egress policy's.
    llm_hosts: tuple[tuple[str, str], ...] = DEFAULT_LLM_HOSTS
    egress_policy: EgressPolicy = EgressPolicy.ALLOW

    def require_provider_key(self) -> Secret:
        if not self.venice_api_key:
            raise ConfigError(
                "VENICE_API_KEY",
                "required for `serve` (the provider key the gateway attaches upstream); "
                "`llm-gateway demo` runs without one against the bundled fake upstream",
            )
        return self.venice_api_key

    def llm_host_roots(self) -> dict[str, str]:
        """Intercepted LLM hosts -> API root path: the configured ones, plus the host
        VENICE_BASE_URL names (routing sends there, so apps may call it too)."""
        roots = dict(self.llm_hosts)
        host, root = host_and_api_root(self.venice_base_url)
        roots.setdefault(host, root)
        return roots


def _parse_bind(variable: str, raw: str) -> tuple[str, int]:
    host, sep, port = raw.rpartition(":")
    if not sep or not host:
        raise ConfigError(variable, f"expected HOST:PORT, got {raw!r}")
    return host.strip("[]"), _parse_int(variable, port, minimum=0, maximum=65535)


def _parse_int(variable: str, raw: str, *, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(variable, f"expected an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(variable, f"must be {bound}, got {value}")
    return value


def _parse_positive_float(variable: str, raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ConfigError(variable, f"expected a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError(variable, f"must be > 0, got {raw!r}")
    return value


def _parse_bool(variable: str, raw: str) -> bool:
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(variable, f"expected true or false, got {raw!r}")


def _parse_url(variable: str, raw: str, schemes: tuple[str, ...]) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in schemes or (parts.scheme not in ("sqlite",) and not parts.netloc):
        raise ConfigError(variable, f"expected a {' or '.join(schemes)} URL, got {raw!r}")
    return raw.rstrip("/") if parts.scheme in ("http", "https") else raw


def _parse_policy(variable: str, raw: str) -> FailurePolicy:
    try:
        return FailurePolicy(str(raw).strip().lower())
    except ValueError:
        choices = " or ".join(p.value for p in FailurePolicy)
        raise ConfigError(variable, f"expected {choices}, got {raw!r}") from None


def _load_yaml(path: str) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError("LLM_GATEWAY_CONFIG", f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("LLM_GATEWAY_CONFIG", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError("LLM_GATEWAY_CONFIG", f"{path} must hold a mapping at the top")
    return loaded


def load_settings(
    environ: Mapping[str, str] | None = None, config_file: str | None = None
) -> Settings:
    """Build Settings from the environment (and the YAML file it or the caller names)."""
    env = os.environ if environ is None else environ
    config_file = config_file or env.get("LLM_GATEWAY_CONFIG") or None
    file_values = _load_yaml(config_file) if config_file else {}

    def raw(variable: str) -> str | None:
        if variable in env:
            return env[variable]
        value = file_values.get(variable.lower())
        return None if value is None else str(value)

    values: dict[str, Any] = {}
    if (bind := raw("BIND_ADDR")) is not None:
        values["bind_host"], values["bind_port"] = _parse_bind("BIND_ADDR", bind)
    if (url := raw("DATABASE_URL")) is not None:
        values["database_url"] = _parse_url(
            "DATABASE_URL", url, ("sqlite", "postgresql", "postgres")
        )
    if redis_url := raw("REDIS_URL"):
        values["redis_url"] = _parse_url("REDIS_URL", redis_url, ("redis", "rediss", "unix"))
    if key := raw("VENICE_API_KEY"):
        if key.strip() != key or any(ch.isspace() for ch in key):
            raise ConfigError("VENICE_API_KEY", "contains white space")
        values["venice_api_key"] = Secret(key)
    if base := raw("VENICE_BASE_URL"):
        values["venice_base_url"] = _parse_url("VENICE_BASE_URL", base, ("http", "https"))
    if name := raw("OTEL_SERVICE_NAME"):
        values["otel_service_name"] = name
    if endpoint := raw("OTEL_EXPORTER_OTLP_ENDPOINT"):
        values["otel_exporter_otlp_endpoint"] = _parse_url(
            "OTEL_EXPORTER_OTLP_ENDPOINT", endpoint, ("http", "https")
        )
    if (timeout := raw("REQUEST_TIMEOUT_SECONDS")) is not None:
        values["request_timeout_seconds"] = _parse_positive_float(
            "REQUEST_TIMEOUT_SECONDS", timeout
        )
    if (limit := raw("REQUEST_BODY_LIMIT_BYTES")) is not None:
        values["request_body_limit_bytes"] = _parse_int(
            "REQUEST_BODY_LIMIT_BYTES", limit, minimum=1
        )
    if (retries := raw("VENICE_MAX_RETRIES")) is not None:
        values["venice_max_retries"] = _parse_int(
            "VENICE_MAX_RETRIES", retries, minimum=0, maximum=10
        )
    if (capture := raw("CAPTURE_GENAI_CONTENT")) is not None:
        values["capture_genai_content"] = _parse_bool("CAPTURE_GENAI_CONTENT", capture)
    for variable in ("AUTH_FAILURE_POLICY", "RATE_LIMIT_FAILURE_POLICY"):
        if (policy := raw(variable)) is not None:
            values[variable.lower()] = _parse_policy(variable, policy)

    if (egress := raw("EGRESS_POLICY")) is not None:
        try:
            values["egress_policy"] = EgressPolicy(str(egress).strip().lower())
        except ValueError:
            raise ConfigError("EGRESS_POLICY", f"expected allow or deny, got {egress!r}") from None
    if "llm_hosts" in file_values:
        values["llm_hosts"] = _parse_llm_hosts(file_values["llm_hosts"])
    if "allowed_endpoints" in file_values:
        values["allowed_endpoints"] = _parse_endpoints(file_values["allowed_endpoints"])
    if "api_prefix" in file_values:
        prefix = str(file_values["api_prefix"])
        if not prefix.startswith("/"):
            raise ConfigError("api_prefix", f"must start with '/', got {prefix!r}")
        values["api_prefix"] = prefix.rstrip("/")
    # A misspelt setting would otherwise be ignored without a word.
    known = {name.lower() for name in _VARIABLES} | _FILE_ONLY
    if unknown := sorted(str(k) for k in file_values if k not in known):
        raise ConfigError("LLM_GATEWAY_CONFIG", f"{config_file}: unknown setting {unknown[0]!r}")
    return Settings(**values)


def _parse_llm_hosts(raw: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError("llm_hosts", "must be a non-empty mapping of host to API root path")
    hosts = []
    for host, root in raw.items():
        name = str(host).strip().lower()
        path = str(root).strip()
        if not name or "/" in name or not path.startswith("/"):
            raise ConfigError("llm_hosts", f"expected 'host[:port]: /api/root', got {host!r}")
        hosts.append((name, path.rstrip("/")))
    return tuple(hosts)


def _parse_endpoints(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("allowed_endpoints", "must be a non-empty list of 'METHOD /path'")
    endpoints = []
    for item in raw:
        method, _, path = str(item).partition(" ")
        if method.upper() not in {"GET", "POST"} or not path.startswith("/"):
            raise ConfigError("allowed_endpoints", f"expected 'METHOD /path', got {item!r}")
        endpoints.append(f"{method.upper()} {path.rstrip('/')}")
    return tuple(endpoints)


_FILE_ONLY = frozenset({"allowed_endpoints", "api_prefix", "llm_hosts"})
_VARIABLES = (
    "BIND_ADDR", "DATABASE_URL", "REDIS_URL", "VENICE_API_KEY", "VENICE_BASE_URL",
    "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "REQUEST_TIMEOUT_SECONDS",
    "REQUEST_BODY_LIMIT_BYTES", "VENICE_MAX_RETRIES", "CAPTURE_GENAI_CONTENT",
    "AUTH_FAILURE_POLICY", "RATE_LIMIT_FAILURE_POLICY", "EGRESS_POLICY",
)
