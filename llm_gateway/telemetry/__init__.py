"""What an operator sees: Prometheus metrics with bounded labels, OpenTelemetry traces
that join the caller's, one access-log line per request; all from the finished usage
record (and, for a request the gateway refused, from the refusal), so that what is
observed can never disagree with what was billed. Keys never appear; prompts only when
CAPTURE_GENAI_CONTENT is on. Each of them says which client protocol a request spoke
(chat, embeddings, messages, responses, models or other)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import Settings
from llm_gateway.errors import Rejection
from llm_gateway.keys import KeyRecord
from llm_gateway.protocols import protocol_at
from llm_gateway.telemetry.access_log import STDERR, AccessLog
from llm_gateway.telemetry.genai import protocol_label, provider_name
from llm_gateway.telemetry.metrics import GatewayMetrics, Labels, StateCollector
from llm_gateway.telemetry.otel_metrics import GenAIMetrics
from llm_gateway.telemetry.tracing import Trace, Tracing, tracer_provider_from_settings

__all__ = ["StateCollector", "Telemetry", "Trace", "tracer_provider_from_settings"]


class Telemetry:
    def __init__(self, settings: Settings, tracer_provider: trace.TracerProvider | None = None,
                 *, known_models: Callable[[], frozenset[str]] = frozenset,
                 access_log_fd: int = STDERR, meter_provider: Any = None) -> None:
        """``meter_provider``: where the GenAI metrics go instead of OTLP (a test's reader)."""
        self._owned_provider = tracer_provider is None
        provider = tracer_provider or tracer_provider_from_settings(settings)
        self._provider = provider
        self.tracing = Tracing(provider, settings.capture_genai_content)
        self.registry = CollectorRegistry(auto_describe=True)
        self.prometheus = GatewayMetrics(self.registry,
                                         Labels(settings.metrics_key_label, known_models))
        self.access_log = AccessLog(
            enabled=settings.access_log == "json", sample_rate=settings.audit_sample_rate,
            audit_errors=settings.audit_errors, capture_content=settings.capture_genai_content,
            fd=access_log_fd)
        self.genai = (GenAIMetrics(meter_provider, owned=False) if meter_provider is not None
                      else GenAIMetrics.from_settings(settings))

    def watch(self, collector: object) -> None:
        """Also expose ``collector``'s families (state read at scrape time)."""
        self.registry.register(collector)  # type: ignore[arg-type]

    def begin(self, method: str, path: str, traceparent: str | None) -> Trace:
        return self.tracing.begin(method, path, traceparent)

    def rejected(self, current: Trace, rejection: Rejection, *, request_id: str, adapter: str,
                 method: str, path: str, key: KeyRecord | None) -> None:
        chosen = protocol_at(path)  # the protocol whose errors it was answered in
        protocol = protocol_label(chosen.wire or chosen.name)
        self.prometheus.rejected(rejection, key, protocol)
        self.tracing.rejected(current, rejection, protocol)
        self.access_log.rejected(
            request_id=request_id, trace_id=current.trace_id, adapter=adapter, method=method,
            path=path, protocol=protocol, rejection=rejection, key_id=key.id if key else None,
            key_prefix=key.prefix if key else None)

    def finished(self, record: UsageRecord, exchange: Any) -> None:
        model = self.prometheus.finished(record, exchange.key)
        self.tracing.finished(exchange.trace, record, exchange)
        self.access_log.finished(record, exchange.request_body, exchange.response_bytes)
        if self.genai is not None:
            upstream = record.upstream_model
            answered = self.prometheus.labels.model(upstream, answered=record.status < 400)
            self.genai.finished(record, provider=provider_name(exchange.profile.name),
                                request_model=model, response_model=answered if upstream else None)

    def upstream_failed(self, provider: str, kind: str) -> None:
        self.prometheus.upstream_failed(provider, kind)

    def metrics(self) -> tuple[bytes, str]:
        """The Prometheus exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        if self._owned_provider and isinstance(self._provider, TracerProvider):
            self._provider.shutdown()
        if self.genai is not None:
            self.genai.shutdown()
