"""What every part of the admin service shares: its errors, who is acting, and how a change
becomes an audit event (changed fields only, secrets masked)."""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from llm_gateway.config import Settings
from llm_gateway.crypto import mask_secret
from llm_gateway.keys import KeyRecord
from llm_gateway.stores.admin import AdminStore, AuditEvent

if TYPE_CHECKING:
    from llm_gateway.engine import Gateway

# Fields whose values are secrets wherever they appear in an audit event.
SECRET_FIELDS = frozenset({"key", "token", "api_key", "secret"})

# What the store's columns hold (llm_gateway/stores/migrations.py), so that a value the
# admin plane accepts is one both stores can keep: Postgres INTEGER is 32 bits (rate
# limits, max_output_tokens, route versions); its BIGINT and every SQLite INTEGER 64 bits.
INTEGER_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1
# The last second a datetime (every report, the CLI's tables) can show, 9999-12-31T23:59:59Z;
# Postgres TIMESTAMPTZ goes further. Before 1970 is no time a key expires or a price starts.
UNIX_SECONDS_MAX = 253_402_300_799.0
# A rate limit's window: a month at most (a longer span is a budget's, which resets by
# the calendar).
WINDOW_SECONDS_MAX = 31 * 86_400
# Money, at the stored precision of 1e-10 USD: the budget ledger counts it in those units
# in a BIGINT, which holds 922 337 203 USD; eight digits before the point stay under that.
MONEY_INTEGER_DIGITS = 8
MONEY_DECIMAL_DIGITS = 10
MONEY_MAX = Decimal(10) ** MONEY_INTEGER_DIGITS - Decimal(10) ** -MONEY_DECIMAL_DIGITS


class AdminError(Exception):
    """A change the service refuses; str() is the one-line reason for the operator."""

    status = 400
    code = "invalid_request_body"


class Invalid(AdminError):
    pass


class Unprocessable(Invalid):
    """A value of the wrong type, or out of the range its column holds: 422, as the admin
    API answers every request its schemas refuse (the body was JSON, its values are not
    what they must be)."""

    status = 422


class NotFound(AdminError):
    status = 404
    code = "not_found"


class Conflict(AdminError):
    """The target's state forbids the change (e.g. a revoked key cannot be enabled)."""

    status = 409
    code = "conflict"


class NotConfigured(AdminError):
    """The gateway lacks a setting the change needs (e.g. LLM_GATEWAY_SECRET_KEY)."""

    status = 409
    code = "not_configured"


def whole_number(value: Any, what: str, minimum: int, maximum: int) -> int:
    """``value`` when it is an int (never a bool) from ``minimum`` to ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise Unprocessable(f"{what}: expected a whole number from {minimum} to {maximum}, "
                      f"got {value!r}")
    return value


def unix_seconds(value: Any, what: str) -> float:
    """``value`` as Unix seconds when it is a finite number (never a bool) from 0 to
    9999-12-31T23:59:59Z."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 <= value <= UNIX_SECONDS_MAX):
        raise Unprocessable(f"{what}: expected Unix seconds from 0 to {UNIX_SECONDS_MAX:.0f} "
                      f"(9999-12-31T23:59:59Z), got {value!r}")
    return float(value)


def masked(fields: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if fields is None:
        return None
    return {name: (mask_secret(str(value)) if name in SECRET_FIELDS and value else value)
            for name, value in fields.items()}


def changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[dict, dict]:
    """The fields that differ, as (before, after)."""
    names = [name for name in after if before.get(name) != after.get(name)]
    return {n: before.get(n) for n in names}, {n: after.get(n) for n in names}


def money_text(value: Decimal) -> str:
    """An exact amount with at least two decimals and no trailing zeros past them:
    ``5.0000000000`` -> ``5.00``, ``0.0000123000`` -> ``0.0000123``."""
    whole, _, fraction = format(value.normalize(), "f").partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def jsonable(value: Any) -> Any:
    """Decimals as exact strings: audit events and API answers never round money."""
    if isinstance(value, Decimal):
        return money_text(value)
    if isinstance(value, tuple | list):
        return [jsonable(item) for item in value]
    return value


def key_fields(record: KeyRecord) -> dict[str, Any]:
    """A key as shown anywhere (CLI --json, API, audit): never the key or its hash."""
    return {
        "id": record.id, "prefix": record.prefix, "name": record.name,
        "subject_id": record.subject_id, "is_active": record.is_active,
        "revoked_at": record.revoked_at, "expires_at": record.expires_at,
        "created_at": record.created_at, "last_used_at": record.last_used_at,
        "rate_limit_requests": record.rate_limit_requests,
        "rate_limit_window_seconds": record.rate_limit_window_seconds,
        "rate_limit_burst": record.rate_limit_burst,
        "allowed_models": list(record.allowed_models),
    }


def key_state(record: KeyRecord, now: float) -> str:
    """active, disabled, revoked or expired: what the console and CLI show."""
    refusal = record.refusal(now)
    if refusal is None:
        return "active"
    return "disabled" if refusal == "inactive" else refusal


def parse_time(text: str | float | int, what: str = "time") -> float:
    """Unix seconds from an ISO 8601 date or date-time (UTC unless it says otherwise) or
    from a number of Unix seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return unix_seconds(text, what)
    raw = str(text).strip()
    try:
        return unix_seconds(float(raw), what)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        seconds = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):  # OverflowError: 9999-12-31T23:59-01:00 is in 10000
        raise Unprocessable(f"{what}: expected ISO 8601 (2025-01-31 or 2025-01-31T12:00:00Z) "
                      f"or Unix seconds, got {raw!r}") from None
    return unix_seconds(seconds, what)


def day_start(now: float) -> float:
    """UTC midnight of ``now``'s day: where daily budgets reset."""
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_start(now: float) -> float:
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


class ServiceBase:
    """The state every operation needs: the store, who acts, the settings, the running
    gateway when there is one (the API's; the CLI has none)."""

    def __init__(
        self,
        store: AdminStore,
        *,
        actor: str,
        settings: Settings,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        gateway: Gateway | None = None,
    ) -> None:
        self.store = store
        self.actor = actor
        self.settings = settings
        # The environment the settings were read from (a process's own, unless a caller
        # handed load_settings another): where provider keys named by api_key_env live.
        self.environ = (environ if environ is not None else settings.environ
                        if settings.environ is not None else os.environ)
        self.clock = clock
        self.gateway = gateway

    def event(self, action: str, target: str, before: Mapping[str, Any] | None = None,
              after: Mapping[str, Any] | None = None) -> AuditEvent:
        def clean(fields: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return masked({k: jsonable(v) for k, v in fields.items()}) if fields else None

        return AuditEvent(id=str(uuid.uuid4()), at=self.clock(), actor=self.actor,
                          action=action, target=target, before=clean(before),
                          after=clean(after))

    def forget_key(self, prefix: str) -> None:
        """This process's gateway sees a key change at once (others within the cache's
        lifetime)."""
        if self.gateway is not None:
            self.gateway.auth.forget(prefix)
