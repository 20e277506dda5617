"""What the admin API takes, at its edges: integers within their column's range (64 bits
for BIGINT and every SQLite INTEGER, 32 for Postgres INTEGER), strict types (no true for a
number, no "60" for an integer, no NaN or infinity for a time), text without control
characters and of a bounded length, in bodies, paths and queries. Every refusal is a 422
(a body that is no JSON: a 400) in the API's OpenAI-shaped error, as its document says,
never a 500; and a value that still gets past them to the store (which raises
OverflowError on SQLite, a DataError on Postgres) is answered the same way.

Run on SQLite, and with TEST_DATABASE_URL on Postgres, where the column ranges bite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from llm_gateway.admin.common import BIGINT_MAX, INTEGER_MAX, UNIX_SECONDS_MAX
from llm_gateway.admin.service import AdminService, Invalid
from llm_gateway.billing.model import BudgetScope
from llm_gateway.config import load_settings
from tests.support import fresh_database_url
from tests.test_admin_api import (  # noqa: F401 (fixtures)
    AdminGateway,
    OpenApi,
    admin_gw,
    openapi,
    run_service,
)

BEYOND_64_BITS = 2**64
JUST_PAST_BIGINT = BIGINT_MAX + 1
JUST_PAST_INTEGER = INTEGER_MAX + 1


def refused(api: OpenApi, response: Any) -> str:
    """The refusal's message, once the answer is checked to be a documented 422 (400: no
    JSON) in the API's error shape."""
    api.check(response)
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    expected = 400 if error["code"] == "invalid_json" else 422
    assert response.status_code == expected, (response.request.method, response.request.url,
                                              response.request.content, response.text)
    assert error["type"] == "invalid_request_error"
    assert error["code"] in ("invalid_request_body", "invalid_json")
    assert "Traceback" not in error["message"]
    return str(error["message"])


def raw_json(body: str) -> dict[str, Any]:
    """Keyword arguments that send ``body`` as it is (JSON that json.dumps would not write,
    such as NaN, Infinity or a lone surrogate escape)."""
    return {"content": body.encode(), "headers": {"content-type": "application/json"}}


def make_key(gw: AdminGateway) -> dict[str, Any]:
    with gw.client() as c:
        created = c.post("/keys", json={"name": "svc"})
    assert created.status_code == 201, created.text
    return created.json()  # type: ignore[no-any-return]


# ---- integers: the column's range, strictly typed --------------------------------------

BUDGET_REFUSALS = [
    {"daily_tokens": BEYOND_64_BITS}, {"daily_tokens": JUST_PAST_BIGINT},
    {"monthly_tokens": -1}, {"monthly_tokens": 10**30},
    {"tokens_per_minute": 0}, {"tokens_per_minute": JUST_PAST_BIGINT},
    {"max_output_tokens": JUST_PAST_INTEGER},  # INTEGER in Postgres
    {"daily_tokens": True}, {"daily_tokens": "1000"}, {"daily_tokens": 1000.0},
    {"max_output_tokens": False},
    {"daily_usd": "1" * 400}, {"daily_usd": "123456789"}, {"monthly_usd": "0.00000000001"},
    {"daily_usd": 1.5}, {"daily_usd": True},
]


