"""Routing through the sidecar, both modes: the engine sends every admitted request
(streams included), so failover, error shapes and the idle timeout are serve's; a model
that is no alias goes to the provider whose host the app called; the intercepted hosts
and the routes follow the route file, at once on SIGHUP."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.routing_support import CHAT, PROVIDER_KEY, REFUSING, another_fake, provider, two_targets
from tests.support import BIN, create_key, free_port
from tests.test_sidecar import (  # noqa: F401
    VENICE,
    InProcessSidecar,
    ca_dir,
    running_process,
    sidecar_in_thread,
    trusting,
)

STREAM = {**CHAT, "stream": True}


@contextlib.contextmanager
def routed_sidecar(tmp_path: Path, routes: dict[str, Any], ca_dir: Path, mode: str,  # noqa: F811
                   monkeypatch: Any) -> Iterator[tuple[InProcessSidecar, httpx.Client, str, str]]:
    """A sidecar with these routes; yields it, a client, the base URL the app calls, and
    a gateway key."""
    monkeypatch.setenv("ROUTING_TEST_KEY", PROVIDER_KEY)
    settings = make_settings(tmp_path, REFUSING, routes=routes)
    gateway = build_gateway(settings, key_cache_seconds=0, backoff_base=0.01)
    key = create_key(settings.database_url)[1]
    with sidecar_in_thread(gateway, ca_dir, tmp_path, mode=mode) as sidecar:
        if mode == "regular":
            client, base = sidecar.client(), VENICE
        else:
            client, base = httpx.Client(timeout=10), sidecar.proxy + "/v1"
        with client:
            yield sidecar, client, base, key


@pytest.mark.parametrize("mode", ["regular", "reverse"])
@pytest.mark.parametrize("fault", ["500", "refused", "stall"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_failover_in_the_sidecar(tmp_path: Path, fake: FakeUpstream, fake_url: str,
                                 ca_dir: Path, monkeypatch, mode: str, fault: str,  # noqa: F811
                                 stream: bool) -> None:  # type: ignore[no-untyped-def]
    primary = REFUSING if fault == "refused" else fake_url
    if fault == "500":
        fake.push_fault(Fault(status=500, times=5))
    elif fault == "stall":
        fake.push_fault(Fault(delay=3, times=5))
    with another_fake() as (secondary, secondary_url), routed_sidecar(
        tmp_path, two_targets(primary, secondary_url), ca_dir, mode, monkeypatch,
    ) as (sidecar, client, base, key):
        response = client.post(base + "/chat/completions", json=STREAM if stream else CHAT,
                               headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        assert response.headers["x-llm-gateway-upstream"] == "secondary/qwen3-4b"
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]")
            assert '"usage"' not in response.text  # not asked for: the gateway's alone
        [record] = sidecar.records()
        assert (record.status, record.provider, record.attempts) == (200, "secondary", 2)
        assert len(secondary.requests) == 1


@pytest.mark.parametrize("mode", ["regular", "reverse"])
@pytest.mark.parametrize("fault", ["stall", "cut"])
def test_a_stream_that_stalls_or_is_cut_in_the_sidecar(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, ca_dir: Path, monkeypatch,  # noqa: F811  # type: ignore[no-untyped-def]
    mode: str, fault: str,
) -> None:
    alone = {"providers": {"p": provider(fake_url)},
             "models": {"chat-fast": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]}}}
    headers = {"x-fake-chunks": "4", "x-fake-chunk-delay-ms": "2500"} if fault == "stall" else {}
    if fault == "cut":
        fake.push_fault(Fault(cut_after_chunks=2))
    with routed_sidecar(tmp_path, alone, ca_dir, mode, monkeypatch) as (sidecar, client, base,
                                                                        key):
        response = client.post(base + "/chat/completions", json=STREAM,
                               headers={"authorization": f"Bearer {key}", **headers})
        *_, error, done = response.text.strip().split("\n\n")
        expected = "upstream_timeout" if fault == "stall" else "upstream_stream_interrupted"
        assert json.loads(error.removeprefix("data: "))["error"]["code"] == expected
        assert done == "data: [DONE]"
        [record] = sidecar.records()
        assert (record.status, record.error_code) == (200, expected)


def test_the_host_called_picks_the_provider_and_sighup_reloads_routes_and_hosts(
    tmp_path: Path, fake: FakeUpstream, fake_url: str,
) -> None:
    """A real sidecar process, regular mode: the app calls each provider's own host."""
    config = tmp_path / "gateway.yaml"
    port, admin = free_port(), free_port()
    bundle = tmp_path / "ca-bundle.pem"
    command = [str(BIN / "llm-gateway"), "sidecar", "--listen", f"127.0.0.1:{port}",
               "--admin", f"127.0.0.1:{admin}", "--ca-dir", str(tmp_path / "ca"),
               "--ca-bundle-out", str(bundle)]
    env = {"LLM_GATEWAY_CONFIG": str(config), "ROUTING_TEST_KEY": PROVIDER_KEY,
           "DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}"}
    log = tmp_path / "sidecar.log"
    with another_fake() as (b, b_url), another_fake() as (c, c_url):
        routes: dict[str, Any] = {
            "providers": {"a": provider(fake_url), "b": provider(b_url)},
            "default_provider": "a",
            "models": {"chat-fast": {"targets": [{"provider": "b", "model": "qwen3-4b"}]}},
        }
        config.write_text(yaml.safe_dump(routes))
        key = create_key(env["DATABASE_URL"])[1]
        with running_process(command, env, log, f"http://127.0.0.1:{admin}/readyz") as process, \
                httpx.Client(proxy=f"http://127.0.0.1:{port}", verify=trusting(bundle),
                             timeout=10) as client:

            def chat(base_url: str, model: str = "llama-3.3-70b") -> httpx.Response:
                return client.post(base_url.replace("http:", "https:") + "/chat/completions",
                                   json={**CHAT, "model": model},
                                   headers={"authorization": f"Bearer {key}"})

            assert chat(b_url).headers["x-llm-gateway-upstream"] == "b/llama-3.3-70b"
            assert chat(fake_url).headers["x-llm-gateway-upstream"] == "a/llama-3.3-70b"
            assert chat(fake_url, "chat-fast").headers["x-llm-gateway-upstream"] == \
                "b/qwen3-4b"  # an alias routes as configured, whatever the host
            assert (len(fake.requests), len(b.requests)) == (1, 2)
            with pytest.raises(httpx.HTTPError):  # not a provider's host: not intercepted
                chat(c_url)

            routes["providers"]["c"] = provider(c_url)
            config.write_text(yaml.safe_dump(routes))
            process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while (answer := _try(chat, c_url)) is None:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert answer.headers["x-llm-gateway-upstream"] == "c/llama-3.3-70b"
            assert len(c.requests) == 1 and c.requests[0].headers["authorization"] == \
                f"Bearer {PROVIDER_KEY}"

            config.write_text("providers: [not, a, mapping]\n")
            process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "routes: refused" not in log.read_text():
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert chat(c_url).status_code == 200  # the last good routes, still serving
            assert process.poll() is None
        assert "SIGHUP: reading the routes again" in log.read_text()


def _try(chat: Any, base_url: str) -> httpx.Response | None:
    try:
        answer = chat(base_url)
    except httpx.HTTPError:
        return None
    return answer if answer.status_code == 200 else None
