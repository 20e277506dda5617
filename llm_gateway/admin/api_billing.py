"""Admin API: budgets (with what they spent), prices, usage reports and refusals."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from llm_gateway.admin import schemas, schemas_usage
from llm_gateway.admin.api_common import ERROR_RESPONSES, Service
from llm_gateway.admin.common import parse_time
from llm_gateway.admin.service import OPTIONAL_RATES, budget_fields, price_fields
from llm_gateway.billing.model import BudgetScope
from llm_gateway.billing.refusals import GROUPS as REFUSAL_GROUPS
from llm_gateway.billing.reports import GROUPS

router = APIRouter(prefix="/admin/v1", responses=ERROR_RESPONSES)

# A key (by id or prefix) or a subject id: a subject's budget stores it.
ScopeRef = Annotated[schemas.Name, Path(description="a key's id or prefix, or a subject id")]


@router.get("/budgets", response_model=list[schemas.BudgetWithSpend],
            summary="Every budget, with what its key or subject spent today and this month")
async def list_budgets(
    service: Service, scope: Annotated[BudgetScope | None, Query()] = None,
) -> list[dict[str, Any]]:
    return await service.budgets_with_spend(scope)


@router.get("/budgets/{scope}/{scope_id}", response_model=schemas.Budget,
            summary="One budget: scope key (id or prefix) or subject")
async def show_budget(scope: BudgetScope, scope_id: ScopeRef, service: Service) -> dict[str, Any]:
    return budget_fields(await service.budget(scope, scope_id))


@router.put("/budgets/{scope}/{scope_id}", response_model=schemas.Budget,
            summary="Set a budget (every limit; one left out or null is no limit)")
async def put_budget(scope: BudgetScope, scope_id: ScopeRef, body: schemas.BudgetIn,
                     service: Service) -> dict[str, Any]:
    return budget_fields(await service.set_budget(scope, scope_id, body.model_dump()))


@router.delete("/budgets/{scope}/{scope_id}", status_code=204, response_class=Response,
               summary="Remove a budget")
async def delete_budget(scope: BudgetScope, scope_id: ScopeRef, service: Service) -> Response:
    await service.delete_budget(scope, scope_id)
    return Response(status_code=204)


@router.get("/prices", response_model=list[schemas.Price],
            summary="Every price, by provider, model and effective time")
async def list_prices(service: Service) -> list[dict[str, Any]]:
    return [price_fields(price) for price in await service.prices()]


@router.post("/prices", response_model=schemas.Price, status_code=201,
             summary="Set a model's price from a moment on (default: now)")
async def set_price(body: schemas.PriceIn, service: Service) -> dict[str, Any]:
    price = await service.set_price(
        provider=body.provider, model=body.model, input_per_mtok=body.input_per_mtok,
        output_per_mtok=body.output_per_mtok,
        effective_from=(None if body.effective_from is None
                        else parse_time(body.effective_from, "effective_from")),
        **{name: getattr(body, name) for name in OPTIONAL_RATES},
    )
    return price_fields(price)


@router.get("/usage", response_model=schemas.UsageReport,
            summary="Usage report: requests, tokens, cost, errors, latency per group")
async def usage(
    service: Service,
    by: Annotated[schemas.ShortText, Query(description=f"{', '.join(GROUPS)}; "
                                         "comma-separated for several (day,model)")] = "day",
    since: Annotated[schemas.ShortText | None, Query(
        description="ISO 8601 or Unix seconds")] = None,
    until: Annotated[schemas.ShortText | None, Query(
        description="ISO 8601 or Unix seconds")] = None,
    top: Annotated[int | None, Query(ge=1, le=10_000, description=(
        "only the N groups that cost most (spend_usd; most requests first among equal "
        "cost), "
        "highest first"))] = None,
    latency: Annotated[bool, Query(description=(
        "false: latency_p50_ms and latency_p95_ms are null, and the report is cheaper "
        "(they cost a sort per group)"))] = True,
) -> dict[str, Any]:
    groups = [name.strip() for name in by.split(",") if name.strip()]
    start = parse_time(since, "since") if since else None
    end = parse_time(until, "until") if until else None
    rows = await service.usage(groups, start, end, latency=latency)
    if rows is not None and top is not None:
        # A console card of the five keys that spend most should not carry a thousand.
        rows = sorted(rows, key=lambda row: (Decimal(row["spend_usd"]), row["requests"]),
                      reverse=True)[:top]
    return {"available": rows is not None, "by": groups, "since": start, "until": end,
            "rows": [_jsonable_row(row) for row in rows or []]}


@router.get("/usage/{request_id}", response_model=schemas_usage.UsageRequests,
            summary="One request's record, by its x-request-id or x-trace-id (404: none)")
async def usage_of_request(
    service: Service,
    request_id: Annotated[schemas.Name, Path(
        description="the x-request-id or x-trace-id the client got")],
) -> dict[str, Any]:
    return {"id": request_id, "records": await service.usage_of(request_id)}


@router.get("/refusals", response_model=schemas_usage.RefusalReport,
            summary="Requests the gateway refused before admission, by status and code")
async def refusals(
    service: Service,
    by: Annotated[schemas.ShortText | None, Query(description=(
        f"some of {', '.join(REFUSAL_GROUPS)} (comma-separated); every row is one status "
        "and code"))] = None,
    since: Annotated[schemas.ShortText | None, Query(
        description="ISO 8601 or Unix seconds")] = None,
    until: Annotated[schemas.ShortText | None, Query(
        description="ISO 8601 or Unix seconds")] = None,
) -> dict[str, Any]:
    groups = [name.strip() for name in (by or "").split(",") if name.strip()]
    start = parse_time(since, "since") if since else None
    end = parse_time(until, "until") if until else None
    rows = await service.refusals(groups, start, end)
    return {"by": groups, "since": start, "until": end, "rows": rows}


def _jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    """Money stays exact: Decimals become strings."""
    return {name: (str(value) if name.endswith("_usd") and value is not None else value)
            for name, value in row.items()}
