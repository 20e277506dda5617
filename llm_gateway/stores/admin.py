"""What the admin plane keeps, per aggregate: the records and the store protocols.

SQLite and Postgres implement these as mixins (``admin_sqlite.py``, ``admin_postgres.py``)
on their stores. Every method that changes something takes the ``AuditEvent`` that
describes the change and writes both in one transaction: a change is never without its
audit event, nor an event without its change. (Key creation and revocation reuse the key
store's own ``insert_key``/``revoke_key``; their event follows in a second statement.)

The engine reads prices and budgets through the same protocols (``Prices.price_at``,
``Budgets.budget``). Times are Unix seconds (float), as everywhere in the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from llm_gateway.billing.model import Budget, BudgetScope, Price
from llm_gateway.keys import KeyRecord
from llm_gateway.stores import Store


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One change: who made it (an admin token's name, or ``cli``), what, to what, the
    changed fields before and after (secrets already masked), and when."""

    id: str
    at: float
    actor: str
    action: str  # e.g. "key.create", "budget.set", "route.change"
    target: str  # e.g. "key:llmg_AbC1234", "budget:subject:team-a"
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AdminTokenRecord:
    """An admin token as stored: its lookup prefix and the SHA-256 of the whole token."""

    id: str
    name: str
    prefix: str
    token_hash: bytes
    created_at: float
    revoked_at: float | None = None
    last_used_at: float | None = None


@dataclass(frozen=True, slots=True)
class StoredProviderKey:
    """A provider's key sealed under LLM_GATEWAY_SECRET_KEY (see llm_gateway.crypto)."""

    name: str
    nonce: bytes
    ciphertext: bytes
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class RouteVersion:
    """One version of the routes overlay: ``{"providers": {...}, "models": {...}}``, whose
    entries replace the file's of the same name (``None`` removes one)."""

    version: int
    document: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    created_at: float = 0.0
    note: str = ""


class Audit(Protocol):
    async def write_audit(self, event: AuditEvent) -> None: ...
    async def audit_events(self, *, limit: int = 100, before: float | None = None,
                           target: str | None = None) -> list[AuditEvent]:
        """Newest first."""
        ...


class KeyAdmin(Protocol):
    async def update_key(self, record: KeyRecord, *, audit: AuditEvent) -> bool:
        """Write the record's editable fields (name, subject, models, rate limit, expiry)
        unless the key is revoked; False when it is (or does not exist)."""
        ...

    async def set_key_active(self, key_id: str, active: bool, *, audit: AuditEvent) -> bool:
        """Disable or enable a key that is not revoked; False when it is revoked."""
        ...


class AdminTokens(Protocol):
    async def insert_admin_token(self, record: AdminTokenRecord, *, audit: AuditEvent) -> None:
        ...

    async def admin_token_by_prefix(self, prefix: str) -> AdminTokenRecord | None: ...
    async def find_admin_token(self, prefix_or_id: str) -> AdminTokenRecord | None: ...
    async def list_admin_tokens(self) -> list[AdminTokenRecord]: ...
    async def revoke_admin_token(self, token_id: str, now: float, *, audit: AuditEvent) -> bool:
        ...

    async def touch_admin_token(self, token_id: str, now: float, *, stale_before: float) -> bool:
        """Set last_used_at to ``now`` unless it is already ``stale_before`` or later (use,
        not a change: no audit event); True when it was written."""
        ...


class Prices(Protocol):
    async def set_price(self, price: Price, *, audit: AuditEvent) -> None:
        """Insert, or replace the price of the same model from the same moment."""
        ...

    async def prices(self) -> list[Price]:
        """Every price, by provider, model and effective_from."""
        ...

    async def price_at(self, provider: str, model: str, at: float) -> Price | None:
        """The price in force at ``at``: the latest whose effective_from <= at."""
        ...


class Budgets(Protocol):
    async def set_budget(self, budget: Budget, *, audit: AuditEvent) -> None: ...
    async def budget(self, scope: BudgetScope, scope_id: str) -> Budget | None: ...
    async def budgets(self) -> list[Budget]: ...
    async def delete_budget(self, scope: BudgetScope, scope_id: str, *,
                            audit: AuditEvent) -> bool: ...


class ProviderKeys(Protocol):
    async def set_provider_key(self, key: StoredProviderKey, *, audit: AuditEvent) -> None:
        """Insert or replace (created_at of a replaced key is kept)."""
        ...

    async def provider_key(self, name: str) -> StoredProviderKey | None: ...
    async def provider_keys(self) -> list[StoredProviderKey]: ...
    async def delete_provider_key(self, name: str, *, audit: AuditEvent) -> bool: ...


class RouteVersions(Protocol):
    async def add_route_version(
        self, document: dict[str, Any], *, created_by: str, created_at: float, note: str,
        audit: Callable[[int], AuditEvent],
    ) -> RouteVersion:
        """Store ``document`` as the next version (numbered in the transaction, so two
        admins saving at once get two numbers); ``audit`` makes the event for that number."""
        ...

    async def route_version(self, version: int) -> RouteVersion | None: ...
    async def latest_route_version(self) -> RouteVersion | None: ...
    async def route_versions(self, *, limit: int = 50) -> list[RouteVersion]:
        """Newest first."""
        ...


class AdminStore(Store, Audit, KeyAdmin, AdminTokens, Prices, Budgets, ProviderKeys,
                 RouteVersions, Protocol):
    """A store the admin plane can run on: both SQLite and Postgres are one."""
