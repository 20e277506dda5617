"""Routes through the admin API: providers and model aliases created, edited and deleted
as numbered versions over the file's routes, refused with the routing parser's reason when
they would not serve, rolled back, and served at once by the gateway that took them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from asgi_middleware import create_app
from llm_gateway.admin.app import create_admin_app
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key
from tests.test_admin_api import SECRET_KEY, AdminGateway, make_admin_token, serve_together


@pytest.fixture
def routed(tmp_path: Path, fake_url: str, fake: Any,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[AdminGateway]:
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "sk-fake-upstream")
    file_routes = {
        "providers": {"fake": {"base_url": fake_url, "api_key_env": "TEST_UPSTREAM_KEY",
                               "profile": "venice"}},
        "models": {"chat-fast": {"targets": [{"provider": "fake", "model": "llama-3.3-70b"}]}},
    }
    settings = make_settings(tmp_path, fake_url, secret_key=SECRET_KEY, routes=file_routes)
    gateway = build_gateway(settings)
    token = make_admin_token(settings)
    with serve_together(create_app(settings, gateway=gateway), create_admin_app(gateway)) as urls:
        yield AdminGateway(urls[0], urls[1], gateway, settings, token)


def upstream_model(gw: AdminGateway, fake: Any, key: str, alias: str) -> str:
    response = httpx.post(gw.public + "/v1/chat/completions", headers={
        "authorization": f"Bearer {key}"}, json={"model": alias, "messages": [
            {"role": "user", "content": "hi"}]}, timeout=10)
    assert response.status_code == 200, response.text
    return json.loads(fake.requests[-1].body)["model"]


def test_routes_are_versioned_over_the_file_and_served_at_once(routed: AdminGateway,
                                                                fake: Any) -> None:
    _, key = create_key(routed.settings.database_url)
    with routed.client() as c:
        view = c.get("/routes").json()
        assert view["version"] is None
        assert [(m["name"], m["source"]) for m in view["models"]] == [("chat-fast", "file")]
        assert view["providers"][0]["source"] == "file"
        assert upstream_model(routed, fake, key, "chat-fast") == "llama-3.3-70b"

        first = c.post("/routes", json={"kind": "model", "name": "chat-fast", "note": "bigger",
                                        "entry": {"targets": [{"provider": "fake",
                                                               "model": "qwen-2.5-72b"}]}})
        assert first.status_code == 201 and first.json()["version"] == 1
        assert upstream_model(routed, fake, key, "chat-fast") == "qwen-2.5-72b"

        added = c.post("/routes", json={"kind": "model", "name": "chat-cheap", "entry": {
            "targets": [{"provider": "fake", "model": "llama-3.2-3b"}]}})
        assert added.json()["version"] == 2
        view = c.get("/routes").json()
        assert {m["name"]: m["source"] for m in view["models"]} == {
            "chat-fast": "db v1", "chat-cheap": "db v2"}
        assert all(t["health"] == "healthy" for m in view["models"] for t in m["targets"])

        refused = c.post("/routes", json={"kind": "model", "name": "broken", "entry": {
            "targets": [{"provider": "nowhere", "model": "x"}]}})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == (
            "models.broken.targets[0].provider: 'nowhere' is not a provider")
        assert len(c.get("/routes/versions").json()) == 2  # nothing stored

        removed = c.post("/routes", json={"kind": "model", "name": "chat-fast", "entry": None})
        assert removed.json()["version"] == 3
        assert [m["name"] for m in c.get("/routes").json()["models"]] == ["chat-cheap"]

        rolled = c.post("/routes/rollback", json={"version": 1})
        assert rolled.status_code == 201 and rolled.json()["version"] == 4
        assert rolled.json()["document"] == first.json()["document"]
        assert upstream_model(routed, fake, key, "chat-fast") == "qwen-2.5-72b"
        assert c.post("/routes/rollback", json={"version": 99}).status_code == 404

        events = c.get("/audit", params={"limit": 20}).json()
    actions = [e["action"] for e in events if e["action"].startswith("route.")]
    assert actions == ["route.rollback", "route.delete", "route.change", "route.change"]
    assert events[0]["after"]["route_version"] == 4 and events[0]["actor"] == "ops"


def test_a_provider_created_through_the_api(routed: AdminGateway, fake: Any,
                                            fake_url: str) -> None:
    _, key = create_key(routed.settings.database_url)
    with routed.client() as c:
        made = c.post("/routes", json={"kind": "provider", "name": "second", "entry": {
            "base_url": fake_url, "api_key_env": "TEST_UPSTREAM_KEY", "profile": "openai"}})
        assert made.status_code == 201
        c.post("/routes", json={"kind": "model", "name": "via-second", "entry": {
            "targets": [{"provider": "second", "model": "deepseek-r1"}]}})
        providers = {p["name"]: p for p in c.get("/routes").json()["providers"]}
        assert providers["second"]["source"] == "db v1" and providers["second"]["key_configured"]
        assert providers["fake"]["source"] == "file"
        bad = c.post("/routes", json={"kind": "provider", "name": "third",
                                      "entry": {"base_url": "ftp://x"}})
        assert bad.status_code == 400 and "base_url" in bad.json()["error"]["message"]
    assert upstream_model(routed, fake, key, "via-second") == "deepseek-r1"


def test_a_provider_key_stored_through_the_api_is_the_one_sent(routed: AdminGateway, fake: Any,
                                                               fake_url: str) -> None:
    """Sealed by the admin plane, opened by the gateway's route source: the same context."""
    _, key = create_key(routed.settings.database_url)
    with routed.client() as c:
        stored = c.put("/provider-keys/sealed", json={"key": "sk-fake-upstream"})
        assert stored.status_code == 200 and stored.json()["key"] == "sk-f…ream"
        c.post("/routes", json={"kind": "provider", "name": "sealed", "entry": {
            "base_url": fake_url, "profile": "openai"}})
        c.post("/routes", json={"kind": "model", "name": "via-sealed", "entry": {
            "targets": [{"provider": "sealed", "model": "deepseek-r1"}]}})
    assert upstream_model(routed, fake, key, "via-sealed") == "deepseek-r1"
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-fake-upstream"
