"""Every signal says which client protocol a request spoke, and the GenAI ones follow the
current OpenTelemetry conventions: through a real gateway (serve's ASGI app on a socket) in
front of the fake Anthropic and OpenAI upstreams, driven by the real anthropic and openai
SDKs, with an in-memory span exporter and metric reader, /metrics and the access log.

The operator names its providers ``claude-eu`` and ``gpt-main``: ``gen_ai.provider.name``
must still be the profile's (``anthropic``, ``openai``), the operator's name being
``llm_gateway.provider`` and the Prometheus ``provider`` label.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from llm_gateway.adapters.asgi import create_app
from llm_gateway.billing.records import UsageRecord
from llm_gateway.providers import PROFILES
from llm_gateway.telemetry.genai import PROTOCOLS, operation_name, provider_name
from llm_gateway.telemetry.otel_metrics import (
    DURATION_BUCKETS,
    FIRST_TOKEN_BUCKETS,
    PER_TOKEN_BUCKETS,
    TOKEN_BUCKETS,
)
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.agent_support import (  # noqa: F401 (fixtures)
    CLAUDE,
    GPT,
    PROVIDER_KEY,
    claude_fake,
    gpt_fake,
)
from tests.conftest import make_settings
from tests.support import create_key, serve_in_thread
from tests.test_observability import CONTRACT

PROMPT = "tell me about the purple elephants of the northern hills in a few short words"


@dataclass
class Run:
    """What one run of the gateway left behind."""

    spans: list[ReadableSpan]
    metrics: dict[str, Any]  # OTLP metric name -> its Metric
    scrape: str  # /metrics
    log: list[dict[str, Any]]  # the access log's lines
    records: dict[str, UsageRecord]  # protocol -> its one usage record


def routes(claude_url: str, gpt_url: str) -> dict[str, Any]:
    return {
        "providers": {
            "claude-eu": {"base_url": claude_url, "profile": "anthropic",
                          "api_key_env": "AGENT_TEST_KEY"},
            "gpt-main": {"base_url": gpt_url, "profile": "openai",
                         "api_key_env": "AGENT_TEST_KEY"},
        },
        "default_provider": "gpt-main",
        "models": {
            "claude": {"targets": [{"provider": "claude-eu", "model": CLAUDE}]},
            "gpt": {"targets": [{"provider": "gpt-main", "model": GPT}]},
        },
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory,
        claude_fake: tuple[FakeUpstream, str],  # noqa: F811 (a fixture)
        gpt_fake: tuple[FakeUpstream, str]) -> Iterator[Run]:  # noqa: F811
    """A streamed Messages request with prompt-cache reads and writes, a streamed Responses
    request with reasoning and a cache read, a chat completion, and a Messages request
    without a key (refused)."""
    directory = tmp_path_factory.mktemp("protocol-telemetry")
    claude_fake[0].reset()
    gpt_fake[0].reset()
    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    log_path = directory / "access.log"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    settings = make_settings(directory, gpt_fake[1], routes=routes(claude_fake[1], gpt_fake[1]),
                             redis_url=None, database_url=f"sqlite:///{directory / 'gw.db'}",
                             environ={**os.environ, "AGENT_TEST_KEY": PROVIDER_KEY})
    gateway = build_gateway(settings, tracer_provider=tracing, meter_provider=meters,
                            access_log_fd=log_fd, key_cache_seconds=0)
    finished = RecordedUsage()
    gateway.add_record_sink(finished)
    key = create_key(settings.database_url)[1]
    try:
        with serve_in_thread(create_app(settings, gateway=gateway)) as url:
            claude = anthropic.Anthropic(api_key=key, base_url=url, max_retries=0)
            with claude.messages.stream(
                model="claude", max_tokens=256, messages=[{"role": "user", "content": PROMPT}],
                extra_headers={"x-fake-cache-read-tokens": "5", "x-fake-cache-write-tokens": "3",
                               "x-fake-chunks": "4"},
            ) as stream:
                assert "".join(stream.text_stream)
            gpt = openai.OpenAI(api_key=key, base_url=url + "/v1", max_retries=0)
            events = list(gpt.responses.create(
                model="gpt", input=PROMPT, stream=True, reasoning={"effort": "low"},
                extra_headers={"x-fake-cached-tokens": "4", "x-fake-chunks": "4"}))
            assert events[-1].type == "response.completed"
            chat = gpt.chat.completions.create(
                model="gpt", messages=[{"role": "user", "content": PROMPT}])
            assert chat.choices[0].message.content
            refused = httpx.post(url + "/v1/messages", json={"model": "claude"},
                                 headers={"anthropic-version": "2023-06-01"})
            assert refused.status_code == 401
            records = finished.wait_for(3)
            scrape = httpx.get(url + "/metrics").text
    finally:
        os.close(log_fd)
    data = reader.get_metrics_data()
    metrics = {metric.name: metric for resource in data.resource_metrics
               for scope in resource.scope_metrics for metric in scope.metrics}
    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    yield Run(list(spans.get_finished_spans()), metrics, scrape, log,
              {record.protocol: record for record in records})
    meters.shutdown()
    tracing.shutdown()


def _client_span(run: Run, protocol: str) -> dict[str, Any]:
    [span] = [span for span in run.spans if span.kind is SpanKind.CLIENT
              and (span.attributes or {}).get("llm_gateway.protocol") == protocol]
    return {"name": span.name, **dict(span.attributes or {})}


def test_the_records_are_what_the_fakes_reported(run: Run) -> None:
    messages, responses = run.records["messages"], run.records["responses"]
    assert messages.stream and messages.first_chunk_ms is not None
    assert (messages.cache_read_tokens, messages.cache_write_tokens) == (5, 3)
    assert responses.stream and responses.first_chunk_ms is not None
    assert responses.cache_read_tokens == 4 and responses.reasoning_tokens > 0
    assert run.records["chat"].stream is False


def test_a_messages_span_follows_the_conventions(run: Run) -> None:
    record = run.records["messages"]
    span = _client_span(run, "messages")
    assert span["name"] == "chat claude"
    assert span["gen_ai.operation.name"] == "chat"
    assert span["gen_ai.provider.name"] == "anthropic"  # the profile's, not "claude-eu"
    assert span["llm_gateway.provider"] == "claude-eu"
    assert span["gen_ai.request.model"] == "claude"
    assert span["gen_ai.response.model"] == CLAUDE
    assert span["gen_ai.request.stream"] is True
    # Input counts every prompt token, the cache's included (as the conventions say).
    assert span["gen_ai.usage.input_tokens"] == record.prompt_tokens >= 8
    assert span["gen_ai.usage.cache_read.input_tokens"] == 5
    assert span["gen_ai.usage.cache_creation.input_tokens"] == 3
    assert span["gen_ai.usage.output_tokens"] == record.completion_tokens
    assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(
        record.first_chunk_ms / 1000)
    assert "openai.api.type" not in span and "gen_ai.system" not in span


def test_a_responses_span_follows_the_conventions(run: Run) -> None:
    record = run.records["responses"]
    span = _client_span(run, "responses")
    assert span["name"] == "chat gpt"
    assert span["gen_ai.operation.name"] == "chat"
    assert span["gen_ai.provider.name"] == "openai"
    assert span["openai.api.type"] == "responses"
    assert span["llm_gateway.provider"] == "gpt-main"
    assert span["gen_ai.response.id"] == record.response_id
    assert span["gen_ai.usage.cache_read.input_tokens"] == 4
    assert span["gen_ai.usage.cache_creation.input_tokens"] == 0
    assert span["gen_ai.usage.reasoning.output_tokens"] == record.reasoning_tokens > 0
    assert span["gen_ai.usage.output_tokens"] == record.completion_tokens
    chat = _client_span(run, "chat")
    assert chat["openai.api.type"] == "chat_completions"
    assert "gen_ai.usage.reasoning.output_tokens" not in chat  # none spent


def test_server_spans_carry_the_protocol_refusals_too(run: Run) -> None:
    servers = [dict(span.attributes or {}) for span in run.spans
               if span.kind is SpanKind.SERVER]
    protocols = sorted(attributes["llm_gateway.protocol"] for attributes in servers)
    assert protocols == ["chat", "messages", "messages", "responses"]
    [refused] = [attributes for attributes in servers
                 if attributes.get("http.response.status_code") == 401]
    assert refused["llm_gateway.protocol"] == "messages"


def _points(run: Run, name: str, unit: str, buckets: tuple[float, ...]) -> list[Any]:
    metric = run.metrics[name]
    assert metric.unit == unit
    points = list(metric.data.data_points)
    for point in points:
        assert tuple(point.explicit_bounds) == tuple(float(b) for b in buckets)
    return points


def _attributes(protocol: str) -> dict[str, str]:
    provider, model, upstream = {"messages": ("anthropic", "claude", CLAUDE),
                                 "responses": ("openai", "gpt", GPT),
                                 "chat": ("openai", "gpt", GPT)}[protocol]
    return {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
            "gen_ai.request.model": model, "gen_ai.response.model": upstream,
            "llm_gateway.protocol": protocol}


@pytest.mark.parametrize("protocol", ["messages", "responses"])
def test_streams_have_the_server_metrics_by_provider_model_and_protocol(
        run: Run, protocol: str) -> None:
    record = run.records[protocol]
    first = {tuple(sorted(point.attributes.items())): point
             for point in _points(run, "gen_ai.server.time_to_first_token", "s",
                                  FIRST_TOKEN_BUCKETS)}
    [point] = [first[tuple(sorted(_attributes(protocol).items()))]]
    assert point.count == 1
    assert point.sum == pytest.approx(record.first_chunk_ms / 1000)
    per_token = {tuple(sorted(point.attributes.items())): point
                 for point in _points(run, "gen_ai.server.time_per_output_token", "s",
                                      PER_TOKEN_BUCKETS)}
    point = per_token[tuple(sorted(_attributes(protocol).items()))]
    assert point.count == 1
    expected = (record.duration_ms - record.first_chunk_ms) / 1000 / (
        record.completion_tokens - 1)
    assert point.sum == pytest.approx(expected)


def test_a_request_that_did_not_stream_has_no_server_metrics(run: Run) -> None:
    for name in ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"):
        assert all(point.attributes["llm_gateway.protocol"] != "chat"
                   for point in run.metrics[name].data.data_points)


def test_the_client_metrics_carry_the_protocol(run: Run) -> None:
    durations = {point.attributes["llm_gateway.protocol"]: point
                 for point in _points(run, "gen_ai.client.operation.duration", "s",
                                      DURATION_BUCKETS)}
    assert set(durations) == {"messages", "responses", "chat"}
    for protocol, point in durations.items():
        assert dict(point.attributes) == _attributes(protocol) and point.count == 1
    tokens = {(point.attributes["llm_gateway.protocol"], point.attributes["gen_ai.token.type"]):
              point.sum for point in _points(run, "gen_ai.client.token.usage", "{token}",
                                             TOKEN_BUCKETS)}
    for protocol, record in run.records.items():
        assert tokens[protocol, "input"] == record.prompt_tokens
        assert tokens[protocol, "output"] == record.completion_tokens
    # The conventions' token types are input and output: the cache's are part of input.
    assert {kind for _, kind in tokens} == {"input", "output"}


def _samples(run: Run, name: str) -> list[tuple[dict[str, str], float]]:
    return [(sample.labels, sample.value)
            for family in text_string_to_metric_families(run.scrape)
            for sample in family.samples if sample.name == name]


def _total(run: Run, name: str, **labels: str) -> float:
    return sum(value for have, value in _samples(run, name)
               if all(have.get(k) == v for k, v in labels.items()))


def test_prometheus_counts_by_protocol_and_token_type(run: Run) -> None:
    requests = "llm_gateway_requests_total"
    assert _total(run, requests, protocol="messages", provider="claude-eu", model="claude") == 1
    assert _total(run, requests, protocol="responses", provider="gpt-main", model="gpt") == 1
    assert _total(run, requests, protocol="chat", provider="gpt-main") == 1
    assert _total(run, "llm_gateway_rejections_total", protocol="messages", status="401") == 1
    tokens = "llm_gateway_tokens_total"
    messages, responses = run.records["messages"], run.records["responses"]
    assert _total(run, tokens, protocol="messages", type="input") == messages.prompt_tokens
    assert _total(run, tokens, protocol="messages", type="cache_read") == 5
    assert _total(run, tokens, protocol="messages", type="cache_write") == 3
    assert _total(run, tokens, protocol="responses", type="cache_read") == 4
    assert _total(run, tokens, protocol="responses", type="reasoning") == (
        responses.reasoning_tokens)
    assert _total(run, tokens, protocol="chat", type="reasoning") == 0  # none: no series
    for protocol in ("messages", "responses"):
        for histogram in ("llm_gateway_time_to_first_chunk_seconds_count",
                          "llm_gateway_time_per_output_token_seconds_count",
                          "llm_gateway_request_duration_seconds_count"):
            assert _total(run, histogram, protocol=protocol) == 1, (histogram, protocol)
    assert _total(run, "llm_gateway_time_to_first_chunk_seconds_count", protocol="chat") == 0


def test_the_gateways_labels_are_the_dashboards_contract(run: Run) -> None:
    """What the dashboard and the rules are checked against (test_observability.CONTRACT)
    is what the gateway exposes, and its protocol label takes only the fixed values."""
    for family in text_string_to_metric_families(run.scrape):
        exposed = family.name + ("_total" if family.type == "counter" else "")
        if exposed not in CONTRACT or not family.samples:
            continue
        kind, labels = CONTRACT[exposed]
        assert family.type == kind
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(labels), (exposed, sample.labels)
            assert sample.labels.get("protocol", "chat") in PROTOCOLS


def test_the_access_log_says_the_protocol(run: Run) -> None:
    requests = {line["protocol"]: line for line in run.log if line["event"] == "request"}
    assert set(requests) == {"messages", "responses", "chat"}
    assert requests["messages"]["cache_read_tokens"] == 5
    assert requests["messages"]["cache_write_tokens"] == 3
    assert requests["responses"]["reasoning_tokens"] == run.records["responses"].reasoning_tokens
    [refused] = [line for line in run.log if line["event"] == "rejected"]
    assert refused["protocol"] == "messages" and refused["path"] == "/messages"


def test_provider_names_come_from_the_profiles() -> None:
    """Bounded by the profiles shipped: the conventions' well-known value where there is one,
    else the profile's own name."""
    names = {profile: provider_name(profile) for profile in PROFILES}
    assert names["anthropic"] == "anthropic" and names["openai"] == "openai"
    assert names["venice"] == "venice" and names["generic"] == "generic"
    assert provider_name("gemini") == "gcp.gemini"
    assert {operation_name(e) for e in ("chat.completions", "messages", "responses")} == {"chat"}
    assert operation_name("embeddings") == "embeddings"
