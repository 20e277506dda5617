"""The OpenTelemetry GenAI client metrics, exported over OTLP when an endpoint is set:
``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``, with the bucket
boundaries the semantic conventions advise."""

from __future__ import annotations

from typing import Any

from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import Settings

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
_OPERATION = {"chat.completions": "chat", "embeddings": "embeddings", "models": "models"}


class GenAIMetrics:
    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter("llm_gateway")
        self._provider = provider
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS))
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS))

    @classmethod
    def from_settings(cls, settings: Settings) -> GenAIMetrics | None:
        if not settings.otel_exporter_otlp_endpoint:
            return None
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        endpoint = settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/metrics"
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint))
        resource = Resource.create({"service.name": settings.otel_service_name})
        return cls(MeterProvider(metric_readers=[reader], resource=resource))

    def finished(self, record: UsageRecord) -> None:
        attributes: dict[str, str] = {
            "gen_ai.operation.name": _OPERATION.get(record.endpoint, record.endpoint),
            "gen_ai.provider.name": record.provider or "none",
        }
        if record.model:
            attributes["gen_ai.request.model"] = record.model
        if record.upstream_model:
            attributes["gen_ai.response.model"] = record.upstream_model
        if record.error_code:
            attributes["error.type"] = record.error_code
        self._duration.record(record.duration_ms / 1000, attributes)
        if record.prompt_tokens:
            self._tokens.record(record.prompt_tokens, {**attributes, "gen_ai.token.type": "input"})
        if record.completion_tokens:
            self._tokens.record(record.completion_tokens,
                                {**attributes, "gen_ai.token.type": "output"})

    def shutdown(self) -> None:
        self._provider.shutdown()
