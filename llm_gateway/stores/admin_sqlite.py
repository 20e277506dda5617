"""The admin plane's tables on SQLite: a mixin of ``SqliteStore`` (its one connection and
worker thread, through ``_run``). Money is kept as exact decimal text, never REAL."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from llm_gateway.billing.model import (
    Budget,
    BudgetScope,
    OverCap,
    Price,
    PriceSource,
    money,
    rates_of,
    with_long_context,
)
from llm_gateway.keys import KeyRecord
from llm_gateway.stores.admin import (
    AdminTokenRecord,
    AuditEvent,
    RouteVersion,
    StoredProviderKey,
)

_PRICE_COLUMNS = ("provider, model, input_per_mtok, output_per_mtok, cached_input_per_mtok, "
                  "cache_write_per_mtok, cache_write_1h_per_mtok, effective_from, source, "
                  "long_context_above, long_input_per_mtok, long_output_per_mtok, "
                  "long_cached_input_per_mtok, long_cache_write_per_mtok, "
                  "long_cache_write_1h_per_mtok")
# An upsert of a price: a catalogue or provider row never replaces an operator's.
_PRICE_UPDATES = ", ".join(f"{name} = excluded.{name}"
                           for name in _PRICE_COLUMNS.split(", ")[2:] if name != "effective_from")
_BUDGET_COLUMNS = ("scope, scope_id, daily_usd, monthly_usd, daily_tokens, monthly_tokens, "
                   "tokens_per_minute, max_output_tokens, over_cap, stop_streams_at_budget")
_TOKEN_COLUMNS = "id, name, prefix, token_hash, created_at, revoked_at, last_used_at"
_ROUTE_COLUMNS = "version, document, created_by, created_at, note"


def _text(value: Decimal | None) -> str | None:
    return None if value is None else str(money(value))


def _decimal(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)

# price_at's order: the best-ranked source first (llm_gateway.billing.prices.RANK).
_RANK = ("CASE source WHEN 'operator' THEN 0 WHEN 'provider' THEN 1 ELSE 2 END")


def _row_to_price(row: tuple[Any, ...]) -> Price:
    price = Price(provider=row[0], model=row[1], input_per_mtok=Decimal(row[2]),
                  output_per_mtok=Decimal(row[3]), cached_input_per_mtok=_decimal(row[4]),
                  cache_write_per_mtok=_decimal(row[5]),
                  cache_write_1h_per_mtok=_decimal(row[6]), effective_from=row[7],
                  source=PriceSource(row[8]))
    return with_long_context(price, row[9], tuple(_decimal(text) for text in row[10:15]))


def _row_to_budget(row: tuple[Any, ...]) -> Budget:
    return Budget(scope=BudgetScope(row[0]), scope_id=row[1], daily_usd=_decimal(row[2]),
                  monthly_usd=_decimal(row[3]), daily_tokens=row[4], monthly_tokens=row[5],
                  tokens_per_minute=row[6], max_output_tokens=row[7],
                  over_cap=OverCap(row[8]), stop_streams_at_budget=bool(row[9]))


def _row_to_token(row: tuple[Any, ...]) -> AdminTokenRecord:
    return AdminTokenRecord(id=row[0], name=row[1], prefix=row[2], token_hash=bytes(row[3]),
                            created_at=row[4], revoked_at=row[5], last_used_at=row[6])


def _row_to_route(row: tuple[Any, ...]) -> RouteVersion:
    return RouteVersion(version=row[0], document=json.loads(row[1]), created_by=row[2],
                        created_at=row[3], note=row[4])


def _row_to_event(row: tuple[Any, ...]) -> AuditEvent:
    return AuditEvent(id=row[0], at=row[1], actor=row[2], action=row[3], target=row[4],
                      before=json.loads(row[5]) if row[5] else None,
                      after=json.loads(row[6]) if row[6] else None)


def _json(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def _insert_audit(db: sqlite3.Connection, event: AuditEvent) -> None:
    db.execute(
        "INSERT INTO audit_events (id, at, actor, action, target, before, after) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (event.id, event.at, event.actor, event.action, event.target, _json(event.before),
         _json(event.after)),
    )


def _audited[T](db: sqlite3.Connection, event: AuditEvent, work: Callable[[], T]) -> T:
    """``work`` and its audit event in one transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = work()
        _insert_audit(db, event)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return result


