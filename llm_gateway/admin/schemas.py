"""The admin API's request and response bodies, as pydantic models: the OpenAPI document
(``GET /admin/v1/openapi.json``) is generated from these.

Money is a decimal string both ways (``"0.15"``): a JSON number would be a float, and a
float has already rounded the amount. Times are Unix seconds, as in the CLI's JSON.

What a request may carry is said once, by the types below, and every model and route
parameter uses them: an integer is a JSON integer (never ``true``, ``2.0`` or ``"2"``) within
what its column holds; a time is a finite number of Unix seconds; text is printable (the
gateway's rule for caller strings) and of a bounded length. A value outside them is
answered 400, never stored.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from llm_gateway import caller_text
from llm_gateway.admin.common import (
    BIGINT_MAX,
    INTEGER_MAX,
    MONEY_DECIMAL_DIGITS,
    MONEY_INTEGER_DIGITS,
    UNIX_SECONDS_MAX,
    WINDOW_SECONDS_MAX,
)

KeyState = Literal["active", "disabled", "revoked", "expired"]
Money = str  # in answers

# ---- what a request may carry -----------------------------------------------------------

# The one integer type: strict, within 64 bits; each use narrows it to its column.
WholeNumber = Annotated[int, Field(strict=True, ge=-BIGINT_MAX - 1, le=BIGINT_MAX)]
PositiveInteger = Annotated[WholeNumber, Field(
    ge=1, le=INTEGER_MAX, description=f"1 to {INTEGER_MAX} (a Postgres INTEGER)")]
TokenCount = Annotated[WholeNumber, Field(
    ge=0, le=BIGINT_MAX, description=f"0 to {BIGINT_MAX} tokens (a BIGINT)")]
TokenRate = Annotated[WholeNumber, Field(
    ge=1, le=BIGINT_MAX, description=f"1 to {BIGINT_MAX} tokens a minute (a BIGINT)")]
WindowSeconds = Annotated[WholeNumber, Field(
    ge=1, le=WINDOW_SECONDS_MAX, description=f"1 to {WINDOW_SECONDS_MAX} seconds (31 days)")]
UnixSeconds = Annotated[float, Field(
    strict=True, allow_inf_nan=False, ge=0, le=UNIX_SECONDS_MAX,
    description=f"Unix seconds, 0 to {UNIX_SECONDS_MAX:.0f} (9999-12-31T23:59:59Z)")]

# The one text type: the gateway's rule for any string it stores, logs or shows
# (llm_gateway.caller_text): valid Unicode (no lone surrogate: what is stored is UTF-8), no
# control characters (C0, DEL, C1: Postgres refuses NUL, a terminal runs ESC), no format
# characters (bidirectional overrides, zero-width) and no line or paragraph separators.
# The pattern is the part of it a JSON Schema can state (clients and schemathesis read it);
# the validator is the whole rule. Each use bounds the length.
ADMITTED_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
NAME_MAX_LENGTH = 200
SHORT_TEXT_MAX_LENGTH = 64
LONG_TEXT_MAX_LENGTH = 500
SECRET_MAX_LENGTH = 4096
ENTRY_TEXT_MAX_LENGTH = 4096
ALLOWED_MODELS_MAX = 1000
_PRINTABLE = "printable text (no control, format or separator characters)"


def _refusal(text: str, limit: int) -> str | None:
    """Why ``text`` is no admitted text, as a clause (``holds a control character
    (U+0000); ...``), or None."""
    problem = caller_text.refusal("text", text, limit)
    return None if problem is None else problem.removeprefix("'text' ")


def _admitted(text: str) -> str:
    if (problem := _refusal(text, len(text))) is not None:  # the length is the Field's
        raise ValueError(problem)
    return text


AdmittedText = Annotated[str, Field(pattern=ADMITTED_PATTERN), AfterValidator(_admitted)]
Name = Annotated[AdmittedText, Field(
    min_length=1, max_length=NAME_MAX_LENGTH,
    description=f"1 to {NAME_MAX_LENGTH} characters of {_PRINTABLE}")]
ShortText = Annotated[AdmittedText, Field(
    min_length=1, max_length=SHORT_TEXT_MAX_LENGTH,
    description=f"1 to {SHORT_TEXT_MAX_LENGTH} characters of {_PRINTABLE}")]
LongText = Annotated[AdmittedText, Field(
    max_length=LONG_TEXT_MAX_LENGTH,
    description=f"at most {LONG_TEXT_MAX_LENGTH} characters of {_PRINTABLE}")]
SecretText = Annotated[AdmittedText, Field(
    min_length=1, max_length=SECRET_MAX_LENGTH,
    description=f"1 to {SECRET_MAX_LENGTH} characters of {_PRINTABLE}")]

# Money in: the stored precision (1e-10 USD) and no more than the budget ledger counts.
MONEY_PATTERN = (rf"^[0-9]{{1,{MONEY_INTEGER_DIGITS}}}"
                 rf"(\.[0-9]{{1,{MONEY_DECIMAL_DIGITS}}})?$")
MONEY_RULE = (f"USD as a decimal string such as \"0.15\": at most {MONEY_INTEGER_DIGITS} "
              f"digits before the point and {MONEY_DECIMAL_DIGITS} after")
MoneyIn = Annotated[str, Field(pattern=MONEY_PATTERN, description=MONEY_RULE)]

# A routes entry is free-form JSON (the routing parser judges its meaning), but what it
# holds is stored too: the same text rule, numbers a store and JSON can keep.
ENTRY_MAX_DEPTH = 16


def _admitted_json(value: Any, where: str = "", depth: int = 0) -> None:
    """Raises ValueError naming where in the document (``targets[0].model``) it fails."""
    at = f"{where}: " if where else ""
    if depth > ENTRY_MAX_DEPTH:
        raise ValueError(f"{at}nested deeper than {ENTRY_MAX_DEPTH} levels")
    if isinstance(value, str):
        if (problem := _refusal(value, ENTRY_TEXT_MAX_LENGTH)) is not None:
            raise ValueError(f"{at}{problem}")
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
            raise ValueError(f"{at}an integer beyond 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{at}not a finite number")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _admitted_json(item, f"{where}[{index}]", depth + 1)
    elif isinstance(value, dict):
        for name, item in value.items():
            _admitted_json(name, f"{where} (a name)" if where else "a name", depth + 1)
            _admitted_json(item, f"{where}.{name}" if where else str(name), depth + 1)
    else:
        raise ValueError(f"{at}not JSON")


def _admitted_entry(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is not None:
        _admitted_json(entry)
    return entry


RouteEntry = Annotated[dict[str, Any] | None, AfterValidator(_admitted_entry)]


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
    rate_limit_burst: int | None = Field(description=(
        "the token bucket's capacity under RATE_LIMIT_ALGORITHM=token-bucket; null: the "
        "limit"))
    allowed_models: list[str]


class KeyCreated(Key):
    key: str = Field(description="The gateway key. Shown this once; only its hash is kept.")


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    subject_id: Name | None = Field(default=None, description="default: the key's name")
    rate_limit_requests: PositiveInteger = 60
    rate_limit_window_seconds: WindowSeconds = 60
    rate_limit_burst: PositiveInteger | None = Field(default=None, description=(
        "requests the key may send at once under RATE_LIMIT_ALGORITHM=token-bucket (its "
        "bucket's capacity, refilled at the limit per window); default: the limit"))
    allowed_models: list[Name] = Field(
        default_factory=list, max_length=ALLOWED_MODELS_MAX,
        description=f"at most {ALLOWED_MODELS_MAX} model names; none: every model")
    expires_at: UnixSeconds | None = None


class BudgetIn(BaseModel):
    """A budget's limits; a field left out or null is no limit of that kind."""

    model_config = ConfigDict(extra="forbid")
    daily_usd: MoneyIn | None = None
    monthly_usd: MoneyIn | None = None
    daily_tokens: TokenCount | None = None
    monthly_tokens: TokenCount | None = None
    tokens_per_minute: TokenRate | None = None
    max_output_tokens: PositiveInteger | None = None
    over_cap: Literal["clamp", "reject"] = "clamp"
    stop_streams_at_budget: bool = False


