"""What an operator reads: counters that equal what was sent (serve and the sidecar),
traces that continue the caller's and reach the provider, and no key or prompt anywhere
in the logs, spans and metrics a run produces."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from llm_gateway.adapters.asgi import create_app
from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.routing_support import provider
from tests.support import (
    BIN,
    create_key,
    free_port,
    roomy_window,
    serve_in_thread,
    stop_process,
    wait_until_up,
)
from tests.test_sidecar import VENICE, ca_dir, sidecar_in_thread  # noqa: F401

PROMPT = "a prompt nobody may read: purple elephants"
ROUTES = {
    "providers": {"venice": provider("REPLACED", profile="venice")},
    "models": {"fast": {"targets": [{"provider": "venice", "model": "llama-3.3-70b"}]},
               "small": {"targets": [{"provider": "venice", "model": "qwen3-4b"}]}},
}


def samples(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return sum(value for (sample, have), value in found.items() if sample == name
               and all((k, v) in have for k, v in labels.items()))


@contextlib.contextmanager
def gateway_for(kind: str, tmp_path: Path, fake_url: str, monkeypatch: Any,
                ca_dir: Path) -> Iterator[tuple[str, str, Any]]:  # noqa: F811
    """(base URL for /v1, URL of /metrics, settings) of serve's app or an in-process
    sidecar (reverse mode) with the routes above."""
    monkeypatch.setenv("ROUTING_TEST_KEY", "sk-fake-upstream")
    routes = json.loads(json.dumps(ROUTES).replace("REPLACED", fake_url))
    settings = make_settings(tmp_path, fake_url, routes=routes, access_log="off")
    gateway = build_gateway(settings, key_cache_seconds=0, backoff_base=0.01)
    if kind == "serve":
        with serve_in_thread(create_app(settings, gateway=gateway)) as url:
            yield url + "/v1", url + "/metrics", settings
    else:
        with sidecar_in_thread(gateway, ca_dir, tmp_path, mode="reverse") as sidecar:
            yield sidecar.proxy + "/v1", sidecar.admin + "/metrics", settings


@pytest.mark.parametrize("kind", ["serve", "sidecar"])
def test_counters_equal_what_was_sent(kind: str, tmp_path: Path, fake: FakeUpstream,
                                      fake_url: str, monkeypatch, ca_dir: Path) -> None:  # noqa: F811  # type: ignore[no-untyped-def]
    with gateway_for(kind, tmp_path, fake_url, monkeypatch, ca_dir) as (base, metrics, settings):
        # An hour's window far from its end: it must not roll over before the third request.
        one, one_key = create_key(settings.database_url, name="one", rate_limit_requests=2,
                                  rate_limit_window_seconds=roomy_window())
        two, two_key = create_key(settings.database_url, name="two")

        def chat(key: str, model: str, **extra: Any) -> httpx.Response:
            return httpx.post(base + "/chat/completions", timeout=10,
                              json={"model": model, "messages": [{"role": "user",
                                                                  "content": PROMPT}], **extra},
                              headers={"authorization": f"Bearer {key}"})

        assert chat(one_key, "fast").status_code == 200
        assert chat(one_key, "small", stream=True).status_code == 200
        assert chat(one_key, "fast").status_code == 429  # its rate limit: 2
        assert chat("llmg_" + "x" * 38, "fast").status_code == 401
        fake.push_fault(Fault(status=500, times=3))
        assert chat(two_key, "small").status_code == 500
        assert chat(two_key, "fast").status_code == 200
        found = samples(httpx.get(metrics).text)
    requests = "llm_gateway_requests_total"
    assert total(found, requests) == 4
    assert total(found, requests, key=one.prefix) == 2
    assert total(found, requests, key=two.prefix, code="upstream_error", status="500") == 1
    assert total(found, requests, model="fast") == 2 and total(found, requests, model="small") == 2
    assert total(found, "llm_gateway_rejections_total", code="rate_limit_exceeded",
                 key=one.prefix) == 1
    assert total(found, "llm_gateway_rejections_total", code="invalid_api_key") == 1
    assert total(found, "llm_gateway_upstream_failures_total", provider="venice",
                 kind="5xx") == 3
    assert total(found, "llm_gateway_time_to_first_chunk_seconds_count") == 1
    assert total(found, "llm_gateway_tokens_total", type="output", model="small") == 64
    assert total(found, "llm_gateway_target_state", provider="venice", model="qwen3-4b",
                 state="degraded") == 1  # three 500s in a row
    assert total(found, "llm_gateway_request_duration_seconds_count") == 4


def test_a_callers_trace_continues_through_the_gateway_to_the_provider(
    tmp_path: Path, fake: FakeUpstream, fake_url: str,
) -> None:
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    settings = make_settings(tmp_path, fake_url, access_log="off")
    gateway = build_gateway(settings, tracer_provider=tracing)
    key = create_key(settings.database_url)[1]
    trace_id, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with serve_in_thread(create_app(settings, gateway=gateway)) as url:
        response = httpx.post(url + "/v1/chat/completions", json={
            "model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}]},
            headers={"authorization": f"Bearer {key}",
                     "traceparent": f"00-{trace_id}-{caller_span}-01"})
        refused = httpx.post(url + "/v1/chat/completions", json={},
                             headers={"traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert response.headers["x-trace-id"] == trace_id == refused.headers["x-trace-id"]
    assert refused.headers["x-request-id"].startswith("req_")
    spans = [span for span in exporter.get_finished_spans()
             if span.context.trace_id == int(trace_id, 16)]
    [client] = [span for span in spans if span.kind is SpanKind.CLIENT]
    servers = [span for span in spans if span.kind is SpanKind.SERVER]
    assert len(servers) == 2  # the refused request's too
    assert all(s.parent is not None and s.parent.span_id == int(caller_span, 16)
               for s in servers)
    assert client.parent is not None
    [server] = [s for s in servers if s.context.span_id == client.parent.span_id]
    sent = fake.requests[0].headers["traceparent"]
    assert sent == f"00-{trace_id}-{server.context.span_id:016x}-01"


def test_nothing_secret_in_logs_spans_or_metrics(tmp_path: Path, fake: FakeUpstream,
                                                 fake_url: str, caplog) -> None:  # type: ignore[no-untyped-def]
    """Every outcome, with every output on: the access log (with sampled capture of
    every request), the process log, spans and metrics hold no key and no prompt."""
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    with tempfile.TemporaryFile() as access:
        settings = make_settings(tmp_path, fake_url, audit_sample_rate=1.0, audit_errors=True)
        gateway = build_gateway(settings, tracer_provider=tracing, access_log_fd=access.fileno())
        key = create_key(settings.database_url, rate_limit_requests=3)[1]
        caplog.set_level(logging.DEBUG)
        with serve_in_thread(create_app(settings, gateway=gateway)) as url:
            body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": PROMPT}]}
            auth = {"authorization": f"Bearer {key}"}
            httpx.post(url + "/v1/chat/completions", json=body, headers=auth)
            httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=auth)
            fake.push_fault(Fault(status=401, body=b'{"error": "key sk-fake-upstream bad"}'))
            httpx.post(url + "/v1/chat/completions", json=body, headers=auth)
            httpx.post(url + "/v1/chat/completions", json=body, headers=auth)  # 429
            wrong = key[:-1] + ("R" if key.endswith("Q") else "Q")  # never the key itself
            httpx.post(url + "/v1/chat/completions", json=body,
                       headers={"authorization": f"Bearer {wrong}"})
            metrics = httpx.get(url + "/metrics").text
        access.seek(0)
        log_lines = access.read().decode()
    assert log_lines.count("\n") == 5 and '"capture"' in log_lines
    everything = "\n".join([
        log_lines, caplog.text, metrics,
        repr([(s.name, dict(s.attributes or {})) for s in exporter.get_finished_spans()]),
    ])
    for secret in (key, "sk-fake-upstream", PROMPT):
        assert secret not in everything, secret


def test_with_log_format_json_every_line_of_serve_is_json(
    tmp_path: Path, fake: FakeUpstream, fake_url: str,
) -> None:
    """uvicorn's own lines (both listeners, start to shutdown), the gateway's and the
    access log: with LOG_FORMAT=json, each line on stderr is one JSON object."""
    database_url = f"sqlite:///{tmp_path / 'logs.db'}"
    key = create_key(database_url)[1]
    port = free_port()
    env = {**os.environ, "LOG_FORMAT": "json", "DATABASE_URL": database_url,
           "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": fake_url,
           "VENICE_MAX_RETRIES": "0", "BIND_ADDR": f"127.0.0.1:{port}",
           "ADMIN_BIND_ADDR": f"127.0.0.1:{free_port()}", "USAGE_SPOOL_DIR": str(tmp_path)}
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen([str(BIN / "llm-gateway"), "serve"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
            body = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}]}
            fake.push_fault(Fault(status=500, message="boom"))
            for authorization in (f"Bearer {key}", f"Bearer {key}", "Bearer nope"):
                httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                           headers={"authorization": authorization})
        finally:
            stop_process(process)
        stderr.seek(0)
        lines = [json.loads(line) for line in stderr.read().decode().splitlines()]
    assert {"uvicorn.error", "llm_gateway"} <= {line.get("logger") for line in lines}
    assert [line["message"] for line in lines if line.get("logger") == "uvicorn.error"].count(
        f"Finished server process [{process.pid}]") == 2  # both listeners, to the end
    assert [line["event"] for line in lines if "event" in line] == [
        "request", "request", "rejected"]