class AdminSqliteMixin:
    if TYPE_CHECKING:
        async def _run[R](self, work: Callable[[sqlite3.Connection], R]) -> R: ...

    # ---- audit ----------------------------------------------------------------------

    async def write_audit(self, event: AuditEvent) -> None:
        await self._run(lambda db: _insert_audit(db, event))

    async def audit_events(self, *, limit: int = 100, before: float | None = None,
                           target: str | None = None) -> list[AuditEvent]:
        rows = await self._run(lambda db: db.execute(
            "SELECT id, at, actor, action, target, before, after FROM audit_events "
            "WHERE (? IS NULL OR at < ?) AND (? IS NULL OR target = ?) "
            "ORDER BY at DESC, rowid DESC LIMIT ?",
            (before, before, target, target, limit),
        ).fetchall())
        return [_row_to_event(row) for row in rows]

    # ---- keys -----------------------------------------------------------------------

    async def update_key(self, record: KeyRecord, *, audit: AuditEvent) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            return _audited(db, audit, lambda: db.execute(
                "UPDATE gateway_keys SET name = ?, subject_id = ?, allowed_models = ?, "
                "rate_limit_requests = ?, rate_limit_window_seconds = ?, rate_limit_burst = ?, "
                "expires_at = ? WHERE id = ? AND revoked_at IS NULL",
                (record.name, record.subject_id, json.dumps(list(record.allowed_models)),
                 record.rate_limit_requests, record.rate_limit_window_seconds,
                 record.rate_limit_burst, record.expires_at, record.id),
            ).rowcount == 1)

        return await self._run(work)

    async def set_key_active(self, key_id: str, active: bool, *, audit: AuditEvent) -> bool:
        return await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            "UPDATE gateway_keys SET is_active = ? WHERE id = ? AND revoked_at IS NULL",
            (int(active), key_id),
        ).rowcount == 1))

    # ---- admin tokens ---------------------------------------------------------------

    async def insert_admin_token(self, record: AdminTokenRecord, *, audit: AuditEvent) -> None:
        values = (record.id, record.name, record.prefix, record.token_hash, record.created_at,
                  record.revoked_at, record.last_used_at)
        await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            f"INSERT INTO admin_tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", values
        )))

    async def admin_token_by_prefix(self, prefix: str) -> AdminTokenRecord | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_TOKEN_COLUMNS} FROM admin_tokens WHERE prefix = ?", (prefix,)
        ).fetchone())
        return _row_to_token(row) if row else None

    async def find_admin_token(self, prefix_or_id: str) -> AdminTokenRecord | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_TOKEN_COLUMNS} FROM admin_tokens WHERE prefix = ? OR id = ?",
            (prefix_or_id[:13], prefix_or_id),
        ).fetchone())
        return _row_to_token(row) if row else None

    async def list_admin_tokens(self) -> list[AdminTokenRecord]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_TOKEN_COLUMNS} FROM admin_tokens ORDER BY created_at"
        ).fetchall())
        return [_row_to_token(row) for row in rows]

    async def revoke_admin_token(self, token_id: str, now: float, *, audit: AuditEvent) -> bool:
        return await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            "UPDATE admin_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (now, token_id),
        ).rowcount == 1))

    async def touch_admin_token(self, token_id: str, now: float, *, stale_before: float) -> bool:
        cursor = await self._run(lambda db: db.execute(
            "UPDATE admin_tokens SET last_used_at = ? "
            "WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)",
            (now, token_id, stale_before),
        ))
        return bool(cursor.rowcount == 1)

    # ---- prices ---------------------------------------------------------------------

    async def set_price(self, price: Price, *, audit: AuditEvent) -> None:
        values = (price.provider, price.model, *map(_text, rates_of(price)),
                  price.effective_from, price.source.value, price.long_context_above,
                  *map(_text, rates_of(price.long_context)))
        await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            f"INSERT INTO prices ({_PRICE_COLUMNS}) "
            f"VALUES ({', '.join('?' * len(values))}) "
            f"ON CONFLICT (provider, model, effective_from) DO UPDATE SET {_PRICE_UPDATES} "
            "WHERE prices.source <> 'operator' OR excluded.source = 'operator'", values
        )))

    async def prices(self) -> list[Price]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_PRICE_COLUMNS} FROM prices ORDER BY provider, model, effective_from"
        ).fetchall())
        return [_row_to_price(row) for row in rows]

    async def price_at(self, provider: str, model: str, at: float) -> Price | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_PRICE_COLUMNS} FROM prices WHERE provider = ? AND model = ? "
            "AND effective_from <= ? ORDER BY "
            f"{_RANK}, effective_from DESC LIMIT 1",
            (provider, model, at),
        ).fetchone())
        return _row_to_price(row) if row else None

    # ---- budgets --------------------------------------------------------------------

    async def set_budget(self, budget: Budget, *, audit: AuditEvent) -> None:
        values = (budget.scope.value, budget.scope_id, _text(budget.daily_usd),
                  _text(budget.monthly_usd), budget.daily_tokens, budget.monthly_tokens,
                  budget.tokens_per_minute, budget.max_output_tokens, budget.over_cap.value,
                  int(budget.stop_streams_at_budget))
        await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            f"INSERT OR REPLACE INTO budgets ({_BUDGET_COLUMNS}) VALUES ({', '.join('?' * 10)})",
            values,
        )))

    async def budget(self, scope: BudgetScope, scope_id: str) -> Budget | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_BUDGET_COLUMNS} FROM budgets WHERE scope = ? AND scope_id = ?",
            (scope.value, scope_id),
        ).fetchone())
        return _row_to_budget(row) if row else None

    async def budgets(self) -> list[Budget]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_BUDGET_COLUMNS} FROM budgets ORDER BY scope, scope_id"
        ).fetchall())
        return [_row_to_budget(row) for row in rows]

    async def delete_budget(self, scope: BudgetScope, scope_id: str, *,
                            audit: AuditEvent) -> bool:
        return await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            "DELETE FROM budgets WHERE scope = ? AND scope_id = ?", (scope.value, scope_id)
        ).rowcount == 1))

    # ---- provider keys --------------------------------------------------------------

    async def set_provider_key(self, key: StoredProviderKey, *, audit: AuditEvent) -> None:
        values = (key.name, key.nonce, key.ciphertext, key.created_at, key.updated_at)
        await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            "INSERT INTO provider_keys (name, nonce, ciphertext, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET nonce = excluded.nonce, "
            "ciphertext = excluded.ciphertext, updated_at = excluded.updated_at", values,
        )))

    async def provider_key(self, name: str) -> StoredProviderKey | None:
        row = await self._run(lambda db: db.execute(
            "SELECT name, nonce, ciphertext, created_at, updated_at FROM provider_keys "
            "WHERE name = ?", (name,),
        ).fetchone())
        return StoredProviderKey(row[0], bytes(row[1]), bytes(row[2]), row[3], row[4]) \
            if row else None

    async def provider_keys(self) -> list[StoredProviderKey]:
        rows = await self._run(lambda db: db.execute(
            "SELECT name, nonce, ciphertext, created_at, updated_at FROM provider_keys "
            "ORDER BY name"
        ).fetchall())
        return [StoredProviderKey(r[0], bytes(r[1]), bytes(r[2]), r[3], r[4]) for r in rows]

    async def delete_provider_key(self, name: str, *, audit: AuditEvent) -> bool:
        return await self._run(lambda db: _audited(db, audit, lambda: db.execute(
            "DELETE FROM provider_keys WHERE name = ?", (name,)
        ).rowcount == 1))

    # ---- route versions -------------------------------------------------------------

    async def add_route_version(
        self, document: dict[str, Any], *, created_by: str, created_at: float, note: str,
        audit: Callable[[int], AuditEvent],
    ) -> RouteVersion:
        def work(db: sqlite3.Connection) -> RouteVersion:
            db.execute("BEGIN IMMEDIATE")  # the write lock: the next number is ours
            try:
                number = db.execute(
                    "SELECT coalesce(max(version), 0) + 1 FROM route_versions").fetchone()[0]
                db.execute(f"INSERT INTO route_versions ({_ROUTE_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                           (number, json.dumps(document), created_by, created_at, note))
                _insert_audit(db, audit(number))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return RouteVersion(number, document, created_by, created_at, note)

        return await self._run(work)

    async def route_version(self, version: int) -> RouteVersion | None:
        row = await self._run(lambda db: db.execute(
            f"SELECT {_ROUTE_COLUMNS} FROM route_versions WHERE version = ?", (version,)
        ).fetchone())
        return _row_to_route(row) if row else None

    async def latest_route_version(self) -> RouteVersion | None:
        versions = await self.route_versions(limit=1)
        return versions[0] if versions else None

    async def route_versions(self, *, limit: int = 50) -> list[RouteVersion]:
        rows = await self._run(lambda db: db.execute(
            f"SELECT {_ROUTE_COLUMNS} FROM route_versions ORDER BY version DESC LIMIT ?",
            (limit,),
        ).fetchall())
        return [_row_to_route(row) for row in rows]
