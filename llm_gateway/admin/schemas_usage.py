"""The admin API's answer for one request's records (``GET /admin/v1/usage/{request_id}``):
what ``llm_gateway.billing.lookup.request_view`` shows, field for field; and the refusals
(``GET /admin/v1/refusals``), ``llm_gateway.billing.refusals``' report."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llm_gateway.admin.schemas import Money


class UsageTarget(BaseModel):
    provider: str | None = Field(description="the provider that answered (or was tried last)")
    upstream_model: str | None = Field(description="the model, as the provider names it")


class UsageError(BaseModel):
    code: str
    message: str | None = Field(description="the start of the error's message")


class UsageTimings(BaseModel):
    duration_ms: float
    ttfb_ms: float | None = Field(description="until the upstream's response headers")
    first_chunk_ms: float | None = Field(description="until a stream's first event")
    max_gap_ms: float | None = Field(description="a stream's longest pause between events")


class UsageTokens(BaseModel):
    prompt: int = Field(description="every input token, cache reads and writes included")
    completion: int = Field(description="every output token, reasoning included")
    total: int
    cache_read: int
    cache_write: int
    cache_write_1h: int
    reasoning: int
    estimated: bool = Field(description="the provider reported none: the gateway counted")


class UsageCost(BaseModel):
    cost_usd: Money | None = Field(description="from the gateway's prices; null: no price")
    provider_cost_usd: Money | None = Field(description="what the provider reported")
    provider_cost_diem: Money | None
    source: Literal["price", "provider", "none"] = Field(description=(
        "what the request was charged and is shown at: the gateway's price, else the "
        "provider's reported cost, else none known"))


class UsageRequest(BaseModel):
    """One request's usage record."""

    request_id: str
    trace_id: str | None
    started_at: float
    key_id: str | None
    key_prefix: str
    subject_id: str
    end_user: str | None = Field(description="the body's user (metadata.user_id: Messages)")
    tags: dict[str, str] = Field(description="x-llm-gateway-tags and the body's metadata")
    adapter: str
    protocol: str
    endpoint: str
    model: str | None = Field(description="as the caller named it")
    stream: bool
    target: UsageTarget
    attempts: int
    status: int
    error: UsageError | None
    timings: UsageTimings
    tokens: UsageTokens
    cost: UsageCost
    response_id: str | None
    finish_reasons: list[str]


class UsageRequests(BaseModel):
    id: str = Field(description="the x-request-id or x-trace-id asked for")
    records: list[UsageRequest] = Field(
        description="a request id's one record, or a trace id's, oldest first")


class RefusalRow(BaseModel):
    """The requests refused with one status and code (in one group of ``by``)."""

    status: int
    code: str = Field(description="the error code the gateway answered (its error table's)")
    requests: int
    key_id: str | None = Field(default=None, description=(
        "by key: the key refused (null: none authenticated, as for invalid_api_key)"))
    key_name: str | None = None
    key_prefix: str | None = None
    subject: str | None = Field(default=None, description="by subject (null: no key)")
    day: str | None = Field(default=None, description="by day: YYYY-MM-DD, UTC")


class RefusalReport(BaseModel):
    by: list[str]
    since: float | None
    until: float | None
    rows: list[RefusalRow] = Field(description=(
        "requests the gateway answered itself before admission (no usage record, not in "
        "the usage report's errors), counted per minute by every replica"))
