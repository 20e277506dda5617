"""The OpenTelemetry GenAI metrics, exported over OTLP when an endpoint is set, with the
bucket boundaries the semantic conventions advise:

- ``gen_ai.client.token.usage`` (``{token}``; ``gen_ai.token.type`` ``input`` or
  ``output``, the conventions' two values: the prompt cache's tokens are part of the input,
  reasoning part of the output) and ``gen_ai.client.operation.duration`` (``s``), for every
  admitted request;
- ``gen_ai.server.time_to_first_token`` and ``gen_ai.server.time_per_output_token`` (``s``),
  for a stream that ended well ("successful responses"): from admission to its first
  event, and the rest of its duration over its output tokens after the first. The gateway
  is the server its callers stream from, so these are what they waited.

Every measurement carries ``gen_ai.operation.name``, ``gen_ai.provider.name`` (the provider's
profile: genai.py), ``gen_ai.request.model`` and ``gen_ai.response.model`` when known, and
``llm_gateway.protocol``; a failed one ``error.type`` (the gateway's code). The model names
are the Prometheus labels' (metrics.Labels): an alias or model of the routes, a name a
provider answered (the first 200), else ``other``, so that a caller cannot grow the series.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import Settings
from llm_gateway.extras import need
from llm_gateway.telemetry.genai import operation_name, protocol_label

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0)
PER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class GenAIMetrics:
    def __init__(self, provider: Any, *, owned: bool = True) -> None:
        meter = provider.get_meter("llm_gateway")
        self._provider = provider
        self._owned = owned  # shut down with the gateway (not a test's or an app's own)
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS))
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS))
        self._first_token = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s",
            description="Time to generate first token for successful responses",
            explicit_bucket_boundaries_advisory=list(FIRST_TOKEN_BUCKETS))
        self._per_token = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s",
            description="Time per output token generated after the first token for "
                        "successful responses",
            explicit_bucket_boundaries_advisory=list(PER_TOKEN_BUCKETS))

    @classmethod
    def from_settings(cls, settings: Settings) -> GenAIMetrics | None:
        if not settings.otel_exporter_otlp_endpoint:
            return None
        need("otel")
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        endpoint = settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/metrics"
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint))
        resource = Resource.create({"service.name": settings.otel_service_name})
        return cls(MeterProvider(metric_readers=[reader], resource=resource))

    def finished(self, record: UsageRecord, *, provider: str, request_model: str,
                 response_model: str | None) -> None:
        """``provider``: ``gen_ai.provider.name``; the models as bounded labels."""
        attributes: dict[str, str] = {
            "gen_ai.operation.name": operation_name(record.endpoint),
            "gen_ai.provider.name": provider,
            "llm_gateway.protocol": protocol_label(record.protocol),
        }
        if record.model:
            attributes["gen_ai.request.model"] = request_model
        if response_model:
            attributes["gen_ai.response.model"] = response_model
        if record.error_code:
            attributes["error.type"] = record.error_code
        self._duration.record(record.duration_ms / 1000, attributes)
        if record.prompt_tokens:
            self._tokens.record(record.prompt_tokens, {**attributes, "gen_ai.token.type": "input"})
        if record.completion_tokens:
            self._tokens.record(record.completion_tokens,
                                {**attributes, "gen_ai.token.type": "output"})
        if record.first_chunk_ms is None or record.error_code or record.status >= 400:
            return
        self._first_token.record(record.first_chunk_ms / 1000, attributes)
        if record.completion_tokens > 1:
            after = max(0.0, record.duration_ms - record.first_chunk_ms) / 1000
            self._per_token.record(after / (record.completion_tokens - 1), attributes)

    def shutdown(self) -> None:
        if self._owned:
            self._provider.shutdown()
