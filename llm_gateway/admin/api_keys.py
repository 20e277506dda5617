"""Admin API: gateway keys, subjects, admin tokens, the audit log, and who is asking."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from llm_gateway.admin import schemas
from llm_gateway.admin.api_common import ERROR_RESPONSES, Service, Token, key_view
from llm_gateway.admin.service import event_fields, token_fields
from llm_gateway.billing.model import BudgetScope

router = APIRouter(prefix="/admin/v1", responses=ERROR_RESPONSES)

# A key by its id or 12-character prefix; an admin token by its id or 13-character prefix.
KeyRef = Annotated[schemas.Name, Path(description="the key's id or prefix")]
TokenRef = Annotated[schemas.Name, Path(description="the admin token's id or prefix")]


@router.get("/me", response_model=schemas.Me, summary="The admin token in use")
async def me(token: Token) -> dict[str, Any]:
    return {"name": token.name, "prefix": token.prefix}


# ---- keys -----------------------------------------------------------------------------------

@router.get("/keys", response_model=list[schemas.Key], summary="Every key (prefixes only)")
async def list_keys(service: Service) -> list[dict[str, Any]]:
    return [key_view(record) for record in await service.list_keys()]


@router.post("/keys", response_model=schemas.KeyCreated, status_code=201,
             summary="Create a key; the key is in this answer and nowhere else")
async def create_key(body: schemas.KeyCreate, service: Service) -> dict[str, Any]:
    record, key = await service.create_key(
        name=body.name, subject_id=body.subject_id,
        rate_limit=(body.rate_limit_requests, body.rate_limit_window_seconds),
        models=tuple(body.allowed_models), expires_at=body.expires_at,
        burst=body.rate_limit_burst,
    )
    return {**key_view(record), "key": key}


@router.get("/keys/{key_id}", response_model=schemas.Key,
            summary="One key, by id or 12-character prefix")
async def show_key(key_id: KeyRef, service: Service) -> dict[str, Any]:
    return key_view(await service.find_key(key_id))


@router.patch("/keys/{key_id}", response_model=schemas.Key,
              summary="Change a key's name, subject, models, rate limit, expiry or budget")
async def update_key(key_id: KeyRef, body: schemas.KeyUpdate, service: Service) -> dict[str, Any]:
    fields = body.model_dump(exclude_unset=True, exclude={"budget"})
    record = await service.update_key(key_id, fields)
    if "budget" in body.model_fields_set:
        if body.budget is None:
            budget = await service.store.budget(BudgetScope.KEY, record.id)
            if budget is not None:
                await service.delete_budget(BudgetScope.KEY, record.id)
        else:
            await service.set_budget(BudgetScope.KEY, record.id, body.budget.model_dump())
    return key_view(record)


@router.post("/keys/{key_id}/disable", response_model=schemas.Key,
             summary="Refuse the key until it is enabled again (reversible)")
async def disable_key(key_id: KeyRef, service: Service) -> dict[str, Any]:
    return key_view(await service.set_key_enabled(key_id, False))


@router.post("/keys/{key_id}/enable", response_model=schemas.Key,
             summary="Accept a disabled key again (never a revoked one)")
async def enable_key(key_id: KeyRef, service: Service) -> dict[str, Any]:
    return key_view(await service.set_key_enabled(key_id, True))


@router.post("/keys/{key_id}/revoke", response_model=schemas.Key,
             summary="Refuse the key for good")
async def revoke_key(key_id: KeyRef, service: Service) -> dict[str, Any]:
    return key_view(await service.revoke_key(key_id))


@router.post("/keys/{key_id}/rotate", response_model=schemas.KeyCreated, status_code=201,
             summary="A new key with the same settings; the old one is revoked")
async def rotate_key(key_id: KeyRef, service: Service) -> dict[str, Any]:
    record, key = await service.rotate_key(key_id)
    return {**key_view(record), "key": key}


@router.get("/subjects", response_model=list[schemas.Subject],
            summary="Subjects with their keys, spend and budget")
async def subjects(
    service: Service,
    keys: Annotated[bool, Query(description="list each subject's keys (else counts only)")] = True,
) -> list[dict[str, Any]]:
    return await service.subjects(with_keys=keys)


# ---- admin tokens and the audit log ---------------------------------------------------------

@router.get("/admin-tokens", response_model=list[schemas.AdminToken],
            summary="Every admin token (prefixes only)")
async def list_admin_tokens(service: Service) -> list[dict[str, Any]]:
    return [token_fields(record) for record in await service.list_admin_tokens()]


@router.post("/admin-tokens", response_model=schemas.AdminTokenCreated, status_code=201,
             summary="Create an admin token; the token is in this answer and nowhere else")
async def create_admin_token(body: schemas.AdminTokenCreate, service: Service) -> dict[str, Any]:
    record, token = await service.create_admin_token(body.name)
    return {**token_fields(record), "token": token}


@router.post("/admin-tokens/{token_id}/revoke", response_model=schemas.AdminToken,
             summary="Revoke an admin token, by id or 13-character prefix")
async def revoke_admin_token(token_id: TokenRef, service: Service) -> dict[str, Any]:
    return token_fields(await service.revoke_admin_token(token_id))


@router.get("/audit", response_model=list[schemas.AuditEvent],
            summary="Audit events, newest first")
async def audit(
    service: Service,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[schemas.UnixSeconds | None, Query(
        strict=False, description="Unix seconds: events older")] = None,
    target: Annotated[schemas.LongText | None, Query(description="e.g. key:llmg_AbC1234")] = None,
) -> list[dict[str, Any]]:
    events = await service.audit_events(limit=limit, before=before, target=target)
    return [event_fields(event) for event in events]
