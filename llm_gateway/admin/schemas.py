"""The admin API's request and response bodies, as pydantic models: the OpenAPI document
(``GET /admin/v1/openapi.json``) is generated from these.

Money is a decimal string both ways (``"0.15"``): a JSON number would be a float, and a
float has already rounded the amount. Times are Unix seconds, as in the CLI's JSON.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MONEY_PATTERN = r"^\d+(\.\d+)?$"
Money = str
KeyState = Literal["active", "disabled", "revoked", "expired"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, as on the public API."""

    error: ErrorDetail


class Me(BaseModel):
    name: str
    prefix: str


# ---- keys ---------------------------------------------------------------------------------

class Key(BaseModel):
    id: str
    prefix: str
    name: str
    subject_id: str
    state: KeyState
    is_active: bool
    revoked_at: float | None
    expires_at: float | None
    created_at: float
    last_used_at: float | None
    rate_limit_requests: int
    rate_limit_window_seconds: int
    allowed_models: list[str]


class KeyCreated(Key):
    key: str = Field(description="The gateway key. Shown this once; only its hash is kept.")


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    subject_id: str | None = Field(default=None, min_length=1, max_length=200)
    rate_limit_requests: int = Field(default=60, gt=0)
    rate_limit_window_seconds: int = Field(default=60, gt=0)
    allowed_models: list[str] = Field(default_factory=list)
    expires_at: float | None = None


class BudgetIn(BaseModel):
    """A budget's limits; a field left out or null is no limit of that kind."""

    model_config = ConfigDict(extra="forbid")
    daily_usd: Money | None = Field(default=None, pattern=MONEY_PATTERN)
    monthly_usd: Money | None = Field(default=None, pattern=MONEY_PATTERN)
    daily_tokens: int | None = Field(default=None, ge=0)
    monthly_tokens: int | None = Field(default=None, ge=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    over_cap: Literal["clamp", "reject"] = "clamp"
    stop_streams_at_budget: bool = False


class KeyUpdate(BaseModel):
    """Only the fields sent change. ``budget`` replaces the key's own budget."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, min_length=1, max_length=200)
    subject_id: str | None = Field(default=None, min_length=1, max_length=200)
    rate_limit_requests: int | None = Field(default=None, gt=0)
    rate_limit_window_seconds: int | None = Field(default=None, gt=0)
    allowed_models: list[str] | None = None
    expires_at: float | None = None
    budget: BudgetIn | None = None


# ---- budgets, subjects, prices, usage -------------------------------------------------------

class Budget(BaseModel):
    scope: Literal["key", "subject"]
    scope_id: str
    daily_usd: Money | None
    monthly_usd: Money | None
    daily_tokens: int | None
    monthly_tokens: int | None
    tokens_per_minute: int | None
    max_output_tokens: int | None
    over_cap: Literal["clamp", "reject"]
    stop_streams_at_budget: bool


class BudgetWithSpend(Budget):
    label: str
    spent_today_usd: Money
    spent_month_usd: Money
    tokens_today: int
    tokens_month: int


class Subject(BaseModel):
    subject_id: str
    keys: list[Key] | None = Field(description="null when asked with keys=false")
    key_count: int
    active_key_count: int
    spend_today_usd: Money
    spend_month_usd: Money
    requests_month: int
    budget: BudgetWithSpend | None


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    input_per_mtok: Money = Field(pattern=MONEY_PATTERN, description="USD per million tokens")
    output_per_mtok: Money = Field(pattern=MONEY_PATTERN)
    cached_input_per_mtok: Money | None = Field(default=None, pattern=MONEY_PATTERN)
    effective_from: str | float | None = Field(
        default=None, description="ISO 8601 or Unix seconds; default: now")


class Price(BaseModel):
    provider: str
    model: str
    input_per_mtok: Money
    output_per_mtok: Money
    cached_input_per_mtok: Money | None
    effective_from: float


class UsageRow(BaseModel):
    """One group of the billing report: its grouping fields (key_id, key_prefix, key_name,
    subject, model, provider, day: as asked with ``by``) and the totals."""

    model_config = ConfigDict(extra="allow")
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: Money | None
    provider_cost_usd: Money | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None


class UsageReport(BaseModel):
    available: bool = Field(description="false while the gateway has no billing reports")
    by: list[str]
    since: float | None
    until: float | None
    rows: list[UsageRow]


# ---- audit, admin tokens --------------------------------------------------------------------

class AuditEvent(BaseModel):
    id: str
    at: float
    actor: str
    action: str
    target: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class AdminTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)


class AdminToken(BaseModel):
    id: str
    name: str
    prefix: str
    created_at: float
    revoked_at: float | None
    last_used_at: float | None


class AdminTokenCreated(AdminToken):
    token: str = Field(description="The admin token. Shown this once; only its hash is kept.")


# ---- routes and providers -----------------------------------------------------------------

class RouteChange(BaseModel):
    """Create or edit one provider or model alias (``entry`` as in the YAML file), or
    delete it (``entry`` null)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["provider", "model"]
    name: str = Field(min_length=1)
    entry: dict[str, Any] | None
    note: str = ""


class RouteRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)
    note: str = ""


class RouteVersion(BaseModel):
    version: int
    created_by: str
    created_at: float
    note: str
    document: dict[str, Any]


class ProviderView(BaseModel):
    name: str
    source: str = Field(description="file, settings, or db vN (the routes version)")
    base_url: str
    profile: str
    auth_header: str | None
    api_key_env: str | None
    key_configured: bool
    key_stored: bool
    max_concurrency: int
    default: bool


class TargetView(BaseModel):
    provider: str
    model: str
    weight: int
    priority: int
    health: str


class ModelView(BaseModel):
    name: str
    source: str
    context_window: int | None
    targets: list[TargetView]


class RoutesView(BaseModel):
    version: int | None = Field(description="the latest routes version in the database")
    default_provider: str
    unknown_models: str
    providers: list[ProviderView]
    models: list[ModelView]
    health: dict[str, str] = Field(description="target (provider/model) -> healthy, "
                                               "degraded or down")
    live: dict[str, Any] | None = Field(description="the gateway's own routing view, when "
                                                    "it serves one")


class ProviderKeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1)


class ProviderKey(BaseModel):
    name: str
    key: str | None = Field(description="masked (first 4 … last 4); null when it cannot be "
                                        "read with this gateway's LLM_GATEWAY_SECRET_KEY")
    created_at: float
    updated_at: float