class KeyUpdate(BaseModel):
    """Only the fields sent change. ``budget`` replaces the key's own budget."""

    model_config = ConfigDict(extra="forbid")
    name: Name | None = None
    subject_id: Name | None = None
    rate_limit_requests: PositiveInteger | None = None
    rate_limit_window_seconds: WindowSeconds | None = None
    rate_limit_burst: PositiveInteger | None = Field(
        default=None, description="the token bucket's capacity; null: the limit")
    allowed_models: list[Name] | None = Field(
        default=None, max_length=ALLOWED_MODELS_MAX,
        description=f"at most {ALLOWED_MODELS_MAX} model names; empty: every model")
    expires_at: UnixSeconds | None = None
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


class BurnRate(BaseModel):
    per_hour: str = Field(description=(
        "spent per hour over the part of the window gone by: USD (a decimal string) for "
        "daily_usd and monthly_usd, tokens for daily_tokens and monthly_tokens"))
    runs_out_at: float | None = Field(description=(
        "when the limit is used up at that rate (Unix seconds); null: not before the "
        "window ends, nothing spent yet, or spent already"))
    exhausted: bool = Field(description="the limit is spent")


class BudgetWithSpend(Budget):
    label: str
    spent_today_usd: Money
    spent_month_usd: Money
    tokens_today: int
    tokens_month: int
    burn: dict[Literal["daily_usd", "monthly_usd", "daily_tokens", "monthly_tokens"],
               BurnRate] = Field(description="each limit the budget sets, by its field")


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
    provider: Name
    model: Name
    input_per_mtok: MoneyIn = Field(description="USD per million tokens")
    output_per_mtok: MoneyIn
    cached_input_per_mtok: MoneyIn | None = Field(
        default=None, description="prompt tokens read from the cache; default: input")
    cache_write_per_mtok: MoneyIn | None = Field(
        default=None, description="prompt tokens written to the cache; default: input")
    cache_write_1h_per_mtok: MoneyIn | None = Field(
        default=None, description="cache writes kept for an hour; default: cache_write")
    effective_from: ShortText | UnixSeconds | None = Field(
        default=None, description="ISO 8601 or Unix seconds; default: now")


