"""GenAI spans and Prometheus metrics come from the finished request, without keys."""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from asgi_middleware import create_app
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key, gateway_process, serve_in_thread

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "secret prompt"}]}


@pytest.fixture
def traced(tmp_path, fake_url):  # type: ignore[no-untyped-def]
    def start(**overrides: object):  # type: ignore[no-untyped-def]
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        settings = make_settings(tmp_path, fake_url, **overrides)
        gateway = build_gateway(settings, tracer_provider=provider)
        return exporter, gateway, settings

    return start


def test_chat_span_has_genai_attributes_and_no_keys(traced, fake: FakeUpstream) -> None:
    exporter, gateway, settings = traced()
    _, key = create_key(settings.database_url)
    with serve_in_thread(create_app(settings, gateway=gateway)) as url:
        response = httpx.post(url + "/v1/chat/completions", json=CHAT,
                              headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200
        stream = httpx.post(url + "/v1/chat/completions", json={**CHAT, "stream": True},
                            headers={"authorization": f"Bearer {key}"})
        assert stream.status_code == 200
        metrics = httpx.get(url + "/metrics").text
    every_span = exporter.get_finished_spans()
    spans = [s for s in every_span if s.kind is SpanKind.CLIENT]
    servers = [s for s in every_span if s.kind is SpanKind.SERVER]
    assert [s.name for s in spans] == ["chat llama-3.3-70b", "chat llama-3.3-70b"]
    assert [s.name for s in servers] == ["POST /chat/completions"] * 2
    assert spans[0].parent is not None and spans[0].parent.span_id == servers[0].context.span_id
    attributes = dict(spans[0].attributes or {})
    body = response.json()
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "venice"
    assert attributes["gen_ai.request.model"] == "llama-3.3-70b"
    assert attributes["gen_ai.response.id"] == body["id"]
    assert attributes["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    assert tuple(attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    assert "llm_gateway.time_to_first_chunk_ms" in dict(spans[1].attributes or {})
    everything = repr([dict(s.attributes or {}) for s in every_span]) + metrics
    assert key not in everything and "sk-fake-upstream" not in everything
    assert "secret prompt" not in everything  # prompts only with CAPTURE_GENAI_CONTENT
    prefix = key[:12]
    assert (f'llm_gateway_requests_total{{code="",key="{prefix}",model="llama-3.3-70b",'
            f'protocol="chat",provider="venice",status="200",subject="test"}} 2.0') in metrics
    output_tokens = (f'key="{prefix}",model="llama-3.3-70b",protocol="chat",provider="venice",'
                     'subject="test",type="output"')
    assert f"llm_gateway_tokens_total{{{output_tokens}}}" in metrics


def test_prompt_capture_is_opt_in(traced, fake: FakeUpstream) -> None:
    exporter, gateway, settings = traced(capture_genai_content=True)
    _, key = create_key(settings.database_url)
    with serve_in_thread(create_app(settings, gateway=gateway)) as url:
        httpx.post(url + "/v1/chat/completions", json=CHAT,
                   headers={"authorization": f"Bearer {key}"})
    [span] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert "secret prompt" in str((span.attributes or {})["gen_ai.input.messages"])


def test_rejections_and_errors_are_counted(traced, fake: FakeUpstream) -> None:
    exporter, gateway, settings = traced()
    with serve_in_thread(create_app(settings, gateway=gateway)) as url:
        assert httpx.post(url + "/v1/chat/completions", json=CHAT).status_code == 401
        metrics = httpx.get(url + "/metrics").text
    assert ('llm_gateway_rejections_total{code="invalid_api_key",key="none",protocol="chat",'
            'status="401"} 1.0' in metrics)
    [server] = exporter.get_finished_spans()  # a refusal has its server span, no client span
    assert server.kind is SpanKind.SERVER
    assert (server.attributes or {})["error.type"] == "invalid_api_key"


def test_spans_are_exported_over_otlp_http(tmp_path, fake_url, fake: FakeUpstream) -> None:
    """A real `serve` process with OTEL_EXPORTER_OTLP_ENDPOINT posts its spans."""
    received: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    settings = make_settings(tmp_path, fake_url)
    _, key = create_key(settings.database_url)
    env = {"DATABASE_URL": settings.database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url, "OTEL_SERVICE_NAME": "gateway-under-test",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}"}
    try:
        with gateway_process(env) as url:
            response = httpx.post(url + "/v1/chat/completions", json=CHAT,
                                  headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200
        # Shutdown flushes the batch processor.
        exported = b"".join(received)
        assert b"gen_ai.request.model" in exported and b"gateway-under-test" in exported
        assert key.encode() not in exported and b"sk-fake-upstream" not in exported
    finally:
        collector.shutdown()
