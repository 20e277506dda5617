"""OpenTelemetry GenAI spans and Prometheus metrics, from the finished usage record.

Telemetry is derived from the same record that metering writes, at finish time, so a
span or a metric can never disagree with what was billed. Spans are created with the
request's real start and end times, which keeps span context off the hot path. Keys
never appear: a span carries the key's id and subject, never the key or its hash.
Prompts appear only when CAPTURE_GENAI_CONTENT is on.
"""

from __future__ import annotations

import json
from typing import Protocol

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.config import Settings
from llm_gateway.errors import Rejection

_OPERATION = {"chat.completions": "chat", "embeddings": "embeddings", "models": "models"}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class SpanSource(Protocol):
    """What a span needs from the finished request beyond its usage record."""

    @property
    def model(self) -> str | None: ...  # as the caller named it
    @property
    def server_address(self) -> str: ...
    @property
    def request_body(self) -> bytes: ...


def tracer_provider_from_settings(settings: Settings) -> TracerProvider | None:
    """An OTLP/HTTP exporting provider when OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    if not settings.otel_exporter_otlp_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create({"service.name": settings.otel_service_name})
    provider = TracerProvider(resource=resource)
    endpoint = settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class Telemetry:
    def __init__(
        self, settings: Settings, tracer_provider: trace.TracerProvider | None = None
    ) -> None:
        self.capture_content = settings.capture_genai_content
        self._owned_provider = tracer_provider is None
        provider = tracer_provider or tracer_provider_from_settings(settings)
        self._provider = provider
        self._tracer = (provider or trace.get_tracer_provider()).get_tracer("llm_gateway")
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["adapter", "endpoint", "model", "status"]
        self.requests = Counter(
            "llm_gateway_requests", "Admitted requests by outcome",
            [*labels, "error_type"], registry=self.registry,
        )
        self.rejections = Counter(
            "llm_gateway_rejections", "Requests the gateway answered itself",
            ["adapter", "status", "code"], registry=self.registry,
        )
        self.tokens = Counter(
            "llm_gateway_tokens", "Tokens metered", ["endpoint", "model", "type"],
            registry=self.registry,
        )
        self.cost = Counter(
            "llm_gateway_cost_usd", "Provider-reported cost in USD", ["model"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "llm_gateway_request_duration_seconds", "Time from admission to finish",
            ["adapter", "endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.first_chunk = Histogram(
            "llm_gateway_time_to_first_chunk_seconds", "Streams: time to the first SSE event",
            ["adapter"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

    def rejected(self, adapter: str, rejection: Rejection) -> None:
        self.rejections.labels(adapter, str(rejection.status), rejection.code).inc()

    def finished(self, record: UsageRecord, exchange: SpanSource) -> None:
        model = record.model or ""
        self.requests.labels(record.adapter, record.endpoint, model, str(record.status),
                             record.error_type or "").inc()
        if record.prompt_tokens:
            self.tokens.labels(record.endpoint, model, "input").inc(record.prompt_tokens)
        if record.completion_tokens:
            self.tokens.labels(record.endpoint, model, "output").inc(record.completion_tokens)
        if record.cost_usd:
            self.cost.labels(model).inc(record.cost_usd)
        self.duration.labels(record.adapter, record.endpoint).observe(record.duration_ms / 1000)
        if record.first_chunk_ms is not None:
            self.first_chunk.labels(record.adapter).observe(record.first_chunk_ms / 1000)
        self._span(record, exchange)

    def _span(self, record: UsageRecord, exchange: SpanSource) -> None:
        operation = _OPERATION.get(record.endpoint, record.endpoint)
        start_ns = int(record.started_at * 1e9)
        end_ns = start_ns + int(record.duration_ms * 1e6)
        name = f"{operation} {exchange.model}" if exchange.model else operation
        span = self._tracer.start_span(name, kind=SpanKind.CLIENT, start_time=start_ns)
        if not span.is_recording():
            span.end(end_ns)
            return
        attributes: dict[str, object] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": record.upstream,
            "server.address": exchange.server_address,
            "http.response.status_code": record.status,
            "llm_gateway.request_id": record.request_id,
            "llm_gateway.key_id": record.key_id,
            "llm_gateway.subject_id": record.subject_id,
            "llm_gateway.adapter": record.adapter,
            "llm_gateway.attempts": record.attempts,
        }
        if exchange.model:
            attributes["gen_ai.request.model"] = exchange.model
        if record.model:
            attributes["gen_ai.response.model"] = record.model
        if record.response_id:
            attributes["gen_ai.response.id"] = record.response_id
        if record.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = record.finish_reasons
        if record.prompt_tokens or record.completion_tokens:
            attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
        if record.cost_usd is not None:
            attributes["llm_gateway.cost_usd"] = record.cost_usd
        if record.first_chunk_ms is not None:
            attributes["llm_gateway.time_to_first_chunk_ms"] = record.first_chunk_ms
        if self.capture_content:
            messages = _input_messages(exchange.request_body)
            if messages is not None:
                attributes["gen_ai.input.messages"] = messages
        span.set_attributes(attributes)  # type: ignore[arg-type]
        if record.error_type:
            span.set_attribute("error.type", record.error_type)
            span.set_status(Status(StatusCode.ERROR, record.error_type))
        span.end(end_ns)

    def metrics(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        if self._owned_provider and isinstance(self._provider, TracerProvider):
            self._provider.shutdown()


def _input_messages(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    messages = payload.get("messages") if isinstance(payload, dict) else None
    return json.dumps(messages) if messages is not None else None
