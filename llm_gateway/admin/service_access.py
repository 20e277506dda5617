"""Who may administer: admin tokens (create, list, revoke, verify) and the audit log."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from llm_gateway.admin.common import Conflict, Invalid, NotFound, ServiceBase
from llm_gateway.admin.tokens import (
    TOKEN_PREFIX,
    is_well_formed_token,
    new_admin_token,
    token_matches,
    token_prefix,
)
from llm_gateway.auth import TOUCH_INTERVAL_SECONDS
from llm_gateway.keys import hash_matches
from llm_gateway.stores.admin import AdminStore, AdminTokenRecord, AuditEvent

# Compared against when a token's prefix is unknown, so that an unknown token and a wrong
# one cost the same work (the response time tells nothing about which prefixes exist).
_DUMMY_HASH = bytes(32)


def token_fields(record: AdminTokenRecord) -> dict[str, Any]:
    """An admin token as shown anywhere: never the token or its hash."""
    return {"id": record.id, "name": record.name, "prefix": record.prefix,
            "created_at": record.created_at, "revoked_at": record.revoked_at,
            "last_used_at": record.last_used_at}


def event_fields(event: AuditEvent) -> dict[str, Any]:
    return {"id": event.id, "at": event.at, "actor": event.actor, "action": event.action,
            "target": event.target, "before": event.before, "after": event.after}


async def verify_admin_token(store: AdminStore, token: str,
                             now: float | None = None) -> AdminTokenRecord | None:
    """The live admin token ``token`` is, or None. Never cached: a revoked token is refused
    from the next request on (the admin API is not a hot path).

    A token that authenticates has its ``last_used_at`` written, as a gateway key's is, at
    most once a minute: the lookup just read the stored time, so a busy console costs one
    write a minute per token, not one per call, whatever the number of replicas."""
    if not token.startswith(TOKEN_PREFIX) or not is_well_formed_token(token):
        return None
    record = await store.admin_token_by_prefix(token_prefix(token))
    if record is None:
        hash_matches(token, _DUMMY_HASH)
        return None
    if not token_matches(token, record) or record.revoked_at is not None:
        return None
    now = time.time() if now is None else now
    stale_before = now - TOUCH_INTERVAL_SECONDS
    if record.last_used_at is None or record.last_used_at < stale_before:
        # Conditional in the store too: of replicas racing here, one writes.
        await store.touch_admin_token(record.id, now, stale_before=stale_before)
        record = dataclasses.replace(record, last_used_at=now)
    return record


class AccessOps(ServiceBase):
    async def create_admin_token(self, name: str) -> tuple[AdminTokenRecord, str]:
        name = name.strip()
        if not name:
            raise Invalid("an admin token needs a name (the audit log names its actions by it)")
        if any(t.name == name and t.revoked_at is None
               for t in await self.store.list_admin_tokens()):
            raise Conflict(f"a live admin token is already named {name!r}")
        record, token = new_admin_token(name, self.clock())
        await self.store.insert_admin_token(record, audit=self.event(
            "admin_token.create", f"admin_token:{record.prefix}", None, token_fields(record)))
        return record, token

    async def list_admin_tokens(self) -> list[AdminTokenRecord]:
        return await self.store.list_admin_tokens()

    async def revoke_admin_token(self, prefix_or_id: str) -> AdminTokenRecord:
        record = await self.store.find_admin_token(prefix_or_id)
        if record is None:
            raise NotFound(f"no admin token with prefix or id {prefix_or_id!r}")
        if record.revoked_at is not None:
            return record
        now = self.clock()
        await self.store.revoke_admin_token(record.id, now, audit=self.event(
            "admin_token.revoke", f"admin_token:{record.prefix}", {"revoked_at": None},
            {"revoked_at": now}))
        return dataclasses.replace(record, revoked_at=now)

    async def audit_events(self, *, limit: int = 100, before: float | None = None,
                           target: str | None = None) -> list[AuditEvent]:
        if not 1 <= limit <= 1000:
            raise Invalid(f"limit: expected 1 to 1000, got {limit}")
        return await self.store.audit_events(limit=limit, before=before, target=target)
