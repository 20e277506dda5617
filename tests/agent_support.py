"""Gateways in front of the fake Anthropic and OpenAI (Responses) upstreams, on every
surface, with the official SDKs pointed at them: what the agent-protocol tests share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from llm_gateway.adapters.httpx_transport import transport_for
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from llm_gateway.testing.records import RecordedUsage
from tests.support import create_key
from tests.surfaces import Surface, surface

PROVIDER_KEY = "sk-fake-upstream"
CLAUDE = "claude-sonnet-4-5"  # the fake Anthropic's first model
GPT = "gpt-4o-mini"


def agent_routes(anthropic_url: str, openai_url: str) -> dict[str, Any]:
    """Two providers and two aliases, one per protocol: ``claude`` (Messages) and ``gpt``
    (chat and Responses)."""
    return {
        "providers": {
            "anthropic": {"base_url": anthropic_url, "profile": "anthropic",
                          "api_key_env": "AGENT_TEST_KEY"},
            "openai": {"base_url": openai_url, "profile": "openai",
                       "api_key_env": "AGENT_TEST_KEY"},
        },
        "default_provider": "openai",
        "models": {
            "claude": {"targets": [{"provider": "anthropic", "model": CLAUDE}]},
            "gpt": {"targets": [{"provider": "openai", "model": GPT}]},
        },
    }


@dataclass
class AgentSurface:
    """One surface in front of both fakes, and the SDK clients that reach it."""

    surface: Surface
    claude: FakeUpstream
    gpt: FakeUpstream
    finished: RecordedUsage
    claude_url: str
    gpt_url: str
    proxy: str | None = None  # the regular sidecar: the SDKs go through it
    sent: list[str] = field(default_factory=list)  # every request an SDK sent, "METHOD path"

    @property
    def name(self) -> str:
        return self.surface.name

    def key(self, **options: object) -> str:
        return create_key(self.surface.database_url, **options)[1]

    def key_record(self, **options: object) -> tuple[Any, str]:
        return create_key(self.surface.database_url, **options)

    def anthropic(self, key: str, **options: Any) -> anthropic.Anthropic:
        options.setdefault("max_retries", 0)
        return anthropic.Anthropic(api_key=key, base_url=self._anthropic_base(),
                                   http_client=self._client(httpx2, key), **options)

    def async_anthropic(self, key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(api_key=key, max_retries=0,
                                        base_url=self._anthropic_base(),
                                        http_client=self._client(httpx2, key, sync=False))

    def openai(self, key: str, **options: Any) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        base = self.gpt_url if self.proxy else self.surface.base + self.surface.api
        return openai.OpenAI(api_key=key, base_url=base, http_client=self._client(httpx, key),
                             **options)

    def _anthropic_base(self) -> str:
        """The anthropic SDK adds /v1 itself."""
        if self.surface.transport is not None:
            return "http://llm-gateway"
        if self.proxy:
            return self.claude_url.removesuffix("/v1")
        return (self.surface.base + self.surface.api).removesuffix("/v1")

    def _client(self, http: Any, key: str, *, sync: bool = True) -> Any:
        """A client of ``http`` (httpx, httpx2) that reaches the surface and notes each
        request it sends."""
        def note(request: Any) -> None:
            self.sent.append(f"{request.method} {request.url.path}")

        async def note_async(request: Any) -> None:
            note(request)

        options: dict[str, Any] = {"event_hooks": {"request": [note if sync else note_async]}}
        if self.surface.transport is not None:
            options["transport"] = transport_for(http)(self.surface.gateway, key=key)
        elif self.proxy:
            options["proxy"] = self.proxy
        return (http.Client if sync else http.AsyncClient)(**options)


@pytest.fixture(scope="session")
def claude_fake() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="anthropic")) as served:
        yield served


@pytest.fixture(scope="session")
def gpt_fake() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="openai")) as served:
        yield served


@contextlib.contextmanager
def agent_surface(name: str, directory: Path, claude: tuple[FakeUpstream, str],
                  gpt: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch,
                  routes: dict[str, Any] | None = None,
                  **overrides: Any) -> Iterator[AgentSurface]:
    """``routes``: other routes than the two fakes' aliases (agent_routes)."""
    monkeypatch.setenv("AGENT_TEST_KEY", PROVIDER_KEY)
    claude[0].reset()
    gpt[0].reset()
    routes = routes or agent_routes(claude[1], gpt[1])
    overrides.setdefault("redis_url", None)
    overrides.setdefault("database_url", f"sqlite:///{directory / 'gateway.db'}")
    with surface(name, directory / name, gpt[1], directory / "ca", routes=routes,
                 **overrides) as on:
        finished = RecordedUsage()
        on.gateway.add_record_sink(finished)
        proxy = (f"http://{on.proxy[0]}:{on.proxy[1]}" if on.proxy else None)
        yield AgentSurface(on, claude[0], gpt[0], finished, claude[1], gpt[1], proxy)
