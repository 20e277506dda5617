"""Traces that join up: the caller's W3C ``traceparent`` is continued, every request gets
an HTTP server span (rejections included), an admitted one a GenAI client span as its
child, and the upstream request carries the gateway's ``traceparent``.

Without a recording tracer provider (no OTLP endpoint) nothing is exported, but every
request still has a trace id: the caller's, or a new random one, for ``x-trace-id`` and
for the provider. Span attributes follow the OpenTelemetry GenAI semantic conventions
(genai.py: the operation, the provider from its profile); usage includes the prompt cache's
reads and writes and the reasoning tokens, each part of the input or output count.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from llm_gateway.billing.records import UsageRecord
from llm_gateway.config import Settings
from llm_gateway.errors import Rejection
from llm_gateway.extras import need
from llm_gateway.telemetry.genai import openai_api_type, operation_name, provider_name

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_random = random.Random()  # trace ids need to be unique, not secret: no syscall each


def tracer_provider_from_settings(settings: Settings) -> TracerProvider | None:
    """An OTLP/HTTP exporting provider when OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    if not settings.otel_exporter_otlp_endpoint:
        return None
    need("otel")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create({"service.name": settings.otel_service_name})
    provider = TracerProvider(resource=resource)
    endpoint = settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


@dataclass(slots=True)
class Trace:
    """One request's place in its trace: ids for the headers, and the server span when
    one is recorded."""

    trace_id: str  # 32 hex digits
    span_id: str  # the gateway's span, the provider's parent
    span: Span | None
    sampled: bool = True

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parent_of(traceparent: str | None) -> SpanContext | None:
    if not traceparent:
        return None
    match = _TRACEPARENT.match(traceparent.strip().lower())
    if match is None or match.group(1) == "0" * 32 or match.group(2) == "0" * 16:
        return None
    return SpanContext(int(match.group(1), 16), int(match.group(2), 16), is_remote=True,
                       trace_flags=TraceFlags(int(match.group(3), 16)))


class Tracing:
    def __init__(self, provider: trace.TracerProvider | None, capture_content: bool) -> None:
        chosen = provider or trace.get_tracer_provider()
        self._tracer = chosen.get_tracer("llm_gateway")
        # Spans cost CPU on every request: made only when something records them.
        self._recording = isinstance(chosen, TracerProvider)
        self._capture_content = capture_content

    def begin(self, method: str, path: str, traceparent: str | None) -> Trace:
        parent = parent_of(traceparent)
        if self._recording:
            context = trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None
            span = self._tracer.start_span(
                f"{method} {path}", kind=SpanKind.SERVER, context=context,
                attributes={"http.request.method": method, "url.path": path})
            own = span.get_span_context()
            return Trace(f"{own.trace_id:032x}", f"{own.span_id:016x}",
                         span if span.is_recording() else None, own.trace_flags.sampled)
        # Nothing recorded here: the caller's trace, or a new one, still names the request.
        trace_id = f"{parent.trace_id:032x}" if parent else f"{_random.getrandbits(128):032x}"
        return Trace(trace_id, f"{_random.getrandbits(64):016x}", None,
                     parent.trace_flags.sampled if parent else True)

    def rejected(self, current: Trace, rejection: Rejection, protocol: str) -> None:
        span = current.span
        if span is None:
            return
        span.set_attribute("llm_gateway.protocol", protocol)
        span.set_attribute("http.response.status_code", rejection.status)
        span.set_attribute("error.type", rejection.code)
        span.set_status(Status(StatusCode.ERROR, rejection.code))
        span.end()

    def finished(self, current: Trace, record: UsageRecord, exchange: Any) -> None:
        server = current.span
        if server is None:
            return
        start_ns = int(record.started_at * 1e9)
        end_ns = start_ns + int(record.duration_ms * 1e6)
        operation = operation_name(record.endpoint)
        name = f"{operation} {record.model}" if record.model else operation
        client = self._tracer.start_span(name, kind=SpanKind.CLIENT, start_time=start_ns,
                                         context=trace.set_span_in_context(server))
        client.set_attributes(self._attributes(record, exchange, operation))  # type: ignore[arg-type]
        server.set_attribute("http.response.status_code", record.status)
        server.set_attribute("llm_gateway.protocol", record.protocol)
        if record.error_code:
            for span in (client, server):
                span.set_attribute("error.type", record.error_code)
                span.set_status(Status(StatusCode.ERROR, record.error_code))
        client.end(end_ns)
        server.end(max(end_ns, time.time_ns()))

    def _attributes(self, record: UsageRecord, exchange: Any,
                    operation: str) -> dict[str, object]:
        provider = provider_name(exchange.profile.name)
        attributes: dict[str, object] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            "gen_ai.request.stream": record.stream,
            "server.address": exchange.server_address,
            "http.response.status_code": record.status,
            "llm_gateway.request_id": record.request_id,
            "llm_gateway.key_prefix": record.key_prefix,
            "llm_gateway.subject_id": record.subject_id,
            "llm_gateway.adapter": record.adapter,
            "llm_gateway.protocol": record.protocol,
            "llm_gateway.attempts": record.attempts,
        }
        first_chunk = record.first_chunk_ms
        optional = {
            "gen_ai.request.model": record.model,
            "gen_ai.response.model": record.upstream_model,
            "gen_ai.response.id": record.response_id,
            "gen_ai.response.finish_reasons": record.finish_reasons or None,
            "gen_ai.response.time_to_first_chunk": (None if first_chunk is None
                                                    else first_chunk / 1000),
            "openai.api.type": openai_api_type(provider, record.protocol),
            "llm_gateway.provider": record.provider or None,
            "llm_gateway.route_target": (f"{record.provider}/{record.upstream_model}"
                                         if record.provider else None),
            "llm_gateway.cost_usd": _number(record.cost_usd),
            "llm_gateway.provider_cost_usd": _number(record.provider_cost_usd),
            "llm_gateway.provider_cost_diem": _number(record.provider_cost_diem),
            "llm_gateway.time_to_first_chunk_ms": first_chunk,
        }
        attributes.update({name: value for name, value in optional.items() if value is not None})
        if record.prompt_tokens or record.completion_tokens:
            # The usage record's counts are the conventions' already: the cache's reads and
            # writes are part of the input tokens, reasoning part of the output tokens.
            attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
            attributes["gen_ai.usage.cache_read.input_tokens"] = record.cache_read_tokens
            attributes["gen_ai.usage.cache_creation.input_tokens"] = record.cache_write_tokens
            if record.reasoning_tokens:
                attributes["gen_ai.usage.reasoning.output_tokens"] = record.reasoning_tokens
        if self._capture_content:
            messages = _input_messages(exchange.request_body)
            if messages is not None:
                attributes["gen_ai.input.messages"] = messages
        return attributes


def _number(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _input_messages(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return None
    messages = payload.get("messages") if isinstance(payload, dict) else None
    return json.dumps(messages) if messages is not None else None
