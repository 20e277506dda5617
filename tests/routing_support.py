"""Gateways with routes in front of several fake upstreams, for the routing tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llm_gateway.adapters.asgi import create_app
from llm_gateway.engine import Gateway
from llm_gateway.keys import KeyRecord
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from llm_gateway.testing.records import RecordedUsage
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import closed_port, create_key, serve_in_thread

CHAT = {"model": "chat-fast", "messages": [{"role": "user", "content": "Hello"}]}
PROVIDER_KEY = "sk-fake-upstream"
# Nothing listens here: connections are refused at once.
REFUSING = f"http://127.0.0.1:{closed_port()}/api/v1"


class Clock:
    """Wall-clock seconds a test moves by hand: passive health's cooldowns."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def provider(base_url: str, **extra: Any) -> dict[str, Any]:
    return {"base_url": base_url, "api_key_env": "ROUTING_TEST_KEY", "profile": "venice",
            "timeouts": {"connect": 1, "first_byte": 1, "read": 5, "stream_idle": 1}, **extra}


def two_targets(primary: str, secondary: str, **routing: Any) -> dict[str, Any]:
    """chat-fast: the primary at priority 0, the secondary only when it cannot serve."""
    return {
        "providers": {"primary": provider(primary), "secondary": provider(secondary)},
        "models": {"chat-fast": {"targets": [
            {"provider": "primary", "model": "llama-3.3-70b"},
            {"provider": "secondary", "model": "qwen3-4b", "priority": 1},
        ]}},
        "routing": {"max_attempts": 3, **routing},
    }


@dataclass
class RoutedGateway:
    url: str
    gateway: Gateway
    database_url: str
    finished: RecordedUsage
    keys: list[str] = field(default_factory=list)

    def key(self, **options: object) -> str:
        return create_key(self.database_url, **options)[1]

    def key_record(self, name: str, **options: object) -> tuple[KeyRecord, str]:
        return create_key(self.database_url, name=name, **options)

    def chat(self, key: str, body: dict[str, Any] | None = None,
             **headers: str) -> httpx.Response:
        return httpx.post(self.url + "/v1/chat/completions", json=body or CHAT, timeout=20,
                          headers={"authorization": f"Bearer {key}", **headers})


@contextlib.contextmanager
def routed_gateway(tmp_path: Path, routes: dict[str, Any], monkeypatch: Any, *,
                   clock: Clock | None = None, **settings: Any) -> Iterator[RoutedGateway]:
    """serve's ASGI app, in a thread, with these routes (provider keys from the
    environment variable the routes name)."""
    monkeypatch.setenv("ROUTING_TEST_KEY", PROVIDER_KEY)
    configured = make_settings(tmp_path, REFUSING, routes=routes, **settings)
    options: dict[str, Any] = {"key_cache_seconds": 0, "backoff_base": 0.01}
    if clock is not None:
        options["health_clock"] = clock
    gateway = build_gateway(configured, **options)
    finished = RecordedUsage()
    gateway.add_record_sink(finished)
    with serve_in_thread(create_app(configured, gateway=gateway)) as url:
        yield RoutedGateway(url, gateway, configured.database_url, finished)


@contextlib.contextmanager
def another_fake(**options: Any) -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(**options)) as running:
        yield running
