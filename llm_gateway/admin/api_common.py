"""What every admin API route shares: the admin-token check that yields the acting
``AdminService``, and the error answers every route may give (OpenAI's shape)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from llm_gateway.admin.common import AdminError, key_fields, key_state
from llm_gateway.admin.schemas import ErrorResponse
from llm_gateway.admin.service import AdminService, verify_admin_token
from llm_gateway.keys import KeyRecord
from llm_gateway.stores.admin import AdminTokenRecord

# Documented on every authenticated route, so every answer is in the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "the body is not JSON, or the change is refused (the message says why)"),
        (401, "no admin token, a revoked or unknown one, or a gateway key"),
        (404, "no such key, budget, price, route or token"),
        (409, "the target's state forbids the change (e.g. a revoked key)"),
        (422, "a value of the wrong type or out of its range (the message names the field)"),
        (503, "the store is not reachable"),
    )
}

_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                     description="An admin token (llmga_…): `llm-gateway admin-tokens create`")


class Unauthorized(AdminError):
    status = 401
    code = "invalid_api_key"


async def admin_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> AdminTokenRecord:
    gateway = request.app.state.gateway
    await gateway.start()  # idempotent: the store is migrated before the first answer
    if credentials is None:
        raise Unauthorized("Missing admin token: send 'Authorization: Bearer <admin token>'.")
    record = await verify_admin_token(gateway.store, credentials.credentials)
    if record is None:
        if credentials.credentials.startswith("llmg_"):
            raise Unauthorized("A gateway key is not an admin token.")
        raise Unauthorized("Invalid or revoked admin token.")
    return record


async def admin_service(
    request: Request, token: Annotated[AdminTokenRecord, Depends(admin_token)]
) -> AdminService:
    """The service acting as the token's name: what its changes are audited under."""
    gateway = request.app.state.gateway
    return AdminService(gateway.store, actor=token.name, settings=gateway.settings,
                        gateway=gateway)


Service = Annotated[AdminService, Depends(admin_service)]
Token = Annotated[AdminTokenRecord, Depends(admin_token)]


def key_view(record: KeyRecord) -> dict[str, Any]:
    return {**key_fields(record), "state": key_state(record, time.time())}
