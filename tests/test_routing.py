"""Many providers behind one name: weighted targets, failover, passive health, bulkheads,
the shared provider key's protection and live route changes, through serve's ASGI app
against fake upstreams the tests start."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from tests.routing_support import (
    CHAT,
    PROVIDER_KEY,
    REFUSING,
    Clock,
    another_fake,
    provider,
    routed_gateway,
    two_targets,
)
from tests.support import TEST_REDIS_URL, need_service, redis_reachable

STREAM = {**CHAT, "stream": True}


def upstream_of(response: httpx.Response) -> str:
    return response.headers["x-llm-gateway-upstream"]


def test_weights_split_2000_requests_70_30(tmp_path: Path, fake_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    routes = {
        "providers": {"a": provider(fake_url), "b": provider(fake_url)},
        "models": {"chat-fast": {"targets": [
            {"provider": "a", "model": "llama-3.3-70b", "weight": 70},
            {"provider": "b", "model": "qwen3-4b", "weight": 30},
        ]}},
    }
    with routed_gateway(tmp_path, routes, monkeypatch) as gw, httpx.Client() as client:
        key = gw.key(rate_limit_requests=10_000)
        counts: collections.Counter[str] = collections.Counter()
        for _ in range(2000):
            response = client.post(gw.url + "/v1/chat/completions", json=CHAT,
                                   headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200
            counts[upstream_of(response)] += 1
    share = counts["a/llama-3.3-70b"] / 2000
    assert abs(share - 0.70) <= 0.04, counts
    assert counts["a/llama-3.3-70b"] + counts["b/qwen3-4b"] == 2000


@pytest.mark.parametrize("fault", ["500", "refused", "stall"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_failover_to_the_secondary(tmp_path: Path, fake: FakeUpstream, fake_url: str,
                                   monkeypatch, fault: str, stream: bool) -> None:  # type: ignore[no-untyped-def]
    primary = REFUSING if fault == "refused" else fake_url
    with another_fake() as (secondary, secondary_url), routed_gateway(
        tmp_path, two_targets(primary, secondary_url), monkeypatch,
    ) as gw:
        if fault == "500":
            fake.push_fault(Fault(status=500, times=5))
        elif fault == "stall":
            fake.push_fault(Fault(delay=3, times=5))  # first_byte is 1 s
        key = gw.key()
        response = gw.chat(key, STREAM if stream else CHAT)
        assert response.status_code == 200, response.text
        assert upstream_of(response) == "secondary/qwen3-4b"
        assert response.headers["x-llm-gateway-attempts"] == "2"
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]")
        [request] = secondary.requests
        assert request.json["model"] == "qwen3-4b"  # the target's name for the alias
        [record] = gw.finished.wait_for(1)
        assert (record.status, record.provider, record.attempts) == (200, "secondary", 2)


def test_the_primary_goes_degraded_then_down_and_its_probes_bring_it_back(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    clock = Clock()
    with another_fake() as (_, secondary_url), routed_gateway(
        tmp_path, two_targets(fake_url, secondary_url), monkeypatch, clock=clock,
    ) as gw:
        key = gw.key(rate_limit_requests=1000)
        states = gw.gateway.router.health
        fake.push_fault(Fault(status=503, times=5))
        for expected in ["healthy", "healthy", "degraded", "degraded", "down"]:
            assert upstream_of(gw.chat(key)) == "secondary/qwen3-4b"
            assert states.state("primary/llama-3.3-70b") == expected
        requests_before = len(fake.requests)
        for _ in range(3):  # DOWN: no traffic at all
            assert upstream_of(gw.chat(key)) == "secondary/qwen3-4b"
        assert len(fake.requests) == requests_before
        clock.now += 61  # the cooldown is over: DEGRADED, and its own traffic is the probe
        assert states.state("primary/llama-3.3-70b") == "degraded"
        for _ in range(3):
            assert upstream_of(gw.chat(key)) == "primary/llama-3.3-70b"
        assert states.state("primary/llama-3.3-70b") == "healthy"
        ready = httpx.get(gw.url + "/readyz").json()
        assert ready["targets"]["primary/llama-3.3-70b"] == "healthy"


def test_two_replicas_share_health_through_redis(tmp_path: Path, fake: FakeUpstream,
                                                  fake_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    need_service("Redis", redis_reachable())
    redis_url = TEST_REDIS_URL or "redis://127.0.0.1:6379/0"
    with another_fake() as (_, secondary_url):
        routes = two_targets(fake_url, secondary_url)
        with routed_gateway(tmp_path, routes, monkeypatch, redis_url=redis_url) as one, \
                routed_gateway(tmp_path, routes, monkeypatch, redis_url=redis_url) as other:
            key = one.key(rate_limit_requests=1000)
            fake.push_fault(Fault(status=500, times=5))
            for _ in range(5):
                assert upstream_of(one.chat(key)) == "secondary/qwen3-4b"
            assert one.gateway.router.health.state("primary/llama-3.3-70b") == "down"
            deadline = time.monotonic() + 5
            while other.gateway.router.health.state("primary/llama-3.3-70b") != "down":
                assert time.monotonic() < deadline, "the other replica never heard"
                time.sleep(0.05)
            seen = len(fake.requests)
            for _ in range(3):
                assert upstream_of(other.chat(key)) == "secondary/qwen3-4b"
            assert len(fake.requests) == seen  # kept off the DOWN target by the other's evidence


def concurrently(url: str, key: str, count: int, headers: dict[str, str]) -> list[httpx.Response]:
    def one(_: int) -> httpx.Response:
        return httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=20,
                          headers={"authorization": f"Bearer {key}", **headers})

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_a_full_bulkhead_sends_the_rest_on_or_answers_503(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    # 2 s per answer: all ten requests must reach the gateway while the first four are still
    # being answered; 0.5 s was too short for ten threads to start on a loaded CI host.
    slow = {"x-fake-chunks": "10", "x-fake-chunk-delay-ms": "200"}
    patient = {"connect": 1, "first_byte": 5, "read": 5, "stream_idle": 1}
    alone = {"providers": {"p": provider(fake_url, max_concurrency=4, timeouts=patient)},
             "models": {"chat-fast": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]}}}
    with routed_gateway(tmp_path, alone, monkeypatch) as gw:
        key = gw.key(rate_limit_requests=1000)
        responses = concurrently(gw.url, key, 10, slow)
        statuses = collections.Counter(response.status_code for response in responses)
        assert statuses == {200: 4, 503: 6}, statuses
        refused = next(r for r in responses if r.status_code == 503)
        assert refused.json()["error"]["code"] == "upstream_overloaded"
        assert fake.max_in_flight == 4
    fake.reset()
    with another_fake() as (secondary, secondary_url):
        routes = two_targets(fake_url, secondary_url)
        routes["providers"]["primary"].update(max_concurrency=4, timeouts=patient)
        routes["providers"]["secondary"]["timeouts"] = patient
        with routed_gateway(tmp_path / "two", routes, monkeypatch) as gw:
            key = gw.key(rate_limit_requests=1000)
            responses = concurrently(gw.url, key, 10, slow)
            assert all(response.status_code == 200 for response in responses)
            assert fake.max_in_flight <= 4 and len(secondary.requests) >= 6


@pytest.mark.parametrize("fault", ["stall", "cut"])
def test_a_stream_that_stalls_or_is_cut_ends_with_an_error_event(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch, fault: str,  # type: ignore[no-untyped-def]
) -> None:
    alone = {"providers": {"p": provider(fake_url)},
             "models": {"chat-fast": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]}}}
    with routed_gateway(tmp_path, alone, monkeypatch) as gw:
        headers = {"x-fake-chunks": "4", "x-fake-chunk-delay-ms": "2500"} if fault == "stall" \
            else {}
        if fault == "cut":
            fake.push_fault(Fault(cut_after_chunks=2))
        response = gw.chat(gw.key(), STREAM, **headers)
        assert response.status_code == 200
        *_, error, done = response.text.strip().split("\n\n")
        code = json.loads(error.removeprefix("data: "))["error"]["code"]
        expected = "upstream_timeout" if fault == "stall" else "upstream_stream_interrupted"
        assert (code, done) == (expected, "data: [DONE]")
        [record] = gw.finished.wait_for(1)
        assert (record.status, record.error_code) == (200, expected)


def test_a_custom_header_provider_gets_its_key_there(
    tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    with another_fake(auth_header="api-key") as (azure, azure_url):
        routes = {"providers": {"azure": provider(azure_url, auth={"header": "api-key"},
                                                  profile="openai",
                                                  headers={"x-team": "platform"})},
                  "models": {"chat-fast": {"targets": [{"provider": "azure",
                                                         "model": "gpt-4o-mini"}]}}}
        with routed_gateway(tmp_path, routes, monkeypatch) as gw:
            key = gw.key()
            assert gw.chat(key).status_code == 200
            [request] = azure.requests
            assert request.headers["api-key"] == "sk-fake-upstream"
            assert "authorization" not in request.headers
            assert request.headers["x-team"] == "platform"
            assert request.headers["user-agent"].startswith("llm-gateway/")
            assert key not in json.dumps(request.headers)


def test_a_live_edit_moves_traffic_and_a_broken_one_is_refused(
    tmp_path: Path, fake_url: str, monkeypatch, caplog,  # type: ignore[no-untyped-def]
) -> None:
    config = tmp_path / "gateway.yaml"
    routes = {"providers": {"a": provider(fake_url), "b": provider(fake_url)},
              "models": {"chat-fast": {"targets": [{"provider": "a", "model": "m1"}]}}}
    config.write_text(yaml.safe_dump(routes))
    with routed_gateway(tmp_path, routes, monkeypatch, config_file=str(config)) as gw:
        key = gw.key()
        assert upstream_of(gw.chat(key)) == "a/m1"
        routes["models"]["chat-fast"]["targets"] = [{"provider": "b", "model": "m2"}]
        config.write_text(yaml.safe_dump(routes))
        gw.gateway.reload_routes()  # what SIGHUP does; the file is also polled every second
        deadline = time.monotonic() + 5
        while upstream_of(gw.chat(key)) != "b/m2":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        version = gw.gateway.router.table.version
        caplog.set_level(logging.ERROR, logger="llm_gateway.routes")
        routes["models"]["chat-fast"]["targets"] = [{"provider": "nowhere", "model": "m3"}]
        config.write_text(yaml.safe_dump(routes))
        gw.gateway.reload_routes()
        deadline = time.monotonic() + 5
        while "refused" not in caplog.text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "'nowhere' is not a provider" in caplog.text
        assert gw.gateway.router.table.version == version
        assert upstream_of(gw.chat(key)) == "b/m2"  # the last good routes keep serving


def test_a_key_whose_requests_the_provider_rejects_is_cut_off_alone(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    routes: dict[str, Any] = {
        "providers": {"venice": provider(fake_url)},
        "routing": {"failed_requests": {"limit": 3, "window_seconds": 30}},
    }
    with routed_gateway(tmp_path, routes, monkeypatch) as gw:
        broken, healthy = gw.key(rate_limit_requests=100), gw.key(rate_limit_requests=100)
        for _ in range(3):  # the provider refuses these: the key spends its budget
            fake.push_fault(Fault(status=400, message="Invalid request"))
            assert gw.chat(broken, {**CHAT, "model": "llama-3.3-70b"}).status_code == 400
        seen = len(fake.requests)
        refused = gw.chat(broken, {**CHAT, "model": "llama-3.3-70b"})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_failed_requests"
        assert len(fake.requests) == seen  # the provider was not contacted
        assert gw.chat(healthy, {**CHAT, "model": "llama-3.3-70b"}).status_code == 200


def test_unknown_models_and_context_windows(tmp_path: Path, fake_url: str,
                                           monkeypatch) -> None:  # type: ignore[no-untyped-def]
    routes = {
        "providers": {"p": provider(fake_url)},
        "models": {"chat-fast": {"context_window": 50, "targets": [
            {"provider": "p", "model": "small", "context_window": 20},
            {"provider": "p", "model": "large", "priority": 1},
        ]}},
        "unknown_models": "reject",
    }
    with routed_gateway(tmp_path, routes, monkeypatch) as gw:
        key = gw.key()
        missing = gw.chat(key, {**CHAT, "model": "gpt-5"})
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")
        long_prompt = {**CHAT, "messages": [{"role": "user", "content": "word " * 30}]}
        assert upstream_of(gw.chat(key, long_prompt)) == "p/large"  # too long for small
        too_long = {**CHAT, "messages": [{"role": "user", "content": "word " * 100}]}
        refused = gw.chat(key, too_long)
        assert (refused.status_code, refused.json()["error"]["code"]) == (
            400, "context_length_exceeded")
        models = httpx.get(gw.url + "/v1/models",
                           headers={"authorization": f"Bearer {key}"}).json()
        assert [m["id"] for m in models["data"]] == ["chat-fast"]  # aliases only


def test_a_caller_cannot_set_what_scopes_the_providers_key(
    tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """The provider's own headers (its organization, say) and its key header are the
    gateway's: a caller's copy of them never reaches the provider, nor do OpenAI's
    organization and project headers, which choose what the server-held key bills."""
    routes = {"providers": {"p": provider("", profile="openai", auth={"header": "x-provider-key"},
                                          headers={"openai-organization": "org-gateway",
                                                   "x-team": "platform"})},
              "models": {"chat-fast": {"targets": [{"provider": "p", "model": "gpt-4o-mini"}]}}}
    with another_fake(auth_header="x-provider-key") as (fake, url):
        routes["providers"]["p"]["base_url"] = url
        with routed_gateway(tmp_path, routes, monkeypatch) as gw:
            answer = gw.chat(gw.key(), {**CHAT, "model": "chat-fast"}, **{
                "openai-organization": "org-caller", "openai-project": "proj-caller",
                "x-team": "caller", "x-provider-key": "sk-callers-own", "x-app": "kept"})
    assert answer.status_code == 200, answer.text
    seen = fake.requests[-1].headers
    assert seen["openai-organization"] == "org-gateway" and seen["x-team"] == "platform"
    assert seen["x-provider-key"] == PROVIDER_KEY
    assert "openai-project" not in seen
    assert seen["x-app"] == "kept"  # the caller's own headers still go
