"""The Exchange on its own: fed a status line, chunks or a body, and failures, it makes
exactly one usage record, with what the response said."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

from llm_gateway.billing.metering import UsageRecord
from llm_gateway.config import Secret
from llm_gateway.exchange import Exchange
from llm_gateway.http_types import IncomingRequest
from llm_gateway.keys import new_key_record
from llm_gateway.limits import LimitDecision
from llm_gateway.protocols import OPERATIONS, Endpoint
from llm_gateway.routing.router import Plan
from llm_gateway.routing.table import ModelRoute, ProviderConfig, RouteTable, Target

RECORDED = Path(__file__).parent / "recorded"
CHAT = Endpoint("POST", "/chat/completions", OPERATIONS["POST", "/chat/completions"])
MODELS = Endpoint("GET", "/models", OPERATIONS["GET", "/models"])


def exchange(endpoint: Endpoint = CHAT, *, stream: bool = False, models: tuple[str, ...] = (),
             headers: list[tuple[str, str]] | None = None,
             ) -> tuple[Exchange, list[UsageRecord]]:
    records: list[UsageRecord] = []
    key, _ = new_key_record(name="unit", subject_id="team-a", now=time.time(),
                            allowed_models=models)
    payload = ({"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hi"}],
                "stream": stream} if endpoint.method == "POST" else None)
    body = json.dumps(payload).encode() if payload else b""
    request = IncomingRequest(endpoint.method, endpoint.path, headers or [], body, "unit")
    provider = ProviderConfig("venice", "https://api.venice.ai/api/v1", "venice",
                              api_key=Secret("sk-provider"))
    target = Target("venice", "llama-3.3-70b")
    table = RouteTable({"venice": provider}, {}, "venice")
    plan = Plan(table, ModelRoute("llama-3.3-70b", (target,)), (target,))
    made = Exchange(request, endpoint, key, LimitDecision(True, 60, 59, 30.0), payload, plan,
                    lambda record, _: records.append(record))
    made.begin_attempt(target)
    return made, records


def test_the_upstream_gets_the_provider_key_and_never_the_callers_credentials() -> None:
    made, _ = exchange(headers=[("authorization", "Bearer llmg_caller"), ("cookie", "a=b"),
                                ("x-api-key", "k"), ("x-trace", "1"), ("host", "gw")])
    assert made.upstream_headers()[:3] == [
        ("x-trace", "1"), ("authorization", "Bearer sk-provider"),
        ("accept-encoding", "identity")]
    assert made.upstream_headers()[3][0] == "user-agent"
    assert made.upstream_headers()[3][1].startswith("llm-gateway/")
    assert made.upstream_body() == made.request.body  # nothing to change for this target
    assert made.upstream_url() == "https://api.venice.ai/api/v1/chat/completions"


def test_the_providers_request_id_and_account_are_not_passed_off_as_the_gateways() -> None:
    made, _ = exchange()
    headers = made.on_response_start(200, [
        ("Content-Type", "application/json"), ("X-Request-Id", "req_provider"),
        ("openai-organization", "org-operator"), ("openai-project", "proj_operator"),
        ("openai-processing-ms", "12")])
    assert [v for k, v in headers if k == "x-request-id"] == [made.request_id]
    assert ("x-llm-gateway-upstream-request-id", "req_provider") in headers
    assert not any(k.startswith("openai-org") or k == "openai-project" for k, _ in headers)
    assert ("openai-processing-ms", "12") in headers


def test_a_json_answer_is_recorded_from_its_body() -> None:
    made, records = exchange()
    headers = made.on_response_start(200, [("Content-Type", "application/json"),
                                           ("Content-Length", "9"), ("x-ratelimit-x", "1")])
    assert ("content-length", "9") not in headers and ("x-ratelimit-x", "1") not in headers
    assert ("x-request-id", made.request_id) in headers
    body = (RECORDED / "venice_chat_completion.json").read_bytes()
    assert made.complete_body(body) == body
    record = made.finish()
    assert records == [record] and record is not None
    assert (record.status, record.error_code, record.total_tokens, record.provider_cost_usd) == (
        200, None, 21, Decimal("0.0000336"))
    assert (record.subject_id, record.model, record.finish_reasons) == (
        "team-a", "llama-3.3-70b", ["stop"])


def test_finish_runs_once() -> None:
    made, records = exchange()
    made.on_response_start(200, [])
    made.finish()
    assert made.finish() is None and made.finish(client_disconnected=True) is None
    assert len(records) == 1


def test_an_upstream_error_is_rewritten_and_recorded() -> None:
    made, records = exchange()
    headers = made.on_response_start(401, [("content-type", "text/plain")])
    assert ("content-type", "application/json") in headers
    body = made.complete_body(b'{"error": "Authentication failed"}')
    assert json.loads(body)["error"]["message"] == "Authentication failed"
    made.finish()
    assert (records[0].status, records[0].error_code) == (401, "upstream_error")


def test_a_stream_is_observed_chunk_by_chunk() -> None:
    made, records = exchange(stream=True)
    made.on_response_start(200, [("content-type", "text/event-stream")])
    data = (RECORDED / "venice_stream.sse").read_bytes()
    kept = [made.on_frame(frame + b"\n\n") is not None
            for frame in data.split(b"\n\n") if frame]
    # The usage-only chunk is the gateway's; a client that did not ask never sees it.
    assert kept == [True, True, True, False, True]
    made.finish()
    [record] = records
    assert (record.total_tokens, record.finish_reasons, record.error_code) == (10, ["stop"], None)
    assert record.first_chunk_ms is not None and record.max_gap_ms is not None


def test_a_stream_without_its_end_is_incomplete_and_a_broken_one_keeps_its_status() -> None:
    made, records = exchange(stream=True)
    made.on_response_start(200, [("content-type", "text/event-stream")])
    made.on_frame(b'data: {"id": "x", "choices": []}\n\n')
    made.finish()
    assert (records[0].status, records[0].error_code) == (200, "stream_incomplete")
    broken, records = exchange(stream=True)
    broken.on_response_start(200, [("content-type", "text/event-stream")])
    broken.fail(502, "upstream_stream_interrupted")
    broken.finish()
    assert (records[0].status, records[0].error_code) == (200, "upstream_stream_interrupted")


def test_an_error_event_in_a_stream_is_a_failed_request() -> None:
    made, records = exchange(stream=True)
    made.on_response_start(200, [("content-type", "text/event-stream")])
    made.on_frame(b'data: {"error": "Model overloaded"}\n\ndata: [DONE]\n\n')
    made.finish()
    assert (records[0].status, records[0].error_code) == (200, "upstream_inband_error")


def test_no_answer_at_all_is_a_502_and_a_client_that_left_is_a_499() -> None:
    made, records = exchange()
    made.fail(502, "upstream_unreachable")
    made.finish()
    assert (records[0].status, records[0].error_code) == (502, "upstream_unreachable")
    gone, records = exchange()
    gone.finish(client_disconnected=True)
    assert (records[0].status, records[0].error_code) == (499, "client_disconnected")


def test_the_model_list_shows_only_the_models_a_key_may_use() -> None:
    made, records = exchange(MODELS, models=("llama-3.3-70b",))
    made.on_response_start(200, [("content-type", "application/json")])
    listing = {"object": "list", "data": [{"id": "llama-3.3-70b"}, {"id": "qwen3-4b"}]}
    # (no aliases in this table: the provider's list, filtered)
    shown = json.loads(made.complete_body(json.dumps(listing).encode()))
    assert [m["id"] for m in shown["data"]] == ["llama-3.3-70b"]
    made.finish()
    assert records[0].model is None  # the model list is no answer from a model


def test_the_provider_key_never_reaches_the_client() -> None:
    made, _ = exchange()
    headers = made.on_response_start(401, [("x-echo", "Bearer sk-provider")])
    assert ("x-echo", "Bearer ****") in headers  # a key this short is masked whole
    body = made.complete_body(b'{"error": {"message": "bad key: Bearer sk-provider"}}')
    assert b"sk-provider" not in body and b"Bearer ****" in body
    streaming, _ = exchange(stream=True)
    streaming.on_response_start(200, [("content-type", "text/event-stream")])
    frame = streaming.on_frame(b'data: {"error": "key sk-provider is out of credit"}\n\n')
    assert frame is not None and b"sk-provider" not in frame


def test_a_200_whose_body_is_an_error_is_a_failed_request() -> None:
    made, records = exchange()
    made.on_response_start(200, [("content-type", "application/json")])
    made.complete_body(b'{"error": {"message": "Model overloaded", "type": "server_error"}}')
    made.finish()
    assert (records[0].status, records[0].error_code, records[0].error_message) == (
        200, "upstream_inband_error", "Model overloaded")
