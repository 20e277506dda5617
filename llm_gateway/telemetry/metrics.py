"""Prometheus metrics, with labels only from bounded sets.

A label value never comes from free text in a request: keys are named by their prefix
(or name, or not at all: ``METRICS_KEY_LABEL``), models by the aliases and models the
routes configure (anything else is ``other``), providers by their configured names, codes
by the gateway's own, protocols by the fixed set of client protocols (genai.PROTOCOLS). 2 000
made-up model names are one ``other`` series, not 2 000. Values
are bounded in length too (``LABEL_CHARS``): a longer model name a provider answered is
``other``, a longer subject or key name is cut, so no scrape grows with what callers send.
Histogram buckets follow the OpenTelemetry GenAI advice.

Tokens are counted by ``type``: ``input`` and ``output`` (every token, as billed), and the
parts of them that ``cache_read`` (input read from the provider's prompt cache),
``cache_write`` (input written to it) and ``reasoning`` (output spent reasoning) name; so a sum
over every type counts those twice: sum ``type=~"input|output"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase

from llm_gateway.billing.records import UsageRecord
from llm_gateway.errors import Rejection
from llm_gateway.keys import KeyRecord
from llm_gateway.telemetry.genai import protocol_label
from llm_gateway.tokens import OUTPUT_OVER_CAP

DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
FIRST_CHUNK_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0)
PER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
KEY_LABELS = ("none", "prefix", "name")
# llm_gateway_tokens_total's types: the record's field of each.
TOKEN_TYPES = (("input", "prompt_tokens"), ("output", "completion_tokens"),
               ("cache_read", "cache_read_tokens"), ("cache_write", "cache_write_tokens"),
               ("reasoning", "reasoning_tokens"))
OTHER = "other"


# Model names that are no alias (passthrough) but that a provider answered: the first of
# them become labels, up to this many; 2 000 names a provider refused never do.
LEARNED_MODELS = 200
# The longest label value written; a JWT's subject, say, can be far longer.
LABEL_CHARS = 128


class Labels:
    """Label values from bounded sets (the module docstring)."""

    def __init__(self, key_label: str, known_models: Callable[[], frozenset[str]]) -> None:
        self._key_label = key_label
        self._known_models = known_models
        self._learned: set[str] = set()

    def key(self, key: KeyRecord | None) -> str:
        if key is None or self._key_label == "none":
            return "none"
        return (key.name[:LABEL_CHARS] if self._key_label == "name" else key.prefix) or "none"

    def subject(self, subject: str) -> str:
        return "none" if self._key_label == "none" else subject[:LABEL_CHARS]

    def model(self, model: str | None, answered: bool = False) -> str:
        """``answered``: a provider served this name (a 2xx), so it names a real model."""
        if not model:
            return "none"
        if model in self._learned or model in self._known_models():
            return model
        if answered and len(self._learned) < LEARNED_MODELS and len(model) <= LABEL_CHARS:
            self._learned.add(model)
            return model
        return OTHER


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, labels: Labels) -> None:
        self.labels = labels
        self.requests = Counter(
            "llm_gateway_requests", "Admitted requests, when they finish",
            ["key", "subject", "model", "provider", "protocol", "status", "code"],
            registry=registry)
        self.rejections = Counter(
            "llm_gateway_rejections", "Requests the gateway answered itself",
            ["key", "protocol", "status", "code"], registry=registry)
        self.duration = Histogram(
            "llm_gateway_request_duration_seconds", "From admission to the last byte",
            ["model", "provider", "protocol"], buckets=DURATION_BUCKETS, registry=registry)
        self.first_chunk = Histogram(
            "llm_gateway_time_to_first_chunk_seconds", "Streams: to the first SSE event",
            ["model", "provider", "protocol"], buckets=FIRST_CHUNK_BUCKETS, registry=registry)
        self.per_token = Histogram(
            "llm_gateway_time_per_output_token_seconds",
            "Streams: after the first chunk, per output token", ["model", "provider", "protocol"],
            buckets=PER_TOKEN_BUCKETS, registry=registry)
        self.tokens = Counter(
            "llm_gateway_tokens", "Tokens metered, by type (cache_read, cache_write: part of "
            "input; reasoning: part of output)",
            ["key", "subject", "model", "provider", "protocol", "type"], registry=registry)
        self.cost = Counter(
            "llm_gateway_cost_usd", "USD, priced by the gateway's table",
            ["key", "subject", "model", "provider", "protocol"], registry=registry)
        self.upstream_failures = Counter(
            "llm_gateway_upstream_failures", "Failed attempts at a provider, by kind",
            ["provider", "kind"], registry=registry)
        self.output_over_cap = Counter(
            "llm_gateway_output_over_cap", "Answers past the request's output cap (error "
            "code output_over_cap): streams the gateway ended there, whole answers far above",
            ["provider"], registry=registry)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def finished(self, record: UsageRecord, key: KeyRecord) -> str:
        """Counts the record; returns its model label (the OTLP metrics' model too)."""
        labels = self.labels
        who = (labels.key(key), labels.subject(record.subject_id))
        model = labels.model(record.model, answered=record.status < 400)
        provider = record.provider or "none"
        protocol = protocol_label(record.protocol)
        where = (model, provider, protocol)
        child = self._child
        child(self.requests, (*who, *where, str(record.status),
                              record.error_code or "")).inc()
        child(self.duration, where).observe(record.duration_ms / 1000)
        if record.error_code == OUTPUT_OVER_CAP:
            child(self.output_over_cap, (provider,)).inc()
        for kind, field in TOKEN_TYPES:
            if count := getattr(record, field):
                child(self.tokens, (*who, *where, kind)).inc(count)
        if record.cost_usd:
            child(self.cost, (*who, *where)).inc(float(record.cost_usd))
        if record.first_chunk_ms is not None:
            child(self.first_chunk, where).observe(record.first_chunk_ms / 1000)
            if record.completion_tokens > 1:
                after = (record.duration_ms - record.first_chunk_ms) / 1000
                child(self.per_token, where).observe(
                    max(0.0, after) / (record.completion_tokens - 1))
        return model

    def _child(self, metric: MetricWrapperBase, values: tuple[str, ...]) -> Any:
        """``metric.labels(*values)``, remembered: prometheus_client checks and locks on
        every ``labels`` call, which was most of the cost of counting a request. The label
        sets are bounded (the module docstring), so is this cache."""
        cache_key = (id(metric), values)
        found = self._children.get(cache_key)
        if found is None:
            found = self._children[cache_key] = metric.labels(*values)
        return found

    def rejected(self, rejection: Rejection, key: KeyRecord | None, protocol: str) -> None:
        self.rejections.labels(self.labels.key(key), protocol_label(protocol),
                               str(rejection.status), rejection.code).inc()

    def upstream_failed(self, provider: str, kind: str) -> None:
        self.upstream_failures.labels(provider, kind).inc()


class StateCollector:
    """What is true now rather than counted: each target's health, each provider's
    bulkhead, the usage spool, budgets' use. Read at scrape time from the callables."""

    def __init__(self, *, target_states: Callable[[], Mapping[str, str]],
                 bulkheads: Callable[[], Iterable[tuple[str, int, int]]],
                 spool: Callable[[], tuple[int, int, int, int]],
                 budgets: Callable[[], Iterable[tuple[str, str, str, float]]],
                 leases: Callable[[], Iterable[tuple[str, str, int, int]]] = tuple) -> None:
        self._target_states = target_states
        self._bulkheads = bulkheads
        self._spool = spool
        self._budgets = budgets
        self._leases = leases  # (component, backend, live leases, decisions from them)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        states = GaugeMetricFamily("llm_gateway_target_state",
                                   "Passive health of each routing target (one-hot)",
                                   labels=["provider", "model", "state"])
        for target, current in sorted(self._target_states().items()):
            provider, _, model = target.partition("/")
            for state in ("healthy", "degraded", "down"):
                states.add_metric([provider, model, state], 1.0 if current == state else 0.0)
        in_flight = GaugeMetricFamily("llm_gateway_upstream_in_flight",
                                      "Requests open to each provider now", labels=["provider"])
        limits = GaugeMetricFamily("llm_gateway_upstream_max_concurrency",
                                   "Each provider's bulkhead (0: none)", labels=["provider"])
        for provider, open_now, limit in self._bulkheads():
            in_flight.add_metric([provider], float(open_now))
            limits.add_metric([provider], float(limit))
        yield from (states, in_flight, limits)
        yield from self._spool_metrics()
        budgets = GaugeMetricFamily("llm_gateway_budget_used_ratio",
                                    "Spent (and reserved) over each budget, as last seen",
                                    labels=["scope", "id", "window"])
        for scope, owner, window, ratio in self._budgets():
            budgets.add_metric([scope, owner[:LABEL_CHARS], window], ratio)
        yield budgets
        live = GaugeMetricFamily("llm_gateway_leases",
                                 "Leases this process holds on shared limits now",
                                 labels=["component", "backend"])
        decided = CounterMetricFamily("llm_gateway_lease_decisions",
                                      "Requests decided from a lease, without the backend",
                                      labels=["component", "backend"])
        for component, backend, leases, decisions in self._leases():
            live.add_metric([component, backend], float(leases))
            decided.add_metric([component, backend], float(decisions))
        yield from (live, decided)

    def _spool_metrics(self) -> Iterator[Metric]:
        spooled, replayed, pending, failures = self._spool()
        yield CounterMetricFamily("llm_gateway_usage_spooled",
                                  "Usage records the database could not take at first",
                                  value=spooled)
        yield CounterMetricFamily("llm_gateway_usage_replayed",
                                  "Usage records written from the spool", value=replayed)
        yield GaugeMetricFamily("llm_gateway_usage_spool_pending",
                                "Usage records waiting for the database", value=pending)
        yield CounterMetricFamily("llm_gateway_usage_spool_failures",
                                  "Usage spool lines that could not be written (their records "
                                  "went to the database from memory only)", value=failures)
