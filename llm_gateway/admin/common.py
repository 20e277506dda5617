"""What every part of the admin service shares: its errors, who is acting, and how a change
becomes an audit event (changed fields only, secrets masked)."""

from __future__ import annotations

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


class AdminError(Exception):
    """A change the service refuses; str() is the one-line reason for the operator."""

    status = 400
    code = "invalid_request_body"


class Invalid(AdminError):
    pass


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
        return float(text)
    raw = str(text).strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(f"{what}: expected ISO 8601 (2025-01-31 or 2025-01-31T12:00:00Z) "
                      f"or Unix seconds, got {raw!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


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
