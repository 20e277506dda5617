"""The admin API under ``/admin/v1``: FastAPI for this listener only (the request hot path
stays plain ASGI). Its OpenAPI document, generated from the pydantic models in
``schemas``, is served without authentication at ``GET /admin/v1/openapi.json``; every
other route needs an admin token. Every error is OpenAI-shaped, as on the public API."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from llm_gateway import errors
from llm_gateway.admin import api_billing, api_keys, api_routes
from llm_gateway.admin.common import AdminError
from llm_gateway.engine import Gateway
from llm_gateway.stores import StoreUnavailable

OPENAPI_PATH = "/admin/v1/openapi.json"


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
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return _answer(400, "invalid_request_body", message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return _answer(405, "method_not_allowed",
                       f"{request.method} is not allowed on {request.url.path}.")
    return _rejection(errors.not_found(request.method, request.url.path))


async def _store_down(request: Request, exc: Exception) -> Response:
    return _rejection(errors.key_store_unavailable())


def _version() -> str:
    try:
        return importlib.metadata.version("llm-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "0"


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
    api.openapi = lambda: _openapi(api)  # type: ignore[method-assign]
    return api


def _openapi(api: FastAPI) -> dict[str, Any]:
    """FastAPI's document, without the 422 answers it lists by default: a malformed
    request is answered 400 in OpenAI's shape here (documented on every route)."""
    if api.openapi_schema is None:
        document = get_openapi(title=api.title, version=api.version,
                               description=api.description, routes=api.routes)
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        api.openapi_schema = document
    return api.openapi_schema
