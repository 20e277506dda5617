"""Operating routes: live changes that fail safe, bad routes at start-up, `routes show`
telling the truth, a 429 from a lone target, provider token windows. Real gateways
(serve's ASGI app in a thread, or real processes) against fake upstreams."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_gateway.admin.service import CLI_ACTOR, AdminService
from llm_gateway.stores import open_store
from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from tests.conftest import make_settings
from tests.routing_support import (
    CHAT,
    PROVIDER_KEY,
    Clock,
    another_fake,
    provider,
    routed_gateway,
    two_targets,
)
from tests.support import BIN, REDIS_URL, free_port, need_service, redis_reachable


def eventually(check: Callable[[], bool], what: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def upstream_of(response: Any) -> str:
    return response.headers["x-llm-gateway-upstream"]


# ---- live changes that fail safe ---------------------------------------------------------

def test_a_bad_change_is_refused_with_one_line_and_the_last_good_routes_keep_serving(
    tmp_path: Path, fake_url: str, monkeypatch, caplog,  # type: ignore[no-untyped-def]
) -> None:
    config = tmp_path / "gateway.yaml"
    routes: dict[str, Any] = {
        "providers": {"a": provider(fake_url), "b": provider(fake_url)},
        "models": {"chat-fast": {"targets": [{"provider": "a", "model": "m1"}]}}}
    config.write_text(yaml.safe_dump(routes))
    with routed_gateway(tmp_path, routes, monkeypatch, config_file=str(config)) as gw:
        key = gw.key(rate_limit_requests=1000)
        source = gw.gateway.routes
        good = {**routes, "models": {"chat-fast": {"targets": [{"provider": "b",
                                                                "model": "m2"}]}}}
        config.write_text(yaml.safe_dump(good))
        gw.gateway.reload_routes()
        eventually(lambda: upstream_of(gw.chat(key)) == "b/m2", "the good edit never took")
        version = source.version
        caplog.set_level(logging.ERROR, logger="llm_gateway.routes")
        unknown_provider = {**good, "models": {"chat-fast": {"targets": [
            {"provider": "nowhere", "model": "m3"}]}}}
        bad_changes = {
            "is not valid YAML": "providers: {a: [\n  - oops\n",
            "must hold a mapping at the top": "- a list\n- of things\n",
            "unknown setting 'colour'": yaml.safe_dump({**good, "colour": "blue"}),
            "'nowhere' is not a provider": yaml.safe_dump(unknown_provider),
            "no route sections any more": "",  # emptied: not the legacy provider
            "no providers: section any more": yaml.safe_dump({"routing": {"max_attempts": 2}}),
            "cannot read": None,  # deleted
        }
        for count, (reason, text) in enumerate(bad_changes.items(), start=1):
            if text is None:
                config.unlink()
            else:
                config.write_text(text)
            gw.gateway.reload_routes()
            eventually(lambda count=count: len(refusals(caplog)) == count,  # type: ignore[misc]
                       f"never refused: {reason}")
            line = refusals(caplog)[-1]
            assert reason in line and "\n" not in line, line
            assert f"still serving version {version}" in line
            assert reason in gw.gateway.routes_view()["refused"]  # type: ignore[operator]
            assert source.version == version
            assert upstream_of(gw.chat(key)) == "b/m2"  # the last good routes
        config.write_text(yaml.safe_dump(routes))
        gw.gateway.reload_routes()
        eventually(lambda: upstream_of(gw.chat(key)) == "a/m1", "the fixed file never took")
        assert source.last_error is None and source.version == version + 1


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "llm_gateway.routes" and record.levelno == logging.ERROR
            and record.getMessage().startswith("routes: refused")]


# ---- bad routes at start-up, and `routes show` ------------------------------------------

def cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    clean = {name: value for name, value in os.environ.items()
             if name not in ("REDIS_URL", "LLM_GATEWAY_CONFIG", "DATABASE_URL")}
    return subprocess.Popen([str(BIN / "llm-gateway"), *args], env={**clean, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_bad_routes_stop_serve_the_sidecar_and_routes_show_with_one_line(
    tmp_path: Path, fake_url: str,
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "providers": {"a": provider(fake_url)},
        "models": {"chat-fast": {"targets": [{"provider": "nowhere", "model": "m"}]}}}))
    env = {"LLM_GATEWAY_CONFIG": str(config), "DATABASE_URL": f"sqlite:///{tmp_path}/gw.db",
           "BIND_ADDR": "127.0.0.1:0", "ADMIN_BIND_ADDR": "off"}
    commands = {
        "serve": ["serve"],
        "sidecar": ["sidecar", "--mode", "reverse", "--listen", f"127.0.0.1:{free_port()}",
                    "--admin", f"127.0.0.1:{free_port()}", "--ca-dir", str(tmp_path / "ca")],
        "routes show": ["routes", "show"],
    }
    processes = {name: cli(args, env) for name, args in commands.items()}  # side by side
    for name, process in processes.items():
        out, err = process.communicate(timeout=60)
        assert process.returncode == 2, (name, out, err)
        assert "Traceback" not in err, (name, err)
        assert err.strip().splitlines()[-1] == (
            "llm-gateway: models.chat-fast.targets[0].provider: 'nowhere' is not a provider"
        ), (name, err)


def test_routes_show_tells_what_the_running_gateways_see(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    need_service("Redis", redis_reachable())
    config = tmp_path / "gateway.yaml"
    with another_fake() as (_, secondary_url):
        routes = two_targets(fake_url, secondary_url)
        config.write_text(yaml.safe_dump(routes))
        with routed_gateway(tmp_path, routes, monkeypatch, config_file=str(config),
                            redis_url=REDIS_URL) as gw:
            key = gw.key(rate_limit_requests=1000)
            # An admin change: the database's version 1, on top of the file.
            changed = {"targets": [
                {"provider": "primary", "model": "llama-3.3-70b"},
                {"provider": "secondary", "model": "qwen3-4b", "priority": 1}],
                "context_window": 100_000}
            settings = make_settings(tmp_path, fake_url, routes=routes)
            asyncio.run(change_model(gw.database_url, settings, "chat-fast", changed))
            gw.gateway.reload_routes()
            eventually(lambda: gw.gateway.routes.origin.endswith("+ db v1"), "no db v1")
            assert gw.gateway.routes.version == 2  # this process's own count
            fake.push_fault(Fault(status=500, times=5))
            for _ in range(5):
                assert upstream_of(gw.chat(key)) == "secondary/qwen3-4b"
            assert gw.gateway.router.health.state("primary/llama-3.3-70b") == "down"
            env = {"LLM_GATEWAY_CONFIG": str(config), "DATABASE_URL": gw.database_url,
                   "ROUTING_TEST_KEY": PROVIDER_KEY,
                   "REDIS_NAMESPACE": gw.gateway.settings.redis_namespace}
            shared = cli(["routes", "show", "--json"], {**env, "REDIS_URL": REDIS_URL})
            alone = cli(["routes", "show"], env)  # side by side
            (out, err), (text, _) = shared.communicate(timeout=60), alone.communicate(timeout=60)
            assert (shared.returncode, alone.returncode) == (0, 0), err
    view = json.loads(out)
    # What the running gateway took, in words every process shares; no count of its own.
    assert view["routes"] == gw.gateway.routes.origin == f"{config} + db v1"
    assert view["digest"] == gw.gateway.routes.digest
    assert view["database_version"] == 1 and "version" not in view
    assert view["models"]["chat-fast"]["source"] == "db v1"
    assert view["providers"]["primary"]["source"] == "file"
    states = {t["provider"]: t["state"] for t in view["models"]["chat-fast"]["targets"]}
    assert states == {"primary": "down", "secondary": "healthy"}  # shared through Redis
    # Without Redis nobody can know: not "healthy".
    assert f"routes {config} + db v1 (digest {gw.gateway.routes.digest};" in text
    assert "health: per gateway process" in text
    assert "-> primary/llama-3.3-70b" in text and "HEALTHY" not in text
    assert [line.split()[-1] for line in text.splitlines() if "->" in line] == ["UNKNOWN"] * 2


async def change_model(database_url: str, settings: Any, name: str,
                       entry: dict[str, Any]) -> None:
    store = open_store(database_url)
    try:
        await store.migrate()
        await AdminService(store, actor=CLI_ACTOR,  # type: ignore[arg-type]
                           settings=settings).change_route("model", name, entry)
    finally:
        await store.close()


# ---- a 429 is back-pressure, not ill health -----------------------------------------------

def test_a_429_from_a_lone_target_reaches_the_caller_and_takes_nothing_down(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    clock = Clock()
    with another_fake() as (secondary, secondary_url):
        routes = two_targets(fake_url, secondary_url)
        routes["default_provider"] = "primary"
        with routed_gateway(tmp_path, routes, monkeypatch, clock=clock) as gw:
            key = gw.key(rate_limit_requests=1000)
            lone = {**CHAT, "model": "llama-3.3-70b"}  # no alias: primary/* alone
            health = gw.gateway.router.health
            for fault, retry_after in (
                (Fault(status=429, shape="openai", message="Rate limit reached"), None),
                (Fault(status=429, retry_after="30"), "30"),  # longer than 20 s: not waited
                (Fault(status=429, headers={"x-ratelimit-reset-requests": "45s"}), "45"),
            ):
                fake.push_fault(fault)
                for body in (lone, {**lone, "stream": True}):
                    seen = len(fake.requests)
                    refused = gw.chat(key, body)
                    assert refused.status_code == 429, refused.text
                    assert set(refused.json()["error"]) >= {"message", "type", "code"}
                    assert refused.headers.get("retry-after") == retry_after
                    assert refused.headers["x-llm-gateway-attempts"] == "1"
                    assert health.state("primary/*") == "healthy"  # not DOWN
                    # In the cooldown the lone target still serves: never 503.
                    assert gw.chat(key, body).status_code == 200
                    assert len(fake.requests) == seen + 2
                    fake.push_fault(fault)
                fake.reset()
            fake.push_fault(Fault(status=429, retry_after="0"))  # short: waited out, again
            waited = gw.chat(key, lone)
            assert (waited.status_code, waited.headers["x-llm-gateway-attempts"]) == (200, "2")

            # With another target, a 429 moves traffic there for the cooldown.
            fake.reset()
            fake.push_fault(Fault(status=429, retry_after="5"))
            assert upstream_of(gw.chat(key)) == "secondary/qwen3-4b"
            assert health.state("primary/llama-3.3-70b") == "healthy"
            for _ in range(3):
                assert upstream_of(gw.chat(key)) == "secondary/qwen3-4b"
            assert len(fake.requests) == 1
            # ... yet it is the last resort, not DOWN: the secondary failing, it serves.
            secondary.push_fault(Fault(status=500))
            assert upstream_of(gw.chat(key)) == "primary/llama-3.3-70b"
            assert upstream_of(gw.chat(key)) == "primary/llama-3.3-70b"  # first again


# ---- provider token windows ---------------------------------------------------------------

def test_a_providers_tokens_per_minute_is_enforced_like_its_requests_per_minute(
    tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    with another_fake() as (secondary, secondary_url):
        routes = {
            "providers": {"p": provider(fake_url, limits={"tokens_per_minute": 120}),
                          "q": provider(secondary_url)},
            "models": {
                "solo": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]},
                "pair": {"targets": [{"provider": "p", "model": "llama-3.3-70b"},
                                     {"provider": "q", "model": "qwen3-4b", "priority": 1}]},
            },
        }
        with routed_gateway(tmp_path, routes, monkeypatch) as gw:
            key = gw.key(rate_limit_requests=1000)
            # The provider's minute is a fixed window: start with most of one left, so
            # the steps below cannot straddle two.
            if (left := 60 - time.time() % 60) < 20:
                time.sleep(left + 0.05)
            short = {"messages": [{"role": "user", "content": "Hello"}]}
            first = gw.chat(key, {**short, "model": "solo"})
            assert first.status_code == 200
            used = first.json()["usage"]["total_tokens"]
            # The window holds what the answer's usage said: a prompt of this estimate fits
            # only if that was counted too.
            prompt = {"messages": [{"role": "user", "content": "x" * (4 * (120 - used))}]}
            assert 10 < used < 100
            assert gw.chat(key, {**prompt, "model": "solo"}).status_code == 200  # not full yet
            full = gw.chat(key, {**short, "model": "solo"})
            assert (full.status_code, full.json()["error"]["code"]) == (
                503, "upstream_overloaded")
            assert len(fake.requests) == 2
            assert upstream_of(gw.chat(key, {**short, "model": "pair"})) == "q/qwen3-4b"
            assert len(secondary.requests) == 1