def test_budget_counts_beyond_their_column_or_of_another_type_are_refused(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    key = make_key(admin_gw)
    with admin_gw.client() as c:
        for body in BUDGET_REFUSALS:
            message = refused(openapi, c.put("/budgets/subject/team-a", json=body))
            assert next(iter(body)) in message, (body, message)
            refused(openapi, c.patch(f"/keys/{key['id']}", json={"budget": body}))
        assert openapi.check(c.get("/budgets/subject/team-a")).status_code == 404  # none made
        # The greatest each column holds is taken, and read back as it was given.
        greatest = {"daily_tokens": BIGINT_MAX, "monthly_tokens": BIGINT_MAX,
                    "tokens_per_minute": BIGINT_MAX, "max_output_tokens": INTEGER_MAX,
                    "daily_usd": "99999999.9999999999"}
        assert openapi.check(c.put("/budgets/subject/team-a", json=greatest)).status_code == 200
        shown = openapi.check(c.get("/budgets/subject/team-a")).json()
    assert {name: shown[name] for name in greatest} == greatest


KEY_REFUSALS = [
    {"rate_limit_requests": BEYOND_64_BITS}, {"rate_limit_requests": JUST_PAST_INTEGER},
    {"rate_limit_requests": 0}, {"rate_limit_requests": True}, {"rate_limit_requests": "60"},
    {"rate_limit_window_seconds": JUST_PAST_INTEGER},
    {"rate_limit_window_seconds": 31 * 86_400 + 1},  # a month at most: longer is a budget's
    {"rate_limit_window_seconds": 60.0},
    {"expires_at": True}, {"expires_at": "1900000000"}, {"expires_at": 1e300},
    {"expires_at": -1}, {"expires_at": UNIX_SECONDS_MAX + 1},
]


def test_key_fields_beyond_their_column_or_of_another_type_are_refused(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    key = make_key(admin_gw)
    with admin_gw.client() as c:
        for fields in KEY_REFUSALS:
            name = next(iter(fields))
            assert name in refused(openapi, c.post("/keys", json={"name": "x", **fields}))
            assert name in refused(openapi, c.patch(f"/keys/{key['id']}", json=fields))
        for literal in ("NaN", "Infinity", "-Infinity", "1e400"):
            # Python's JSON reader takes these as floats; a time is a finite number.
            body = f'{{"name": "x", "expires_at": {literal}}}'
            refused(openapi, c.post("/keys", **raw_json(body)))
        assert [k["name"] for k in openapi.check(c.get("/keys")).json()] == ["svc"]
        greatest = {"rate_limit_requests": INTEGER_MAX, "rate_limit_window_seconds": 31 * 86_400,
                    "expires_at": UNIX_SECONDS_MAX}
        made = openapi.check(c.post("/keys", json={"name": "big", **greatest})).json()
        shown = openapi.check(c.get(f"/keys/{made['id']}")).json()  # as stored
    assert {name: shown[name] for name in greatest} == greatest


def test_route_versions_and_query_numbers_are_bounded(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    with admin_gw.client() as c:
        for version in (BEYOND_64_BITS, JUST_PAST_INTEGER, 0, True, "1", 1.0):
            assert "version" in refused(openapi, c.post("/routes/rollback",
                                                        json={"version": version}))
        # The greatest version a column holds is one there is not (yet).
        missing = openapi.check(c.post("/routes/rollback", json={"version": INTEGER_MAX}))
        assert missing.status_code == 404
        for params in ({"limit": BEYOND_64_BITS}, {"limit": 0}, {"before": "1e400"},
                       {"before": "nan"}, {"before": "-1"}, {"before": "true"},
                       {"before": str(BEYOND_64_BITS**20)}):
            refused(openapi, c.get("/audit", params=params))
        refused(openapi, c.get("/routes/versions", params={"limit": BEYOND_64_BITS}))
        for params in ({"since": "1e400"}, {"since": "nan"}, {"until": str(BEYOND_64_BITS)},
                       {"since": "99999999999999999999"}, {"since": "-5"},
                       {"until": "9999-12-31T23:59:59-01:00"},  # past year 9999 in UTC
                       {"top": str(BEYOND_64_BITS)}, {"since": "2025" * 20}):
            refused(openapi, c.get("/usage", params=params))
        events = openapi.check(c.get("/audit", params={"before": UNIX_SECONDS_MAX})).json()
        assert [e["action"] for e in events] == ["admin_token.create"]  # the fixture's
        assert openapi.check(c.get("/usage", params={
            "since": "0", "until": "9999-12-31T23:59:59Z"})).json()["rows"] == []


# ---- text: no control characters, a bounded length ---------------------------------------

# C0 (NUL, ESC, LF, TAB), DEL, C1 (NEL); a bidirectional override, a zero-width space, a
# line separator: the gateway's rule for caller text (llm_gateway/caller_text.py).
CONTROL = ["\x00", "\x1b[31m", "\x7f", "\x85", "a\nb", "\t", "ab\u202ec", "a\u200bb", "\u2028"]


def test_names_and_other_stored_text_refuse_control_characters_and_overlong_text(
    admin_gw: AdminGateway, openapi: OpenApi,  # noqa: F811
) -> None:
    key = make_key(admin_gw)
    price = {"provider": "venice", "model": "m", "input_per_mtok": "1", "output_per_mtok": "1"}
    route = {"kind": "model", "name": "chat-x",
             "entry": {"targets": [{"provider": "venice", "model": "llama-3.3-70b"}]}}
    with admin_gw.client() as c:
        for bad in [*CONTROL, "x" * 201]:
            for method, path, body in (
                ("POST", "/keys", {"name": bad}),
                ("POST", "/keys", {"name": "x", "subject_id": bad}),
                ("POST", "/keys", {"name": "x", "allowed_models": ["ok", bad]}),
                ("PATCH", f"/keys/{key['id']}", {"name": bad}),
                ("PATCH", f"/keys/{key['id']}", {"allowed_models": [bad]}),
                ("POST", "/admin-tokens", {"name": bad}),
                ("POST", "/prices", {**price, "provider": bad}),
                ("POST", "/prices", {**price, "model": bad}),
                ("POST", "/routes", {**route, "name": bad}),
                ("POST", "/routes/rollback", {"version": 1, "note": bad * 3}),  # 500 at most
            ):
                refused(openapi, c.request(method, path, json=body))
        for bad in [*CONTROL, "x" * 4097]:  # a provider key may be long, not that long
            refused(openapi, c.put("/provider-keys/venice", json={"key": f"sk-{bad}"}))
        for bad in ("\x00", "\x1b"):
            entry = {"targets": [{"provider": "venice", "model": f"llama{bad}"}]}
            assert "targets[0].model" in refused(openapi, c.post("/routes", json={
                **route, "entry": entry}))
            refused(openapi, c.post("/routes", json={**route, "entry": {f"k{bad}": 1}}))
        refused(openapi, c.post("/routes", json={**route, "entry": {"weight": BEYOND_64_BITS}}))
        refused(openapi, c.post("/routes", **raw_json(
            '{"kind": "model", "name": "chat-x", "entry": {"weight": NaN}}')))
        refused(openapi, c.post("/routes", **raw_json(
            '{"kind": "model", "name": "chat-x", "entry": {"model": "\\ud800"}}')))
        # A body Python's JSON reader cannot read (nested past its recursion limit): 400
        # invalid_json, not the 404 it was answered with.
        deep = "[" * 100_000 + "]" * 100_000
        assert refused(openapi, c.post("/routes", **raw_json(deep))) == (
            "The body could not be read as JSON.")
        # A lone surrogate is no text, in any field.
        assert "name" in refused(openapi, c.post("/keys", **raw_json('{"name": "a\\udc00"}')))
        refused(openapi, c.post("/keys", **raw_json(
            '{"name": "x", "allowed_models": ["\\ud800"]}')))
        refused(openapi, c.post("/keys", json={"name": "x", "allowed_models": ["m"] * 1001}))
        # Path and query text that is stored or looked up: the same rule.
        for path in ("/keys/%00", "/keys/a%1Bb", f"/keys/{'x' * 201}"):
            refused(openapi, c.get(path))
        refused(openapi, c.put("/budgets/subject/team%00a", json={"daily_tokens": 1}))
        refused(openapi, c.put("/provider-keys/ven%00ice", json={"key": "sk-1"}))
        refused(openapi, c.delete("/provider-keys/ven%7Fice"))
        refused(openapi, c.post("/admin-tokens/%00/revoke"))
        refused(openapi, c.get("/audit", params={"target": "key:\x00"}))
        refused(openapi, c.get("/usage", params={"by": "day\x00"}))
        # Nothing of the above was stored.
        assert [k["name"] for k in openapi.check(c.get("/keys")).json()] == ["svc"]
        assert openapi.check(c.get("/routes/versions")).json() == []
        # Text at its bound and beyond ASCII is taken.
        name = "é" * 199 + "名"
        made = openapi.check(c.post("/keys", json={"name": name, "allowed_models": [name]}))
        assert made.status_code == 201 and made.json()["name"] == name


def test_the_document_states_every_bound(
    openapi: OpenApi,  # noqa: F811
) -> None:
    """A client (and schemathesis) learns the ranges from the document, not by trying."""
    schemas = openapi.document["components"]["schemas"]

    def prop(model: str, name: str) -> dict[str, Any]:
        found = schemas[model]["properties"][name]
        return next((s for s in found.get("anyOf", []) if s.get("type") != "null"), found)

    assert prop("BudgetIn", "daily_tokens")["maximum"] == BIGINT_MAX
    assert prop("BudgetIn", "max_output_tokens")["maximum"] == INTEGER_MAX
    assert prop("KeyCreate", "rate_limit_requests")["maximum"] == INTEGER_MAX
    assert prop("KeyUpdate", "rate_limit_window_seconds")["maximum"] == 31 * 86_400
    assert prop("RouteRollback", "version")["maximum"] == INTEGER_MAX
    assert prop("KeyCreate", "expires_at")["maximum"] == UNIX_SECONDS_MAX
    for model, name in (("KeyCreate", "name"), ("PriceIn", "model"),
                        ("AdminTokenCreate", "name"), ("RouteChange", "name")):
        text = prop(model, name)
        assert text["maxLength"] == 200 and "200 characters" in text["description"]
        assert text["pattern"] == "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    parameters = {p["name"]: p for p in openapi.document["paths"]["/admin/v1/keys/{key_id}"][
        "get"]["parameters"]}
    assert parameters["key_id"]["schema"]["maxLength"] == 200


# ---- what gets past the checks: the store's refusals are 400s too -------------------------

def test_a_value_the_store_cannot_hold_is_a_400_never_a_500(
    admin_gw: AdminGateway, openapi: OpenApi, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    """Were a check missed, the store's own refusals (sqlite3's OverflowError, Postgres's
    "out of range", psycopg's NUL) still answer in the API's shape."""
    store = admin_gw.gateway.store
    refusals: list[Exception] = [
        OverflowError("Python int too large to convert to SQLite INTEGER"),
        psycopg.errors.NumericValueOutOfRange("integer out of range"),
        psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
        psycopg.errors.DatetimeFieldOverflow("timestamp out of range"),
    ]
    with admin_gw.client() as c:
        for refusal in refusals:
            async def refuse(*args: Any, refusal: Exception = refusal, **kwargs: Any) -> None:
                raise refusal

            monkeypatch.setattr(store, "set_budget", refuse)
            message = refused(openapi, c.put("/budgets/subject/team-a", json={"daily_tokens": 5}))
            assert "out of the range" in message and "Traceback" not in message

        async def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(store, "set_budget", broken)
        failed = c.put("/budgets/subject/team-a", json={"daily_tokens": 5})
    # A bug is a 500, but in the API's shape, never a page of traceback.
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "gateway_error"
    assert "a bug" not in failed.text


def test_the_service_keeps_the_same_bounds_for_the_cli(tmp_path: Path) -> None:
    """The CLI acts through the same service: it refuses with one line, no traceback."""
    settings = load_settings({"DATABASE_URL": fresh_database_url(tmp_path)})

    async def work(service: AdminService) -> list[str]:
        said = []
        for attempt in (
            lambda: service.set_budget(BudgetScope.SUBJECT, "team-a",
                                       {"daily_tokens": BEYOND_64_BITS}),
            lambda: service.set_budget(BudgetScope.SUBJECT, "team-a",
                                       {"max_output_tokens": JUST_PAST_INTEGER}),
            lambda: service.set_budget(BudgetScope.SUBJECT, "team-a", {"daily_usd": "1" * 400}),
            lambda: service.create_key(name="x", rate_limit=(JUST_PAST_INTEGER, 60)),
            lambda: service.create_key(name="x", rate_limit=(1, 10**12)),
            lambda: service.create_key(name="x", expires_at=float("inf")),
            lambda: service.rollback_routes(BEYOND_64_BITS),
        ):
            with pytest.raises(Invalid) as caught:
                await attempt()
            said.append(str(caught.value))
        return said

    said = run_service(settings, work)
    assert all("expected" in line or "must be" in line for line in said), said
    assert json.dumps(said)  # plain text, one line each
