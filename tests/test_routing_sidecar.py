"""Routing through the sidecar, both modes: the engine sends every admitted request
(streams included), so failover, error shapes and the idle timeout are serve's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.routing_support import CHAT, PROVIDER_KEY, REFUSING, another_fake, provider, two_targets
from tests.support import create_key
from tests.test_sidecar import VENICE, InProcessSidecar, ca_dir, sidecar_in_thread  # noqa: F401

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
