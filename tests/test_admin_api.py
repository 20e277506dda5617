"""The admin API on its own listener: every endpoint with an admin token and with wrong
credentials, every answer validated against the served OpenAPI document, and changes made
through it seen on the public listener's /v1/* within the revocation bound, each in the
audit log once and without a secret."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import uvicorn
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from asgi_middleware import create_app
from llm_gateway.admin.app import create_admin_app
from llm_gateway.admin.service import CLI_ACTOR, AdminService, verify_admin_token
from llm_gateway.billing.model import BudgetScope
from llm_gateway.config import Secret, Settings
from llm_gateway.engine import Gateway
from llm_gateway.stores import open_store
from llm_gateway.wiring import build_gateway
from tests.conftest import make_settings
from tests.support import create_key

SECRET_KEY = Secret("test-secret-key-for-provider-keys-at-rest-0123456789")
KEY_CACHE_SECONDS = 2.0  # the README's revocation bound


# ---- plumbing (shared with the other admin tests) ---------------------------------------------

def run_service[T](settings: Settings, work: Any) -> T:
    """``work(service)`` on an AdminService acting as the CLI would, on its own store."""

    async def go() -> T:
        store = open_store(settings.database_url)
        try:
            await store.migrate()
            return await work(AdminService(store, actor=CLI_ACTOR,  # type: ignore[arg-type]
                                           settings=settings))
        finally:
            await store.close()

    return in_new_loop(go())


def in_new_loop[T](coroutine: Any) -> T:
    """asyncio.run in a thread of its own: the caller's thread may run a loop already
    (Playwright's sync API does)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def make_admin_token(settings: Settings, name: str = "ops") -> str:
    return run_service(settings, lambda s: s.create_admin_token(name))[1]


@contextmanager
def serve_together(*apps: object) -> Iterator[list[str]]:
    """Several ASGI apps on their own sockets, served by one event loop in one thread (as
    `serve` does): they may share one gateway."""
    sockets = []
    for _ in apps:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    servers = [uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning",  # type: ignore[arg-type]
                                             access_log=False)) for app in apps]

    async def serve_all() -> None:
        await asyncio.gather(*(server.serve(sockets=[sock])
                               for server, sock in zip(servers, sockets, strict=True)))

    thread = threading.Thread(target=asyncio.run, args=(serve_all(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not all(server.started for server in servers):
        assert thread.is_alive() and time.monotonic() < deadline, "servers did not start"
        time.sleep(0.01)
    try:
        yield [f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(10)
        for sock in sockets:
            sock.close()


@dataclass
class AdminGateway:
    public: str
    admin: str
    gateway: Gateway
    settings: Settings
    token: str

    def client(self, token: str | None = "admin") -> httpx.Client:
        bearer = self.token if token == "admin" else token
        headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
        return httpx.Client(base_url=self.admin + "/admin/v1", headers=headers, timeout=10)


@pytest.fixture
def admin_gw(tmp_path: Path, fake_url: str, fake: object) -> Iterator[AdminGateway]:
    settings = make_settings(tmp_path, fake_url, secret_key=SECRET_KEY)
    gateway = build_gateway(settings, key_cache_seconds=KEY_CACHE_SECONDS)
    token = make_admin_token(settings)
    with serve_together(create_app(settings, gateway=gateway), create_admin_app(gateway)) as urls:
        yield AdminGateway(urls[0], urls[1], gateway, settings, token)


class OpenApi:
    """Validates answers against the served document (OpenAPI 3.1: JSON Schema 2020-12)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.registry: Registry = Registry().with_resource(
            "urn:openapi", Resource.from_contents(document, default_specification=DRAFT202012))
        self.seen: set[tuple[str, str]] = set()

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        for template, operations in self.document["paths"].items():
            pattern = "^" + re.sub(r"\{[^/]+\}", "[^/]+", template) + "$"
            if re.match(pattern, path) and method.lower() in operations:
                return template, operations[method.lower()]
        raise AssertionError(f"{method} {path} is not in the OpenAPI document")

    def check(self, response: httpx.Response) -> httpx.Response:
        path = response.request.url.path
        template, operation = self.operation(response.request.method, path)
        self.seen.add((response.request.method, template))
        status = str(response.status_code)
        assert status in operation["responses"], (
            f"{response.request.method} {path} answered {status}, undocumented: {response.text}")
        content = operation["responses"][status].get("content")
        if content is None:
            assert response.content == b""
            return response
        pointer = "/".join(part.replace("~", "~0").replace("/", "~1") for part in (
            "paths", template, response.request.method.lower(), "responses", status, "content",
            "application/json", "schema"))
        validator = jsonschema.Draft202012Validator(
            {"$ref": f"urn:openapi#/{pointer}"}, registry=self.registry)
        validator.validate(response.json())
        return response


@pytest.fixture
def openapi(admin_gw: AdminGateway) -> OpenApi:
    response = httpx.get(admin_gw.admin + "/admin/v1/openapi.json")  # no token needed
    assert response.status_code == 200
    return OpenApi(response.json())


def chat(base: str, key: str, model: str = "llama-3.3-70b") -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                      timeout=10)


def until(predicate: Any, within: float) -> float:
    """Seconds until ``predicate()`` held; fails after ``within``."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < within, f"not within {within}s"
        time.sleep(0.05)
    return time.monotonic() - started


# ---- every endpoint -------------------------------------------------------------------------

def exercise_every_endpoint(gw: AdminGateway, api: OpenApi) -> dict[str, Any]:
    """One call of each operation with a good token, each answer checked; what was made."""
    with gw.client() as c:
        ok = api.check
        assert ok(c.get("/me")).json()["name"] == "ops"
        created = ok(c.post("/keys", json={"name": "svc", "subject_id": "team-a",
                                           "allowed_models": ["llama-3.3-70b"]}))
        assert created.status_code == 201 and created.json()["key"].startswith("llmg_")
        key = created.json()
        assert [k["prefix"] for k in ok(c.get("/keys")).json()] == [key["prefix"]]
        assert ok(c.get(f"/keys/{key['prefix']}")).json()["id"] == key["id"]
        patched = ok(c.patch(f"/keys/{key['id']}", json={
            "name": "svc-2", "rate_limit_requests": 5,
            "budget": {"daily_usd": "1.50", "max_output_tokens": 100}}))
        assert patched.json()["name"] == "svc-2" and patched.json()["rate_limit_requests"] == 5
        assert ok(c.post(f"/keys/{key['id']}/disable")).json()["state"] == "disabled"
        assert ok(c.post(f"/keys/{key['id']}/enable")).json()["state"] == "active"
        rotated = ok(c.post(f"/keys/{key['id']}/rotate")).json()
        assert rotated["key"].startswith("llmg_") and rotated["id"] != key["id"]
        assert ok(c.post(f"/keys/{rotated['id']}/revoke")).json()["state"] == "revoked"
        assert ok(c.post(f"/keys/{rotated['id']}/enable")).status_code == 409
        assert ok(c.get("/keys/llmg_nothere0")).status_code == 404

        subjects = ok(c.get("/subjects")).json()
        assert [s["subject_id"] for s in subjects] == ["team-a"]
        put = ok(c.put("/budgets/subject/team-a", json={"monthly_usd": "20", "daily_tokens": 1000}))
        assert put.json()["monthly_usd"] == "20.00"
        assert ok(c.get("/budgets/subject/team-a")).json()["daily_tokens"] == 1000
        budgets = ok(c.get("/budgets")).json()
        assert {b["scope"] for b in budgets} == {"key", "subject"}  # the key's moved on rotate
        assert ok(c.delete("/budgets/subject/team-a")).status_code == 204
        assert ok(c.get("/budgets/subject/team-a")).status_code == 404
        assert ok(c.put("/budgets/subject/x", json={"daily_usd": 1.5})).status_code == 422

        price = ok(c.post("/prices", json={"provider": "venice", "model": "llama-3.3-70b",
                                           "input_per_mtok": "0.70", "output_per_mtok": "2.80",
                                           "effective_from": "2025-01-01T00:00:00Z"}))
        assert price.status_code == 201 and price.json()["output_per_mtok"] == "2.80"
        assert ok(c.get("/prices")).json()[0]["effective_from"] == 1735689600.0
        usage = ok(c.get("/usage", params={"by": "day,model", "since": "2025-01-01"})).json()
        assert usage["by"] == ["day", "model"]
        assert ok(c.get("/usage", params={"by": "colour"})).status_code == 400
        assert ok(c.get("/usage/req_nothere")).status_code == 404
        refusals = ok(c.get("/refusals", params={"by": "key,day", "since": "2025-01-01"})).json()
        assert refusals["by"] == ["key", "day"]
        assert ok(c.get("/refusals", params={"by": "model"})).status_code == 400

        stored = ok(c.put("/provider-keys/venice", json={"key": "sk-provider-secret-9f3c"}))
        assert stored.json()["key"] == "sk-p…9f3c"
        assert ok(c.get("/provider-keys")).json()[0]["key"] == "sk-p…9f3c"
        assert ok(c.delete("/provider-keys/venice")).status_code == 204

        other = ok(c.post("/admin-tokens", json={"name": "robot"}))
        assert other.status_code == 201 and other.json()["token"].startswith("llmga_")
        assert len(ok(c.get("/admin-tokens")).json()) == 2
        assert ok(c.post(f"/admin-tokens/{other.json()['prefix']}/revoke")).json()["revoked_at"]

        routes = ok(c.get("/routes")).json()
        assert routes["providers"][0]["name"] == "venice"
        version = ok(c.post("/routes", json={"kind": "model", "name": "chat-fast", "entry": {
            "targets": [{"provider": "venice", "model": "llama-3.3-70b"}]}}))
        assert version.status_code == 201 and version.json()["version"] == 1
        assert ok(c.post("/routes/rollback", json={"version": 1})).json()["version"] == 2
        assert len(ok(c.get("/routes/versions")).json()) == 2
        events = ok(c.get("/audit", params={"limit": 100})).json()
    return {"key": key, "rotated": rotated, "events": events, "other_token": other.json()}


def test_every_endpoint_answers_as_its_openapi_document_says(
    admin_gw: AdminGateway, openapi: OpenApi
) -> None:
    made = exercise_every_endpoint(admin_gw, openapi)
    documented = {(method.upper(), path) for path, operations in openapi.document["paths"].items()
                  for method in operations}
    assert documented - {("GET", "/admin/v1/openapi.json")} <= openapi.seen, (
        f"not exercised: {sorted(documented - openapi.seen)}")
    # Every change above is in the audit log, as the token's name; no secret anywhere in it.
    events = made["events"]
    bootstrap = f"admin_token:{admin_gw.token[:13]}"  # made with the CLI, by "cli"
    assert {e["actor"] for e in events if e["target"] != bootstrap} == {"ops"}
    text = json.dumps(events, ensure_ascii=False)
    for secret in (made["key"]["key"], made["rotated"]["key"], made["other_token"]["token"],
                   "sk-provider-secret-9f3c", admin_gw.token):
        assert secret not in text and secret[12:] not in text
    assert "sk-p…9f3c" in text  # the provider key, masked


ENDPOINTS = [
    ("GET", "/me"), ("GET", "/keys"), ("POST", "/keys"), ("GET", "/keys/x"),
    ("PATCH", "/keys/x"), ("POST", "/keys/x/revoke"), ("POST", "/keys/x/rotate"),
    ("POST", "/keys/x/disable"), ("POST", "/keys/x/enable"), ("GET", "/subjects"),
    ("GET", "/budgets"), ("GET", "/budgets/subject/x"), ("PUT", "/budgets/subject/x"),
    ("DELETE", "/budgets/subject/x"), ("GET", "/prices"), ("POST", "/prices"),
    ("GET", "/usage"), ("GET", "/usage/x"), ("GET", "/refusals"), ("GET", "/audit"),
    ("GET", "/admin-tokens"),
    ("POST", "/admin-tokens"),
    ("POST", "/admin-tokens/x/revoke"), ("GET", "/routes"), ("POST", "/routes"),
    ("POST", "/routes/rollback"), ("GET", "/routes/versions"), ("GET", "/provider-keys"),
    ("PUT", "/provider-keys/x"), ("DELETE", "/provider-keys/x"),
]


def test_wrong_credentials_get_401_on_every_endpoint(
    admin_gw: AdminGateway, openapi: OpenApi
) -> None:
    _, gateway_key = create_key(admin_gw.settings.database_url)
    revoked = make_admin_token(admin_gw.settings, "gone")
    run_service(admin_gw.settings, lambda s: s.revoke_admin_token(revoked[:13]))
    forged = revoked[:-1] + ("A" if revoked[-1] != "A" else "B")
    for credential in (None, gateway_key, revoked, forged, "llmga_short", "Basic abc"):
        with admin_gw.client(credential) as c:
            for method, path in ENDPOINTS:
                response = openapi.check(c.request(method, path, json={}))
                assert response.status_code == 401, (credential, method, path, response.text)
                assert response.json()["error"]["code"] == "invalid_api_key"
                assert response.headers["www-authenticate"] == "Bearer"
    with admin_gw.client(gateway_key) as c:
        assert "gateway key is not an admin token" in c.get("/keys").json()["error"]["message"]


def test_errors_are_openai_shaped_and_documented(admin_gw: AdminGateway, openapi: OpenApi) -> None:
    with admin_gw.client() as c:
        bad = openapi.check(c.post("/keys", json={"name": ""}))
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request_body"
        assert openapi.check(c.post("/keys", json={"name": "x", "colour": 1})).status_code == 422
        assert openapi.check(c.post("/prices", json={
            "provider": "p", "model": "m", "input_per_mtok": 0.1, "output_per_mtok": "1"})
        ).status_code == 422  # money as a float is refused: it is already rounded
        missing = c.get("/nothing-here")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        assert c.delete("/keys").status_code == 405
        assert c.get("/keys").headers["cache-control"] == "no-store"


def test_nothing_of_the_admin_plane_is_on_the_public_listener(admin_gw: AdminGateway) -> None:
    for path in ("/admin/v1/keys", "/admin/v1/openapi.json", "/admin/", "/admin",
                 "/admin/index.html", "/admin/js/app.js"):
        response = httpx.get(admin_gw.public + path,
                             headers={"authorization": f"Bearer {admin_gw.token}"})
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    # And an admin token is no gateway key.
    refused = chat(admin_gw.public, admin_gw.token)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_admin_listener_serves_probes_console_and_nothing_else(admin_gw: AdminGateway) -> None:
    base = admin_gw.admin
    assert httpx.get(base + "/healthz").json() == {"status": "ok"}
    assert httpx.get(base + "/readyz").json()["status"] == "ready"
    assert b"llm_gateway" in httpx.get(base + "/metrics").content
    console = httpx.get(base + "/admin/")
    assert console.status_code == 200 and "<title>" in console.text
    assert "default-src 'self'" in console.headers["content-security-policy"]
    assert httpx.get(base + "/admin/js/app.js").headers["content-type"].startswith(
        "text/javascript")
    assert httpx.get(base + "/admin", follow_redirects=False).headers["location"] == "/admin/"
    for path in ("/v1/chat/completions", "/", "/admin/missing.js"):
        response = httpx.get(base + path)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_a_key_managed_through_the_api_behaves_so_on_v1_within_the_bound(
    admin_gw: AdminGateway, tmp_path: Path, fake_url: str
) -> None:
    # A second replica on the same database: it learns of changes only through its key
    # cache, so this measures the README's bound, not the admin listener's shortcut.
    replica_gateway = build_gateway(admin_gw.settings, key_cache_seconds=KEY_CACHE_SECONDS)
    with admin_gw.client() as c, serve_together(
            create_app(admin_gw.settings, gateway=replica_gateway)) as (replica,):
        created = c.post("/keys", json={"name": "svc", "rate_limit_requests": 100}).json()
        key, key_id = created["key"], created["id"]
        for base in (admin_gw.public, replica):
            assert chat(base, key).status_code == 200

        c.patch(f"/keys/{key_id}", json={"rate_limit_requests": 2, "rate_limit_window_seconds": 60})
        for base in (admin_gw.public, replica):
            until(lambda base=base: chat(base, key).status_code == 429, KEY_CACHE_SECONDS + 1)

        c.post(f"/keys/{key_id}/disable")
        assert chat(admin_gw.public, key).status_code == 401  # same process: at once
        waited = until(lambda: chat(replica, key).status_code == 401, KEY_CACHE_SECONDS + 1)
        assert waited <= KEY_CACHE_SECONDS + 0.5

        c.post(f"/keys/{key_id}/enable")
        assert chat(admin_gw.public, key).status_code in (200, 429)  # admitted again
        c.post(f"/keys/{key_id}/revoke")
        refused = chat(admin_gw.public, key)
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
        until(lambda: chat(replica, key).status_code == 401, KEY_CACHE_SECONDS + 1)

        events = c.get("/audit", params={"target": f"key:{key[:12]}"}).json()
    actions = sorted(e["action"] for e in events)
    assert actions == ["key.create", "key.disable", "key.enable", "key.revoke", "key.update"]
    assert key not in json.dumps(events) and key[12:] not in json.dumps(events)


def test_audit_log_pages_newest_first(admin_gw: AdminGateway) -> None:
    with admin_gw.client() as c:
        for i in range(5):
            c.post("/keys", json={"name": f"k{i}"})
        first = c.get("/audit", params={"limit": 3}).json()
        rest = c.get("/audit", params={"limit": 10, "before": first[-1]["at"]}).json()
    ats = [e["at"] for e in first + rest]
    assert ats == sorted(ats, reverse=True) and len(ats) == 6  # 5 keys + the admin token


def test_an_admin_tokens_last_use_is_written_at_most_once_a_minute(
    admin_gw: AdminGateway, openapi: OpenApi, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = admin_gw.gateway.store
    touches: list[float] = []
    touch = store.touch_admin_token  # type: ignore[attr-defined]

    async def counted(token_id: str, now: float, *, stale_before: float) -> bool:
        touches.append(now)
        return await touch(token_id, now, stale_before=stale_before)

    monkeypatch.setattr(store, "touch_admin_token", counted)

    def last_used() -> float | None:
        with admin_gw.client() as c:
            [token] = openapi.check(c.get("/admin-tokens")).json()
        return token["last_used_at"]  # type: ignore[no-any-return]

    before = time.time()
    first = last_used()
    assert first is not None and before <= first <= time.time()
    assert [last_used() for _ in range(4)] == [first] * 4
    assert len(touches) == 1  # one write for five authenticated calls
    wrong = admin_gw.token[:-1] + ("y" if admin_gw.token.endswith("x") else "x")
    with admin_gw.client(token=wrong) as c:
        assert c.get("/me").status_code == 401  # a wrong token touches nothing
    assert len(touches) == 1

    # A minute later, the next call writes it again (as every replica would see it).
    async def verify_later(service: AdminService) -> None:
        await verify_admin_token(service.store, admin_gw.token, now=first + 61)

    run_service(admin_gw.settings, verify_later)
    assert last_used() == pytest.approx(first + 61)


def test_rules_live_once_in_the_service(admin_gw: AdminGateway) -> None:
    """The CLI and the API refuse the same things the same way."""
    created = run_service(admin_gw.settings, lambda s: s.create_key(name="x"))[0]
    run_service(admin_gw.settings, lambda s: s.revoke_key(created.id))
    with admin_gw.client() as c:
        for action in ("rotate", "enable", "disable"):
            refused = c.post(f"/keys/{created.prefix}/{action}")
            assert refused.status_code == 409 and "revoked" in refused.json()["error"]["message"]
        assert c.patch(f"/keys/{created.id}", json={"name": "y"}).status_code == 409
        # Revoking again changes nothing and writes no second event.
        assert c.post(f"/keys/{created.id}/revoke").status_code == 200
        events = c.get("/audit", params={"target": f"key:{created.prefix}"}).json()
    assert [e["actor"] for e in events] == ["cli", "cli"]


def test_admin_tables_work_on_sqlite_and_postgres(tmp_path: Path, postgres_url: str) -> None:
    for url in (f"sqlite:///{tmp_path / 'admin.db'}", postgres_url):
        settings = Settings(database_url=url, secret_key=SECRET_KEY)

        async def scenario(service: AdminService) -> None:
            record, _ = await service.create_key(name="k", subject_id="s")
            await service.update_key(record.prefix, {"allowed_models": ("a",), "expires_at": 1e10})
            await service.set_key_enabled(record.prefix, False)
            await service.set_budget(BudgetScope.KEY, record.prefix, {"daily_usd": "0.0000001"})
            await service.set_price(provider="p", model="m", input_per_mtok="0.1234567891",
                                    output_per_mtok="3", effective_from=1000.0)
            await service.set_price(provider="p", model="m", input_per_mtok="1",
                                    output_per_mtok="3", effective_from=2000.0)
            await service.set_provider_key("p", "sk-abcdefghijkl")
            await service.change_route("provider", "local", {"base_url": "http://x/v1"})
            _, token = await service.create_admin_token("t")
            store = service.store
            found = await store.find_key(record.id)
            assert found is not None and not found.is_active and found.allowed_models == ("a",)
            budget = await store.budget(BudgetScope.KEY, record.id)
            assert budget is not None and budget.daily_usd == Decimal("0.0000001")
            at_1500 = await store.price_at("p", "m", 1500.0)
            assert at_1500 is not None and at_1500.input_per_mtok == Decimal("0.1234567891")
            assert (await store.price_at("p", "m", 2500.0)).input_per_mtok == 1  # type: ignore[union-attr]
            assert (await service.provider_keys())[0]["key"] == "sk-a…ijkl"
            assert (await store.latest_route_version()).version == 1  # type: ignore[union-attr]
            assert (await store.admin_token_by_prefix(token[:13])) is not None
            events = await store.audit_events(limit=50)
            assert len(events) == 9 and events[0].action == "admin_token.create"

        run_service(settings, scenario)
