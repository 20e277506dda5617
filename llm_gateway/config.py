"""Settings: environment first, an optional YAML file for the rest; one row per variable.

The same binary runs on a laptop, in Compose and in Kubernetes, so every setting has a
variable; the YAML file (``--config FILE`` or ``LLM_GATEWAY_CONFIG``) carries the same
names in lower case and loses to the environment. A bad value stops start-up with one
line that names the variable. Adding a setting is adding a row to ``VARIABLES`` (and a
field to ``Settings``); the parsers below are the only place a kind of value is read.
Its size is the concept: every setting's field, parser and row, in one table.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import yaml

from llm_gateway.known_hosts import KnownHostsChange, parse_change
from llm_gateway.redis_urls import SCHEMES as REDIS_SCHEMES
from llm_gateway.redis_urls import masked, parse_redis_url


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

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class HostPort(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: str) -> HostPort:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6), the one rule every listener uses."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return HostPort(host.strip("[]"), int(port))


def host_port_argument(text: str) -> HostPort:
    """``parse_host_port`` as an argparse ``type=``: its message, not argparse's."""
    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


def host_and_api_root(base_url: str) -> tuple[str, str]:
    """("host" or "host:port", API root path) of a provider base URL."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    return (f"{host}:{parts.port}" if parts.port else host), parts.path.rstrip("/")


class EgressPolicy(StrEnum):
    """What the sidecar does with traffic for a host that is not an LLM host."""

    ALLOW = "allow"  # tunnel it untouched: no TLS interception, the origin's own certificate
    DENY = "deny"  # answer 403: the pod reaches LLM providers and nothing else


class FailurePolicy(StrEnum):
    """What the gateway does when a shared backend (Postgres, Redis) does not answer."""

    FAIL_OPEN = "fail-open"  # keep serving on a local substitute, and say so in /readyz
    FAIL_CLOSED = "fail-closed"  # refuse with 503 until the backend is back


class RateLimitAlgorithm(StrEnum):
    """How a key's (or JWT subject's) limit of N requests per W seconds is counted
    (llm_gateway.limits)."""

    # A bucket of the key's burst (default N) refilled at N / W per second: at most
    # burst + N * S / W in any S seconds, so no 2N across a window's edge.
    TOKEN_BUCKET = "token-bucket"
    # Epoch-aligned windows of W seconds, N in each: up to 2N around an edge.
    FIXED_WINDOW = "fixed-window"


DEFAULT_ENDPOINTS = (
    "POST /chat/completions", "POST /embeddings", "GET /models", "GET /models/{id}",
    "POST /messages", "POST /messages/count_tokens",
    "POST /responses", "GET /responses/{id}", "DELETE /responses/{id}",
    "POST /responses/{id}/cancel", "GET /responses/{id}/input_items",
    "POST /responses/input_tokens", "POST /responses/compact",
)
# The keys of the settings file that are routes: read by llm_gateway.routing, and reloaded
# while the gateway runs; every other key is a setting.
ROUTE_KEYS = ("providers", "models", "default_provider", "unknown_models", "routing")
DEFAULT_VENICE_BASE_URL = "https://api.venice.ai/api/v1"
# The provider hosts the sidecar intercepts, each with its API root path. Venice's comes
# from the default base URL; the host VENICE_BASE_URL names is always added to these.
DEFAULT_LLM_HOSTS: tuple[tuple[str, str], ...] = (host_and_api_root(DEFAULT_VENICE_BASE_URL),)


DEFAULT_BIND = HostPort("127.0.0.1", 3000)
DEFAULT_ADMIN_BIND = HostPort("127.0.0.1", 3001)  # admin plane


@dataclass(frozen=True, slots=True)
class Settings:
    bind: HostPort = DEFAULT_BIND
    database_url: str = "sqlite:///./llm-gateway.db"
    redis_url: str | None = None
    # Prefix of every Redis key the gateway writes: deployments (or tests) that share a
    # Redis keep apart by it.
    redis_namespace: str = "llmg"
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
    # Keys' and subjects' request limits as a token bucket, as the design asks: a limit
    # then holds over every span, not only inside windows (fixed-window stays selectable).
    rate_limit_algorithm: RateLimitAlgorithm = RateLimitAlgorithm.TOKEN_BUCKET
    # `serve`'s processes; several share limits, budgets and health (see wiring.py).
    workers: int = 1
    # Shared limits and budgets (Redis, Postgres, the workers' file): how long a lease of
    # room on a busy key far from its limit lasts (llm_gateway.leases); 0: none, every
    # request is decided in the shared store.
    limit_lease_seconds: float = 1.0
    egress_policy: EgressPolicy = EgressPolicy.ALLOW
    # connection limits (serve and the sidecar): how long a client may take to send a
    # request's headers (from connecting, or from the first byte after an idle spell) and
    # then its body, how long a connection may sit idle between requests, and how large a
    # request line plus headers may be. Each holds a socket (a file descriptor) or memory.
    header_read_timeout_seconds: float = 10.0
    body_read_timeout_seconds: float = 30.0
    keepalive_timeout_seconds: float = 30.0
    max_header_bytes: int = 64 * 1024
    # engine limits: what an upstream answer may cost. A whole (non-stream) body past
    # this, counted after decompression, is a 502; a stream event past the other ends the
    # stream with an error event. Generous for real answers, small for a pod's memory.
    upstream_response_limit_bytes: int = 32 * 1024 * 1024
    sse_event_limit_bytes: int = 1024 * 1024
    # accounting: where usage records wait for the database (None: beside the SQLite
    # file, or /var/lib/llm-gateway/spool/<database>), and how many days of them to keep
    # (0: all; on Postgres whole day partitions are dropped).
    usage_spool_dir: str | None = None
    usage_retention_days: int = 0
    # How long the gateway remembers whose a stored response (OpenAI Responses) is.
    responses_retention_days: int = 30
    # observability: how keys are named in metric labels (prefix, name, or none for
    # fleets with very many keys), the access log, process log format, audit capture.
    metrics_key_label: str = "prefix"
    # The bearer token /metrics asks for; None: none, and metrics with key labels are then
    # answered on loopback connections only (telemetry/metrics_access.py).
    metrics_token: Secret | None = None
    access_log: str = "json"
    log_format: str = "text"
    audit_sample_rate: float = 0.01
    audit_errors: bool = False
    # YAML-only: the provider endpoints the server-held key may be used for, as
    # "METHOD /path" relative to the API root. Nothing else on a provider is reachable.
    allowed_endpoints: tuple[str, ...] = DEFAULT_ENDPOINTS
    # YAML-only: where the gateway's own routes live in the ASGI adapter (and the
    # sidecar's reverse mode).
    api_prefix: str = "/v1"
    # YAML-only: the LLM hosts the sidecar intercepts ("host" or "host:port") with their
    # API root path; every other host is the egress policy's.
    llm_hosts: tuple[tuple[str, str], ...] = DEFAULT_LLM_HOSTS
    # YAML-only: changes to the packaged list of known LLM hosts (known_hosts.py), which
    # the sidecar intercepts, and refuses when no provider serves them.
    known_llm_hosts: KnownHostsChange = field(default_factory=KnownHostsChange)
    # The file the settings came from (reloaded for routes), and its route sections as
    # written (llm_gateway.routing reads them).
    config_file: str | None = None
    routes: Mapping[str, Any] = field(default_factory=dict)
    # The environment loaded from (providers' `api_key_env` keys are read from it; None:
    # os.environ). Never printed: it holds keys.
    environ: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    # YAML-only: a seed for the price table (llm_gateway.billing.prices reads it).
    prices: Any = None
    # YAML-only: budget alerts' webhooks and thresholds (llm_gateway.billing.alerts reads
    # it). Never printed: it may hold webhook secrets.
    alerts: Any = field(default=None, repr=False)
    # admin plane: the admin listener (None: off), the key that encrypts provider keys at
    # rest, and JWT callers (a JWKS URL or one PEM public key; issuer and audience).
    admin_bind: HostPort | None = DEFAULT_ADMIN_BIND
    secret_key: Secret | None = None
    jwt_jwks_url: str | None = None
    jwt_public_key: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_subject_claim: str = "sub"
    jwt_models_claim: str | None = None
    # end of admin plane

    def spool_dir(self) -> Path:
        """Where usage records wait for the database: beside the SQLite file, or one
        directory per database under /var/lib/llm-gateway/spool."""
        if self.usage_spool_dir:
            return Path(self.usage_spool_dir)
        if self.database_url.startswith("sqlite:"):
            path = self.database_url.removeprefix("sqlite://")
            path = path.removeprefix("/") if not path.startswith("//") else path[1:]
            if path and path != ":memory:":
                return Path(path).parent / f"{Path(path).stem}-spool"
        digest = hashlib.sha256(self.database_url.encode()).hexdigest()[:12]
        return Path("/var/lib/llm-gateway/spool") / digest

    @property
    def bind_host(self) -> str:
        return self.bind.host

    @property
    def bind_port(self) -> int:
        return self.bind.port

    def require_provider_key(self) -> Secret | None:
        """VENICE_API_KEY, required when the VENICE_* settings are the one provider (no
        ``providers:`` section); with providers, each names its own key."""
        if self.routes.get("providers"):
            return None
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


# ---- parsers: raw text (or a YAML value) in, a value out, ValueError with the problem ----

Parser = Callable[[Any], Any]


def _accepts(kind: str) -> Callable[[Parser], Parser]:
    """Names the values a parser takes, as the configuration reference shows them (next to
    the rule itself, so the page cannot describe another one)."""

    def mark(parse: Parser) -> Parser:
        parse.accepts = kind  # type: ignore[attr-defined]
        return parse

    return mark


def accepted_values(parse: Parser) -> str:
    """What ``parse`` takes, in words (``_accepts``); empty for an unmarked parser."""
    return str(getattr(parse, "accepts", ""))


def _url(*schemes: str) -> Parser:
    @_accepts(" or ".join(f"{scheme}://" for scheme in schemes) + " URL")
    def parse(raw: Any) -> str:
        text = str(raw)
        parts = urlsplit(text)
        # sqlite:///file and unix:///socket name a path, not a host; postgresql:///db may
        # name its hosts in the query (?host=a,b&port=...: libpq's multi-host form).
        where = parts.path if parts.scheme in ("sqlite", "unix") else parts.netloc
        if parts.scheme.startswith("postgres") and "host=" in parts.query:
            where = where or parts.query
        if parts.scheme not in schemes or (parts.scheme != "sqlite" and not where):
            raise ValueError(f"expected a {' or '.join(schemes)} URL, got {masked(text)!r}")
        return text.rstrip("/") if parts.scheme in ("http", "https") else text

    return parse


@_accepts(" or ".join(f"{scheme}://" for scheme in REDIS_SCHEMES) + " URL")
def _redis_url(raw: Any) -> str:
    """One server, a Sentinel-managed primary or a Cluster (llm_gateway.redis_urls: the
    one reading of the forms; its errors mask the password)."""
    parse_redis_url(str(raw))
    return str(raw)


def _integer(minimum: int, maximum: int | None = None) -> Parser:
    @_accepts(f"integer from {minimum} to {maximum}" if maximum is not None
              else f"integer, at least {minimum}")
    def parse(raw: Any) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise ValueError(f"must be {bound}, got {value}")
        return value

    return parse


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its affinity, bounded by the cgroup v2 quota when one
    is set (``cpu.max``: QUOTA PERIOD, a container's CPU limit; rounded down); at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with contextlib.suppress(OSError, ValueError):  # no cgroup v2, or no quota ("max")
        quota, period = cpu_max.read_text().split()[:2]
        cpus = min(cpus or 1, int(quota) // int(period))
    return max(1, cpus or 1)


@_accepts("integer, at least 1, or auto")
def parse_workers(raw: Any) -> int:
    """``auto`` (the usable CPUs) or a count of at least 1."""
    if str(raw).strip().lower() == "auto":
        return usable_cpus()
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"expected a number of processes or auto, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"must be >= 1 (or auto), got {value}")
    return value


@_accepts("seconds (a number > 0)")
def _seconds(raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"must be > 0, got {raw!r}")
    return value


@_accepts("true or false")
def _boolean(raw: Any) -> bool:
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _choice(enum: type[StrEnum]) -> Parser:
    @_accepts(" or ".join(member.value for member in enum))
    def parse(raw: Any) -> StrEnum:
        try:
            return enum(str(raw).strip().lower())
        except ValueError:
            choices = " or ".join(member.value for member in enum)
            raise ValueError(f"expected {choices}, got {raw!r}") from None

    return parse


def _one_of(*choices: str) -> Parser:
    @_accepts(" or ".join(choices))
    def parse(raw: Any) -> str:
        text = str(raw).strip().lower()
        if text not in choices:
            raise ValueError(f"expected {' or '.join(choices)}, got {raw!r}")
        return text

    return parse


def _number_from(low: float, high: float, what: str) -> Parser:
    @_accepts(f"number from {low:g} to {high:g}")
    def parse(raw: Any) -> float:
        try:
            value = float(str(raw).strip())
        except ValueError:
            raise ValueError(f"expected {what}, got {raw!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be from {low:g} to {high:g}, got {raw!r}")
        return value

    return parse


_fraction = _number_from(0, 1, "a number from 0 to 1")


@_accepts("secret text (no white space)")
def _secret(raw: Any) -> Secret:
    text = str(raw)
    if any(ch.isspace() for ch in text):
        raise ValueError("contains white space")
    return Secret(text)


@_accepts("text")
def _text(raw: Any) -> str:
    return str(raw)


@_accepts("path starting with /")
def _api_prefix(raw: Any) -> str:
    prefix = str(raw)
    if not prefix.startswith("/"):
        raise ValueError(f"must start with '/', got {prefix!r}")
    return prefix.rstrip("/")


@_accepts("mapping of host[:port] to API root path")
def _llm_hosts(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError("must be a non-empty mapping of host to API root path")
    hosts = []
    for host, root in raw.items():
        name, path = str(host).strip().lower(), str(root).strip()
        if not name or "/" in name or not path.startswith("/"):
            raise ValueError(f"expected 'host[:port]: /api/root', got {host!r}")
        hosts.append((name, path.rstrip("/")))
    return tuple(hosts)


@_accepts("list of 'METHOD /path'")
def _endpoints(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("must be a non-empty list of 'METHOD /path'")
    endpoints = []
    for item in raw:
        method, _, path = str(item).partition(" ")
        if method.upper() not in {"GET", "POST", "DELETE"} or not path.startswith("/"):
            raise ValueError(f"expected 'METHOD /path', got {item!r}")
        endpoints.append(f"{method.upper()} {path.rstrip('/')}")
    return tuple(endpoints)


# admin plane parsers
@_accepts("HOST:PORT, or off")
def _optional_host_port(raw: Any) -> HostPort | None:
    """``HOST:PORT``, or ``off`` for a listener that is not started."""
    return None if str(raw).strip().lower() == "off" else parse_host_port(raw)


@_accepts("claim name")
def _claim_name(raw: Any) -> str:
    name = str(raw).strip()
    if not name or any(ch.isspace() for ch in name):
        raise ValueError(f"expected a claim name, got {raw!r}")
    return name
# end of admin plane parsers


@_accepts("mapping: provider, model, rates (see prices below)")
def _as_written(raw: Any) -> Any:
    """A section another module reads (``prices:``: llm_gateway.billing.prices)."""
    return raw


@_accepts("mapping: webhooks (a list of {url, secret} or {url, secret_env}), thresholds "
          "(fractions of a budget; default [0.5, 0.8, 1.0])")
def _alerts_as_written(raw: Any) -> Any:
    """``alerts:``, read by llm_gateway.billing.alerts (which checks it at start-up)."""
    return raw


_accepts("HOST:PORT")(parse_host_port)
_accepts("mapping: extra (host pattern: {provider, protocol}), remove (host patterns)")(
    parse_change)


@dataclass(frozen=True, slots=True)
class Variable:
    """One setting: its variable (the YAML key is the same name in lower case), the
    Settings field it fills, its parser and what it means. ``blank_is_unset``: an empty
    value leaves the default (for settings whose default is "none")."""

    name: str
    field: str
    parse: Parser
    blank_is_unset: bool = False
    file_only: bool = False  # a structure, not a string: YAML only
    # What it does, in the configuration reference (docs/reference/configuration.md is
    # generated from these rows: `make docs-reference`).
    meaning: str = ""


VARIABLES: tuple[Variable, ...] = (
    Variable("BIND_ADDR", "bind", parse_host_port,
             meaning="where `serve` listens (`[::1]:PORT` for IPv6)"),
    Variable("DATABASE_URL", "database_url", _url("sqlite", "postgresql", "postgres"),
             meaning="keys, usage records, prices, budgets, admin route changes, stored provider"
             " keys and the audit log; `postgresql://…` for state shared by replicas"),
    Variable("REDIS_URL", "redis_url", _redis_url, blank_is_unset=True,
             meaning="rate limits, budget counters and passive health shared by replicas"
             " (`redis+sentinel://host:26379,host2:26379/service_name` for a Sentinel-managed"
             " primary, `redis+cluster://host:port,...` for a Cluster); unset: each process"
             " keeps its own"),
    Variable("REDIS_NAMESPACE", "redis_namespace", _text, blank_is_unset=True,
             meaning="prefix of every Redis key the gateway writes: deployments sharing one Redis"
             " keep apart by it"),
    Variable("VENICE_API_KEY", "venice_api_key", _secret, blank_is_unset=True,
             meaning="the legacy provider's key, held only by the gateway: required by `serve` and"
             " `sidecar` when the file has no `providers:`"),
    Variable("VENICE_BASE_URL", "venice_base_url", _url("http", "https"), blank_is_unset=True,
             meaning="the legacy provider's API root; the sidecar intercepts its host in any case"),
    Variable("OTEL_SERVICE_NAME", "otel_service_name", _text, blank_is_unset=True,
             meaning="`service.name` of exported spans and metrics"),
    Variable("OTEL_EXPORTER_OTLP_ENDPOINT", "otel_exporter_otlp_endpoint",
             _url("http", "https"), blank_is_unset=True,
             meaning="OTLP/HTTP collector (`http://collector:4318`): spans to `/v1/traces`, GenAI"
             " metrics to `/v1/metrics`; unset: nothing exported"),
    Variable("REQUEST_TIMEOUT_SECONDS", "request_timeout_seconds", _seconds,
             meaning="the legacy provider's first-byte, read and stream-idle timeout (its connect"
             " timeout is 5 s); providers of `providers:` have their own `timeouts`"),
    Variable("REQUEST_BODY_LIMIT_BYTES", "request_body_limit_bytes", _integer(1),
             meaning="the largest request body: 413 `request_too_large` above it"),
    Variable("VENICE_MAX_RETRIES", "venice_max_retries", _integer(0, 10),
             meaning="attempts after the first: `routing.max_attempts` defaults to this plus one,"
             " with or without `providers:`"),
    Variable("CAPTURE_GENAI_CONTENT", "capture_genai_content", _boolean,
             meaning="put the request's messages on spans (`gen_ai.input.messages`) and its body"
             " in access-log captures"),
    Variable("AUTH_FAILURE_POLICY", "auth_failure_policy", _choice(FailurePolicy),
             meaning="key store down: `fail-closed` answers 503 `key_store_unavailable`,"
             " `fail-open` keeps serving keys this process already looked up (never unknown ones)"),
    Variable("RATE_LIMIT_FAILURE_POLICY", "rate_limit_failure_policy", _choice(FailurePolicy),
             meaning="shared limiter or budget counters down: `fail-open` counts in process"
             " meanwhile, `fail-closed` answers 503 `rate_limiter_unavailable`"),
    Variable("RATE_LIMIT_ALGORITHM", "rate_limit_algorithm", _choice(RateLimitAlgorithm),
             meaning="how keys' and JWT subjects' request limits count: `token-bucket` (a key's"
             " burst, default its limit, refilled at limit / window per second: no twice the limit"
             " across a window's edge) or `fixed-window` (epoch-aligned windows)"),
    Variable("EGRESS_POLICY", "egress_policy", _choice(EgressPolicy),
             meaning="sidecar: `allow` tunnels hosts other than the LLM hosts untouched, `deny`"
             " answers them 403 `egress_denied`"),
    Variable("WORKERS", "workers", parse_workers,
             meaning="`serve`'s processes sharing one listening socket (`serve --workers N` wins);"
             " `auto`: the CPUs the process may use (its affinity, bounded by a cgroup v2 quota)"),
    Variable("LIMIT_LEASE_SECONDS", "limit_lease_seconds",
             _number_from(0, 60, "a number of seconds (0: no leases)"),
             meaning="shared limits and budgets: how long a lease lasts (room a busy key far from"
             " its limit takes from Redis, Postgres or the workers' file ahead of time, so that"
             " its requests are decided without a round trip); `0`: no leases, every request asks"
             " the shared store"),
    # connection limits
    Variable("HEADER_READ_TIMEOUT_SECONDS", "header_read_timeout_seconds", _seconds,
             meaning="time to send a request line and headers, from connecting or from the first"
             " byte after an idle spell: 408 `request_timeout` after it"),
    Variable("BODY_READ_TIMEOUT_SECONDS", "body_read_timeout_seconds", _seconds,
             meaning="time to send a body, after its headers: 408 `request_timeout` after it"),
    Variable("KEEPALIVE_TIMEOUT_SECONDS", "keepalive_timeout_seconds", _seconds,
             meaning="how long a connection may sit idle between requests before it is closed"),
    Variable("MAX_HEADER_BYTES", "max_header_bytes", _integer(4096),
             meaning="the largest request line plus headers: 431 `request_header_fields_too_large`"
             " above it"),
    # engine limits
    Variable("UPSTREAM_RESPONSE_LIMIT_BYTES", "upstream_response_limit_bytes", _integer(1024),
             meaning="the largest whole (non-stream) upstream answer, counted after decompression:"
             " 502 `upstream_response_too_large` above it"),
    Variable("SSE_EVENT_LIMIT_BYTES", "sse_event_limit_bytes", _integer(1024),
             meaning="the largest event of an upstream stream: the stream ends with an in-band"
             " `upstream_response_too_large` error above it"),
    # accounting
    Variable("USAGE_SPOOL_DIR", "usage_spool_dir", _text, blank_is_unset=True,
             meaning="where usage records wait for the database; must be writable (else `serve`"
             " and the sidecar refuse to start) and should outlive the process. Unset: beside the"
             " SQLite file (`./llm-gateway-spool` for the default database); for Postgres"
             " `/var/lib/llm-gateway/spool/` and 12 hex digits of the URL's SHA-256"),
    Variable("USAGE_RETENTION_DAYS", "usage_retention_days", _integer(0),
             meaning="the days of usage records kept before today (UTC); older ones are dropped at"
             " start and once a day (Postgres: whole day partitions); `0`: keep all"),
    Variable("RESPONSES_RETENTION_DAYS", "responses_retention_days", _integer(1),
             meaning="how long the gateway remembers whose a stored response (Responses API) is,"
             " and which target made it"),
    # observability
    Variable("METRICS_KEY_LABEL", "metrics_key_label", _one_of("none", "prefix", "name"),
             meaning="how a key is named in metric labels: its prefix, its name, or `none` (the"
             " subject label is then `none` too)"),
    Variable("METRICS_TOKEN", "metrics_token", _secret, blank_is_unset=True,
             meaning="the bearer token `/metrics` asks for on every listener; unset: metrics with"
             " key labels are answered on loopback connections only (403 elsewhere), metrics"
             " without (`METRICS_KEY_LABEL=none`) everywhere"),
    Variable("ACCESS_LOG", "access_log", _one_of("json", "off"),
             meaning="`json`: one JSON line per request on stderr; `off`: none"),
    Variable("LOG_FORMAT", "log_format", _one_of("json", "text"),
             meaning="the process's own log lines (the gateway's, uvicorn's, mitmproxy's)"),
    Variable("AUDIT_SAMPLE_RATE", "audit_sample_rate", _fraction,
             meaning="the share of access-log lines that carry a `capture`"),
    Variable("AUDIT_ERRORS", "audit_errors", _boolean,
             meaning="`true`: every failed request's access-log line carries a `capture` too"),
    Variable("ALLOWED_ENDPOINTS", "allowed_endpoints", _endpoints, file_only=True,
             meaning="the provider endpoints (a method and a path under the API root) the"
             " server-held key may be used for; nothing else on a provider is reachable"),
    Variable("API_PREFIX", "api_prefix", _api_prefix, file_only=True,
             meaning="where the ASGI adapter (and the sidecar's reverse mode) serves the gateway"
             " routes; `/` puts them at the server's root"),
    Variable("LLM_HOSTS", "llm_hosts", _llm_hosts, file_only=True,
             meaning="the hosts the sidecar intercepts, each with its API root path; the host of"
             " `VENICE_BASE_URL` and of every provider is added"),
    Variable("KNOWN_LLM_HOSTS", "known_llm_hosts", parse_change, file_only=True,
             meaning="changes to the packaged list of known LLM hosts (OpenAI, Anthropic, Google,"
             " Azure OpenAI, Bedrock, Mistral...), which the sidecar never tunnels: governed when a"
             " provider's base URL is on the host, else refused 403 `provider_not_configured`;"
             " `extra` adds or replaces entries, `remove` drops packaged ones"),
    Variable("PRICES", "prices", _as_written, file_only=True,
             meaning="a seed for the price table, read at start-up; a price set in the database"
             " for the same provider, model and start wins"),
    Variable("ALERTS", "alerts", _alerts_as_written, file_only=True,
             meaning="budget alerts: each budget's thresholds reached (once per window and"
             " threshold, across replicas) are a `budget_alert` log event, a metric, and a"
             " signed POST to each webhook"),
    # admin plane
    Variable("ADMIN_BIND_ADDR", "admin_bind", _optional_host_port,
             meaning="the admin API, the console and the probes, started by `serve`; `off`: not"
             " started"),
    Variable("LLM_GATEWAY_SECRET_KEY", "secret_key", _secret, blank_is_unset=True,
             meaning="the key provider keys are encrypted under at rest: base64 of 32 bytes, or a"
             " passphrase of at least 32 characters"),
    Variable("JWT_JWKS_URL", "jwt_jwks_url", _url("http", "https"), blank_is_unset=True,
             meaning="JWT callers: the identity provider's JWKS, fetched with a 5 s timeout,"
             " cached for 5 minutes, fetched again for an unknown `kid` (at most every 30 s)"),
    Variable("JWT_PUBLIC_KEY", "jwt_public_key", _text, blank_is_unset=True,
             meaning="JWT callers, instead of a JWKS: one PEM public key, inline or a file's path"),
    Variable("JWT_ISSUER", "jwt_issuer", _text, blank_is_unset=True,
             meaning="the `iss` a JWT must carry (required with `JWT_JWKS_URL` or"
             " `JWT_PUBLIC_KEY`)"),
    Variable("JWT_AUDIENCE", "jwt_audience", _text, blank_is_unset=True,
             meaning="the `aud` a JWT must carry (required with `JWT_JWKS_URL` or"
             " `JWT_PUBLIC_KEY`)"),
    Variable("JWT_SUBJECT_CLAIM", "jwt_subject_claim", _claim_name, blank_is_unset=True,
             meaning="the JWT claim naming the subject"),
    Variable("JWT_MODELS_CLAIM", "jwt_models_claim", _claim_name, blank_is_unset=True,
             meaning="the JWT claim listing the models allowed (a list, or a space-separated"
             " string); unset: every model"),
    # end of admin plane
)
_SETTINGS_FIELDS = {f.name for f in fields(Settings)}
assert all(v.field in _SETTINGS_FIELDS for v in VARIABLES), "a row names no Settings field"


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
    # A misspelt setting would otherwise be ignored without a word.
    known = {variable.name.lower() for variable in VARIABLES} | set(ROUTE_KEYS)
    if unknown := sorted(str(key) for key in file_values if key not in known):
        raise ConfigError("LLM_GATEWAY_CONFIG", f"{config_file}: unknown setting {unknown[0]!r}")
    values: dict[str, Any] = {}
    for variable in VARIABLES:
        key = variable.name.lower()
        if not variable.file_only and variable.name in env:
            raw: Any = env[variable.name]
        elif file_values.get(key) is not None:
            raw = file_values[key]
        else:
            continue
        # A section is named by its YAML key; a value by its variable.
        name = key if variable.file_only else variable.name
        if variable.blank_is_unset and str(raw) == "":
            continue
        try:
            values[variable.field] = variable.parse(raw)
        except ValueError as exc:
            raise ConfigError(name, str(exc)) from None
    routes = {key: file_values[key] for key in ROUTE_KEYS if key in file_values}
    return Settings(**values, config_file=config_file, routes=routes, environ=env)
