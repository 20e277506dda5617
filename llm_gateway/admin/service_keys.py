"""Gateway keys through the admin service: create, find, update, disable, enable, revoke,
rotate. The rules about a key's life live here, once: a revoked key stays revoked (it
cannot be updated, enabled, disabled or rotated); the other changes are reversible."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from llm_gateway.admin.common import (
    INTEGER_MAX,
    WINDOW_SECONDS_MAX,
    Conflict,
    Invalid,
    NotFound,
    ServiceBase,
    changed,
    key_fields,
    unix_seconds,
    whole_number,
)
from llm_gateway.billing.model import BudgetScope
from llm_gateway.keys import DEFAULT_RATE_LIMIT, KeyRecord, new_key_record

# What ``update_key`` may change, by field name.
EDITABLE_KEY_FIELDS = frozenset({
    "name", "subject_id", "allowed_models", "rate_limit_requests",
    "rate_limit_window_seconds", "rate_limit_burst", "expires_at",
})


def _target(record: KeyRecord) -> str:
    return f"key:{record.prefix}"


def _check_key_fields(fields: Mapping[str, Any]) -> None:
    if "name" in fields and not str(fields["name"] or "").strip():
        raise Invalid("a key needs a name")
    if "subject_id" in fields and not str(fields["subject_id"] or "").strip():
        raise Invalid("a key's subject cannot be empty")
    if "rate_limit_requests" in fields:
        whole_number(fields["rate_limit_requests"], "rate_limit_requests", 1, INTEGER_MAX)
    if "rate_limit_window_seconds" in fields:
        whole_number(fields["rate_limit_window_seconds"], "rate_limit_window_seconds", 1,
                     WINDOW_SECONDS_MAX)
    if fields.get("rate_limit_burst") is not None:  # None: the limit
        whole_number(fields["rate_limit_burst"], "rate_limit_burst", 1, INTEGER_MAX)
    if fields.get("expires_at") is not None:
        unix_seconds(fields["expires_at"], "expires_at")


class KeyOps(ServiceBase):
    async def create_key(
        self, *, name: str, subject_id: str | None = None,
        rate_limit: tuple[int, int] = DEFAULT_RATE_LIMIT, models: tuple[str, ...] = (),
        expires_at: float | None = None, burst: int | None = None,
    ) -> tuple[KeyRecord, str]:
        """A new key; the plaintext is returned here and nowhere else, ever."""
        _check_key_fields({"name": name, "rate_limit_requests": rate_limit[0],
                           "rate_limit_window_seconds": rate_limit[1], "expires_at": expires_at,
                           "rate_limit_burst": burst,
                           **({"subject_id": subject_id} if subject_id is not None else {})})
        record, key = new_key_record(
            name=name, subject_id=subject_id, now=self.clock(),
            rate_limit_requests=rate_limit[0], rate_limit_window_seconds=rate_limit[1],
            allowed_models=tuple(models), expires_at=expires_at, rate_limit_burst=burst,
        )
        await self.store.insert_key(record)
        await self.store.write_audit(self.event("key.create", _target(record),
                                                after=key_fields(record)))
        return record, key

    async def find_key(self, prefix_or_id: str) -> KeyRecord:
        record = await self.store.find_key(prefix_or_id)
        if record is None:
            raise NotFound(f"no key with prefix or id {prefix_or_id!r}")
        return record

    async def list_keys(self) -> list[KeyRecord]:
        return await self.store.list_keys()

    def _not_revoked(self, record: KeyRecord, doing: str) -> None:
        if record.revoked_at is not None:
            raise Conflict(f"key {record.prefix}… is revoked; a revoked key cannot be {doing}")

    async def update_key(self, prefix_or_id: str, fields: Mapping[str, Any]) -> KeyRecord:
        """Change the editable fields given; no change, no audit event."""
        if unknown := sorted(set(fields) - EDITABLE_KEY_FIELDS):
            raise Invalid(f"a key has no editable field {unknown[0]!r}")
        _check_key_fields(fields)
        record = await self.find_key(prefix_or_id)
        self._not_revoked(record, "updated")
        values = dict(fields)
        if "allowed_models" in values:
            values["allowed_models"] = tuple(values["allowed_models"] or ())
        updated = dataclasses.replace(record, **values)
        before, after = changed(key_fields(record), key_fields(updated))
        if not after:
            return record
        if not await self.store.update_key(
                updated, audit=self.event("key.update", _target(record), before, after)):
            raise Conflict(f"key {record.prefix}… was revoked meanwhile")
        self.forget_key(record.prefix)
        return updated

    async def set_key_enabled(self, prefix_or_id: str, enabled: bool) -> KeyRecord:
        """The reversible kill switch; effective on every replica within the key cache's
        lifetime."""
        record = await self.find_key(prefix_or_id)
        self._not_revoked(record, "enabled" if enabled else "disabled")
        if record.is_active == enabled:
            return record
        action = "key.enable" if enabled else "key.disable"
        event = self.event(action, _target(record), {"is_active": record.is_active},
                           {"is_active": enabled})
        if not await self.store.set_key_active(record.id, enabled, audit=event):
            raise Conflict(f"key {record.prefix}… was revoked meanwhile")
        self.forget_key(record.prefix)
        return dataclasses.replace(record, is_active=enabled)

    async def revoke_key(self, prefix_or_id: str) -> KeyRecord:
        """Final. Revoking a revoked key changes nothing (and writes no event)."""
        record = await self.find_key(prefix_or_id)
        if record.revoked_at is not None:
            return record
        now = self.clock()
        if await self.store.revoke_key(record.id, now):
            await self.store.write_audit(self.event(
                "key.revoke", _target(record), {"revoked_at": None, "is_active": record.is_active},
                {"revoked_at": now, "is_active": False}))
        self.forget_key(record.prefix)
        return dataclasses.replace(record, is_active=False, revoked_at=now)

    async def rotate_key(self, prefix_or_id: str) -> tuple[KeyRecord, str]:
        """A new key with the old one's settings (and budget); the old one is revoked."""
        old = await self.find_key(prefix_or_id)
        self._not_revoked(old, "rotated")
        record, key = new_key_record(
            name=old.name, subject_id=old.subject_id, now=self.clock(),
            rate_limit_requests=old.rate_limit_requests,
            rate_limit_window_seconds=old.rate_limit_window_seconds,
            allowed_models=old.allowed_models, expires_at=old.expires_at,
            rate_limit_burst=old.rate_limit_burst,
        )
        record = dataclasses.replace(record, is_active=old.is_active)
        await self.store.insert_key(record)
        await self.store.revoke_key(old.id, self.clock())
        await self.store.write_audit(self.event(
            "key.rotate", _target(old), {"prefix": old.prefix, "id": old.id},
            {"prefix": record.prefix, "id": record.id}))
        budget = await self.store.budget(BudgetScope.KEY, old.id)
        if budget is not None:
            moved = dataclasses.replace(budget, scope_id=record.id)
            await self.store.set_budget(moved, audit=self.event(
                "budget.set", f"budget:key:{record.prefix}", None,
                {"copied_from": f"key:{old.prefix}"}))
        self.forget_key(old.prefix)
        return record, key
