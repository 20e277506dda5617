"""The admin API under ``/admin/v1``: FastAPI for this listener only (the request hot path
stays plain ASGI). Its OpenAPI document, generated from the pydantic models in
``schemas``, is served without authentication at ``GET /admin/v1/openapi.json``; every
other route needs an admin token. Every error is OpenAI-shaped, as on the public API."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from llm_gateway import errors
from llm_gateway.admin import api_billing, api_keys, api_routes
from llm_gateway.admin.api_common import ERROR_RESPONSES
from llm_gateway.admin.common import BIGINT_MAX, AdminError
from llm_gateway.admin.schemas import ADMITTED_PATTERN, MONEY_PATTERN, MONEY_RULE
from llm_gateway.engine import Gateway
from llm_gateway.stores import StoreUnavailable
from llm_gateway.version import VERSION

OPENAPI_PATH = "/admin/v1/openapi.json"
_log = logging.getLogger(__name__)
# What a pattern's mismatch means, said instead of the pattern itself.
_PATTERN_MEANINGS = {
    ADMITTED_PATTERN: "holds a control character; it must be printable text",
    MONEY_PATTERN: f"expected {MONEY_RULE}",
}


def _answer(status: int, code: str, message: str,
            headers: dict[str, str] | None = None) -> Response:
    kind = errors.CATALOGUE.get(code)
    body = errors.error_body(message, kind.type if kind else "invalid_request_error", code)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def _rejection(rejection: errors.Rejection) -> Response:
    return Response(rejection.body, status_code=rejection.status,
                    headers=dict(rejection.headers), media_type="application/json")


async def _admin_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AdminError)
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    return _answer(exc.status, exc.code, str(exc), headers)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    found = exc.errors() or [{"loc": (), "msg": "invalid request", "type": ""}]
    # Of a union's (``string | number``) errors, the one about the value, not its type.
    first = next((e for e in found if not str(e.get("type", "")).endswith("_type")), found[0])
    if first.get("type") == "json_invalid":
        return _answer(400, "invalid_json", "The body is not JSON.")
    where = ".".join(str(part) for part in first.get("loc", ()) if _is_field(part))
    context = first.get("ctx") or {}
    said = first.get("msg")
    if first.get("type") == "string_pattern_mismatch":
        said = _PATTERN_MEANINGS.get(context.get("pattern"), said)
    elif first.get("type") == "value_error" and "error" in context:
        said = str(context["error"])  # our own validator's words, without "Value error, "
    message = f"{where}: {said}" if where else str(said)
    return _answer(422, "invalid_request_body", message)


def _is_field(part: object) -> bool:
    """A location part that names a field or an index, not "body" nor a union member's
    type (``constrained-str``, ``function-after[...]``, ``float``)."""
    if isinstance(part, int):
        return True
    text = str(part)
    return text != "body" and text.isidentifier() and text not in {
        "str", "int", "float", "bool", "dict", "list", "none"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return _answer(405, "method_not_allowed",
                       f"{request.method} is not allowed on {request.url.path}.")
    if exc.status_code == 400:  # FastAPI's own: a body it could not read (nested too deep)
        return _answer(400, "invalid_json", "The body could not be read as JSON.")
    return _rejection(errors.not_found(request.method, request.url.path))


async def _value_refused(request: Request, exc: Exception) -> Response:
    """A value the request checks let through but a store or the standard library cannot
    hold (an integer beyond SQLite's 64 bits, a Postgres "out of range", a NUL): the
    request's fault, so a 422 in the API's shape, never a 500 with a traceback."""
    _log.warning("admin API: %s %s refused by the store: %r", request.method,
                 request.url.path, exc)
    return _answer(422, "invalid_request_body",
                   "A value in the request is out of the range the store can hold.")


async def _constraint_refused(request: Request, exc: Exception) -> Response:
    """A change the store's constraints refuse (a race with another admin the service's
    own checks could not see, e.g. two live tokens of one name)."""
    _log.warning("admin API: %s %s refused by a constraint: %r", request.method,
                 request.url.path, exc)
    return _answer(409, "conflict", "The store refused the change: it conflicts with "
                                    "what is stored.")


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Anything else still answers in the API's shape (the traceback goes to the log)."""
    return _answer(500, "gateway_error", "The admin API failed on this request.")