class Price(BaseModel):
    provider: str
    model: str
    input_per_mtok: Money
    output_per_mtok: Money
    cached_input_per_mtok: Money | None
    cache_write_per_mtok: Money | None
    cache_write_1h_per_mtok: Money | None
    effective_from: float
    source: str = Field(default="operator", description="operator, provider or catalogue: "
                        "an operator's price in force outranks the others")
    long_context_above: int | None = Field(
        default=None, description="a prompt of more prompt tokens is billed at long_context")
    long_context: dict[str, Money | None] | None = None


class UsageRow(BaseModel):
    """One group of the billing report: its grouping fields (key_id, key_prefix, key_name,
    subject, protocol, model, provider, day: as asked with ``by``) and the totals. Prompt
    tokens count every input token, cache reads and writes included; completion tokens
    every output token, reasoning included."""

    model_config = ConfigDict(extra="allow")
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cache_read_tokens: int = Field(description="prompt tokens read from the prompt cache")
    cache_write_tokens: int = Field(description="prompt tokens written to the prompt cache")
    cache_write_1h_tokens: int = Field(description="of them, those kept for an hour")
    reasoning_tokens: int = Field(description="completion tokens spent reasoning")
    cost_usd: Money | None = Field(description="the sum of the gateway's prices alone")
    provider_cost_usd: Money | None = Field(
        default=None, description="the sum of every cost the providers reported")
    spend_usd: Money = Field(description=(
        "what the group cost as shown: each request at the gateway's price where one "
        "applied, else at the cost its provider reported (never both)"))
    provider_reported_usd: Money = Field(description=(
        "the part of spend_usd that is the providers' figure (requests without a price)"))
    cost_source: Literal["price", "provider", "mixed", "none"] = Field(description=(
        "where spend_usd came from: price (the gateway's prices), provider (the "
        "providers' reported cost, no price applied), mixed (both), none (no cost known)"))
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
    name: Name


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
    name: Name
    entry: RouteEntry
    note: LongText = ""


class RouteRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: PositiveInteger
    note: LongText = ""


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
    key: SecretText


class ProviderKey(BaseModel):
    name: str
    key: str | None = Field(description="masked (first 4 … last 4); null when it cannot be "
                                        "read with this gateway's LLM_GATEWAY_SECRET_KEY")
    created_at: float
    updated_at: float
