"""Admin API: routes (providers and model aliases, versioned), and provider keys."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from llm_gateway.admin import schemas
from llm_gateway.admin.api_common import ERROR_RESPONSES, Service
from llm_gateway.stores.admin import RouteVersion

router = APIRouter(prefix="/admin/v1", responses=ERROR_RESPONSES)

ProviderName = Annotated[schemas.Name, Path(description="the provider's name in the routes")]


def _version_view(version: RouteVersion) -> dict[str, Any]:
    return {"version": version.version, "created_by": version.created_by,
            "created_at": version.created_at, "note": version.note,
            "document": version.document}


@router.get("/routes", response_model=schemas.RoutesView,
            summary="The effective routes, where each comes from, and health per target")
async def routes(service: Service) -> dict[str, Any]:
    return await service.routes()


@router.post("/routes", response_model=schemas.RouteVersion, status_code=201,
             summary="Create, edit or delete one provider or model alias (a new version)")
async def change_route(body: schemas.RouteChange, service: Service) -> dict[str, Any]:
    return _version_view(await service.change_route(body.kind, body.name, body.entry,
                                                    body.note))


@router.post("/routes/rollback", response_model=schemas.RouteVersion, status_code=201,
             summary="A new version equal to an old one")
async def rollback_routes(body: schemas.RouteRollback, service: Service) -> dict[str, Any]:
    return _version_view(await service.rollback_routes(body.version, body.note))


@router.get("/routes/versions", response_model=list[schemas.RouteVersion],
            summary="Routes versions, newest first")
async def route_versions(
    service: Service, limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    return [_version_view(version) for version in await service.route_versions(limit)]


@router.get("/provider-keys", response_model=list[schemas.ProviderKey],
            summary="Provider keys stored encrypted, masked")
async def provider_keys(service: Service) -> list[dict[str, Any]]:
    return await service.provider_keys()


@router.put("/provider-keys/{name}", response_model=schemas.ProviderKey,
            summary="Store a provider's key, encrypted under LLM_GATEWAY_SECRET_KEY")
async def set_provider_key(name: ProviderName, body: schemas.ProviderKeyIn,
                           service: Service) -> dict[str, Any]:
    return await service.set_provider_key(name, body.key)


@router.delete("/provider-keys/{name}", status_code=204, response_class=Response,
               summary="Remove a stored provider key")
async def delete_provider_key(name: ProviderName, service: Service) -> Response:
    await service.delete_provider_key(name)
    return Response(status_code=204)