async def _store_down(request: Request, exc: Exception) -> Response:
    return _rejection(errors.key_store_unavailable())


def _version() -> str:
    return VERSION


def build_admin_api(gateway: Gateway) -> FastAPI:
    """The /admin/v1 application for ``gateway`` (its store, settings, auth cache)."""
    api = FastAPI(
        title="llm-gateway admin API", version=_version(), openapi_url=OPENAPI_PATH,
        # Swagger UI and ReDoc load their assets from a CDN: the console is the UI here.
        docs_url=None, redoc_url=None,
        description="Keys, budgets, prices, routes, usage and the audit log of an "
                    "llm-gateway. Authenticate with an admin token: "
                    "`Authorization: Bearer llmga_…`.",
    )
    api.state.gateway = gateway
    for router in (api_keys.router, api_billing.router, api_routes.router):
        api.include_router(router)
    api.add_exception_handler(AdminError, _admin_error)
    api.add_exception_handler(RequestValidationError, _invalid_request)
    api.add_exception_handler(HTTPException, _http_error)
    api.add_exception_handler(StoreUnavailable, _store_down)
    # OverflowError: sqlite3's "Python int too large to convert to SQLite INTEGER", and
    # datetime's; psycopg.DataError: SQLSTATE class 22 (numeric or datetime out of range)
    # and the driver's own refusal of NUL in text.
    for refused in (OverflowError, sqlite3.DataError, *_postgres_errors("DataError")):
        api.add_exception_handler(refused, _value_refused)
    for constraint in (sqlite3.IntegrityError, *_postgres_errors("IntegrityError")):
        api.add_exception_handler(constraint, _constraint_refused)
    api.add_exception_handler(Exception, _unexpected)
    api.openapi = lambda: _openapi(api)  # type: ignore[method-assign]
    return api


def _postgres_errors(name: str) -> tuple[type[Exception], ...]:
    """psycopg's error class ``name`` where the postgres extra is installed, else none."""
    try:
        import psycopg
    except ModuleNotFoundError:
        return ()
    return (getattr(psycopg, name),)


def _openapi(api: FastAPI) -> dict[str, Any]:
    """FastAPI's document, without the 422 answers it lists by default (its own shape): a
    request the schemas refuse is answered 422 in OpenAI's shape here, one that is no JSON
    400 (both documented on every route)."""
    if api.openapi_schema is None:
        document = get_openapi(title=api.title, version=api.version,
                               description=api.description, routes=api.routes)
        unprocessable = ERROR_RESPONSES[422]["description"]
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if "422" in responses:  # FastAPI's own shape, or ours: ours
                    responses["422"] = {"description": unprocessable, "content": {
                        "application/json": {"schema": {
                            "$ref": "#/components/schemas/ErrorResponse"}}}}
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        _exact_integer_bounds(document)
        api.openapi_schema = document
    return api.openapi_schema


# FastAPI's OpenAPI model keeps minimum and maximum as floats: BIGINT_MAX (2**63 - 1) came
# out as 2**63, one past what the column holds. The bounds past a float's 53 bits that the
# schemas use, exactly (those below come back exact from int()).
_EXACT_BOUNDS = {float(bound): bound for bound in (BIGINT_MAX, -BIGINT_MAX - 1)}
_BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_integer_bounds(node: Any) -> None:
    """An integer schema's bounds as the integers they were (2**53 and beyond included)."""
    if isinstance(node, list):
        for item in node:
            _exact_integer_bounds(item)
    elif isinstance(node, dict):
        if node.get("type") == "integer":
            for keyword in _BOUND_KEYWORDS:
                bound = node.get(keyword)
                if isinstance(bound, float) and bound.is_integer():
                    node[keyword] = _EXACT_BOUNDS.get(bound, int(bound))
        for value in node.values():
            _exact_integer_bounds(value)
