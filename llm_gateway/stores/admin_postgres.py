"""The admin plane's tables on Postgres: a mixin of ``PostgresStore`` (its pool, through
``connection`` and ``_read``). Money is NUMERIC (Decimal in Python); times convert in SQL
(``to_timestamp``, ``extract(epoch …)``), so this module needs nothing of the host's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from llm_gateway.billing.model import (
    Budget,
    BudgetScope,
    OverCap,
    Price,
    PriceSource,
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

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.AsyncConnection[tuple[Any, ...]]


def _epoch(column: str) -> str:
    return f"extract(epoch from {column})::float8"


_PRICE_SELECT = ("provider, model, input_per_mtok, output_per_mtok, cached_input_per_mtok, "
                 "cache_write_per_mtok, cache_write_1h_per_mtok, " + _epoch("effective_from")
                 + ", source, long_context_above, long_input_per_mtok, long_output_per_mtok, "
                 "long_cached_input_per_mtok, long_cache_write_per_mtok, "
                 "long_cache_write_1h_per_mtok")
_PRICE_WRITTEN = [name for name in _PRICE_SELECT.split(", ")[2:] if "(" not in name]
_BUDGET_COLUMNS = ("scope, scope_id, daily_usd, monthly_usd, daily_tokens, monthly_tokens, "
                   "tokens_per_minute, max_output_tokens, over_cap, stop_streams_at_budget")
_TOKEN_SELECT = ("id, name, prefix, token_hash, " + _epoch("created_at") + ", "
                 + _epoch("revoked_at") + ", " + _epoch("last_used_at"))
_ROUTE_SELECT = "version, document, created_by, " + _epoch("created_at") + ", note"
_EVENT_SELECT = "id, " + _epoch("at") + ", actor, action, target, before, after"
_PROVIDER_KEY_SELECT = ("name, nonce, ciphertext, " + _epoch("created_at") + ", "
                        + _epoch("updated_at"))


def _as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None

# price_at's order: the best-ranked source first (llm_gateway.billing.prices.RANK).
_RANK = ("CASE source WHEN 'operator' THEN 0 WHEN 'provider' THEN 1 ELSE 2 END")


def _row_to_price(row: tuple[Any, ...]) -> Price:
    price = Price(provider=row[0], model=row[1], input_per_mtok=row[2], output_per_mtok=row[3],
                  cached_input_per_mtok=row[4], cache_write_per_mtok=row[5],
                  cache_write_1h_per_mtok=row[6], effective_from=row[7],
                  source=PriceSource(row[8]))
    return with_long_context(price, row[9], tuple(row[10:15]))


def _row_to_budget(row: tuple[Any, ...]) -> Budget:
    return Budget(scope=BudgetScope(row[0]), scope_id=row[1], daily_usd=row[2],
                  monthly_usd=row[3], daily_tokens=row[4], monthly_tokens=row[5],
                  tokens_per_minute=row[6], max_output_tokens=row[7],
                  over_cap=OverCap(row[8]), stop_streams_at_budget=row[9])


def _row_to_token(row: tuple[Any, ...]) -> AdminTokenRecord:
    return AdminTokenRecord(id=str(row[0]), name=row[1], prefix=row[2],
                            token_hash=bytes(row[3]), created_at=row[4], revoked_at=row[5],
                            last_used_at=row[6])


def _row_to_route(row: tuple[Any, ...]) -> RouteVersion:
    return RouteVersion(version=row[0], document=row[1], created_by=row[2], created_at=row[3],
                        note=row[4])


def _row_to_event(row: tuple[Any, ...]) -> AuditEvent:
    return AuditEvent(id=str(row[0]), at=row[1], actor=row[2], action=row[3], target=row[4],
                      before=row[5], after=row[6])


def _row_to_provider_key(row: tuple[Any, ...]) -> StoredProviderKey:
    return StoredProviderKey(row[0], bytes(row[1]), bytes(row[2]), row[3], row[4])


def _jsonb(value: dict[str, Any] | None) -> Jsonb | None:
    # str for what JSON has no type for (Decimal): the service hands over strings anyway.
    return None if value is None else Jsonb(value, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)


async def _insert_audit(conn: Connection, event: AuditEvent) -> None:
    await conn.execute(
        "INSERT INTO audit_events (id, at, actor, action, target, before, after) "
        "VALUES (%s, to_timestamp(%s), %s, %s, %s, %s, %s)",
        (uuid.UUID(event.id), event.at, event.actor, event.action, event.target,
         _jsonb(event.before), _jsonb(event.after)),
    )


class AdminPostgresMixin:
    if TYPE_CHECKING:
        def connection(self) -> AbstractAsyncContextManager[Connection]: ...
        async def _read[R](self, work: Callable[[Connection], Awaitable[R]]) -> R: ...

    async def _audited(self, event: AuditEvent, statement: str,
                       params: tuple[Any, ...]) -> int:
        """One statement and its audit event in one transaction; the rows it changed."""
        async with self.connection() as conn, conn.transaction():
            cursor = await conn.execute(statement, params)  # type: ignore[arg-type]
            await _insert_audit(conn, event)
            return cursor.rowcount

    async def _rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async def read(conn: Connection) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(statement, params)  # type: ignore[arg-type]
            return await cursor.fetchall()

        return await self._read(read)

    # ---- audit ----------------------------------------------------------------------

    async def write_audit(self, event: AuditEvent) -> None:
        async with self.connection() as conn:
            await _insert_audit(conn, event)

    async def audit_events(self, *, limit: int = 100, before: float | None = None,
                           target: str | None = None) -> list[AuditEvent]:
        rows = await self._rows(
            f"SELECT {_EVENT_SELECT} FROM audit_events "
            "WHERE (%s::float8 IS NULL OR at < to_timestamp(%s::float8)) "
            "AND (%s::text IS NULL OR target = %s) ORDER BY at DESC, id LIMIT %s",
            (before, before, target, target, limit),
        )
        return [_row_to_event(row) for row in rows]

    # ---- keys -----------------------------------------------------------------------

    async def update_key(self, record: KeyRecord, *, audit: AuditEvent) -> bool:
        return await self._audited(
            audit,
            "UPDATE gateway_keys SET name = %s, subject_id = %s, allowed_models = %s, "
            "rate_limit_requests = %s, rate_limit_window_seconds = %s, rate_limit_burst = %s, "
            "expires_at = to_timestamp(%s::float8) WHERE id = %s AND revoked_at IS NULL",
            (record.name, record.subject_id, list(record.allowed_models),
             record.rate_limit_requests, record.rate_limit_window_seconds,
             record.rate_limit_burst, record.expires_at, uuid.UUID(record.id)),
        ) == 1

    async def set_key_active(self, key_id: str, active: bool, *, audit: AuditEvent) -> bool:
        return await self._audited(
            audit, "UPDATE gateway_keys SET is_active = %s WHERE id = %s AND revoked_at IS NULL",
            (active, uuid.UUID(key_id)),
        ) == 1

    # ---- admin tokens ---------------------------------------------------------------

    async def insert_admin_token(self, record: AdminTokenRecord, *, audit: AuditEvent) -> None:
        await self._audited(
            audit,
            "INSERT INTO admin_tokens (id, name, prefix, token_hash, created_at) "
            "VALUES (%s, %s, %s, %s, to_timestamp(%s))",
            (uuid.UUID(record.id), record.name, record.prefix, record.token_hash,
             record.created_at),
        )

    async def admin_token_by_prefix(self, prefix: str) -> AdminTokenRecord | None:
        rows = await self._rows(
            f"SELECT {_TOKEN_SELECT} FROM admin_tokens WHERE prefix = %s", (prefix,))
        return _row_to_token(rows[0]) if rows else None

    async def find_admin_token(self, prefix_or_id: str) -> AdminTokenRecord | None:
        token_id = _as_uuid(prefix_or_id)
        rows = await self._rows(
            f"SELECT {_TOKEN_SELECT} FROM admin_tokens WHERE prefix = %s OR id = %s",
            (prefix_or_id[:13], token_id),
        )
        return _row_to_token(rows[0]) if rows else None

    async def list_admin_tokens(self) -> list[AdminTokenRecord]:
        rows = await self._rows(f"SELECT {_TOKEN_SELECT} FROM admin_tokens ORDER BY created_at")
        return [_row_to_token(row) for row in rows]

    async def revoke_admin_token(self, token_id: str, now: float, *, audit: AuditEvent) -> bool:
        return await self._audited(
            audit, "UPDATE admin_tokens SET revoked_at = to_timestamp(%s) "
                   "WHERE id = %s AND revoked_at IS NULL",
            (now, uuid.UUID(token_id)),
        ) == 1

    async def touch_admin_token(self, token_id: str, now: float, *, stale_before: float) -> bool:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "UPDATE admin_tokens SET last_used_at = to_timestamp(%s) WHERE id = %s "
                "AND (last_used_at IS NULL OR last_used_at < to_timestamp(%s))",
                (now, uuid.UUID(token_id), stale_before),
            )
            return cursor.rowcount == 1

    # ---- prices ---------------------------------------------------------------------

    async def set_price(self, price: Price, *, audit: AuditEvent) -> None:
        # An upsert: a catalogue or provider row never replaces an operator's.
        await self._audited(
            audit,
            "INSERT INTO prices (provider, model, effective_from, " + ", ".join(_PRICE_WRITTEN)
            + ") VALUES (%s, %s, to_timestamp(%s), " + ", ".join(["%s"] * len(_PRICE_WRITTEN))
            + ") ON CONFLICT (provider, model, effective_from) DO UPDATE SET "
            + ", ".join(f"{name} = excluded.{name}" for name in _PRICE_WRITTEN)
            + " WHERE prices.source <> 'operator' OR excluded.source = 'operator'",
            (price.provider, price.model, price.effective_from, *rates_of(price),
             price.source.value, price.long_context_above, *rates_of(price.long_context)),
        )

    async def prices(self) -> list[Price]:
        rows = await self._rows(
            f"SELECT {_PRICE_SELECT} FROM prices ORDER BY provider, model, effective_from")
        return [_row_to_price(row) for row in rows]

    async def price_at(self, provider: str, model: str, at: float) -> Price | None:
        rows = await self._rows(
            f"SELECT {_PRICE_SELECT} FROM prices WHERE provider = %s AND model = %s "
            "AND effective_from <= to_timestamp(%s) ORDER BY "
            f"{_RANK}, effective_from DESC LIMIT 1",
            (provider, model, at),
        )
        return _row_to_price(rows[0]) if rows else None

    # ---- budgets --------------------------------------------------------------------

    async def set_budget(self, budget: Budget, *, audit: AuditEvent) -> None:
        columns = _BUDGET_COLUMNS.split(", ")
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
        await self._audited(
            audit,
            f"INSERT INTO budgets ({_BUDGET_COLUMNS}) VALUES ({', '.join(['%s'] * 10)}) "
            f"ON CONFLICT (scope, scope_id) DO UPDATE SET {updates}",
            (budget.scope.value, budget.scope_id, budget.daily_usd, budget.monthly_usd,
             budget.daily_tokens, budget.monthly_tokens, budget.tokens_per_minute,
             budget.max_output_tokens, budget.over_cap.value, budget.stop_streams_at_budget),
        )

    async def budget(self, scope: BudgetScope, scope_id: str) -> Budget | None:
        rows = await self._rows(
            f"SELECT {_BUDGET_COLUMNS} FROM budgets WHERE scope = %s AND scope_id = %s",
            (scope.value, scope_id),
        )
        return _row_to_budget(rows[0]) if rows else None

    async def budgets(self) -> list[Budget]:
        rows = await self._rows(f"SELECT {_BUDGET_COLUMNS} FROM budgets ORDER BY scope, scope_id")
        return [_row_to_budget(row) for row in rows]

    async def delete_budget(self, scope: BudgetScope, scope_id: str, *,
                            audit: AuditEvent) -> bool:
        return await self._audited(
            audit, "DELETE FROM budgets WHERE scope = %s AND scope_id = %s",
            (scope.value, scope_id),
        ) == 1

    # ---- provider keys --------------------------------------------------------------

    async def set_provider_key(self, key: StoredProviderKey, *, audit: AuditEvent) -> None:
        await self._audited(
            audit,
            "INSERT INTO provider_keys (name, nonce, ciphertext, created_at, updated_at) "
            "VALUES (%s, %s, %s, to_timestamp(%s), to_timestamp(%s)) ON CONFLICT (name) DO "
            "UPDATE SET nonce = excluded.nonce, ciphertext = excluded.ciphertext, "
            "updated_at = excluded.updated_at",
            (key.name, key.nonce, key.ciphertext, key.created_at, key.updated_at),
        )

    async def provider_key(self, name: str) -> StoredProviderKey | None:
        rows = await self._rows(
            f"SELECT {_PROVIDER_KEY_SELECT} FROM provider_keys WHERE name = %s", (name,))
        return _row_to_provider_key(rows[0]) if rows else None

    async def provider_keys(self) -> list[StoredProviderKey]:
        rows = await self._rows(f"SELECT {_PROVIDER_KEY_SELECT} FROM provider_keys ORDER BY name")
        return [_row_to_provider_key(row) for row in rows]

    async def delete_provider_key(self, name: str, *, audit: AuditEvent) -> bool:
        return await self._audited(
            audit, "DELETE FROM provider_keys WHERE name = %s", (name,)) == 1

    # ---- route versions -------------------------------------------------------------

    async def add_route_version(
        self, document: dict[str, Any], *, created_by: str, created_at: float, note: str,
        audit: Callable[[int], AuditEvent],
    ) -> RouteVersion:
        async with self.connection() as conn, conn.transaction():
            # Readers go on; a second writer waits here for the number after ours.
            await conn.execute("LOCK TABLE route_versions IN EXCLUSIVE MODE")
            cursor = await conn.execute(
                "SELECT coalesce(max(version), 0) + 1 FROM route_versions")
            row = await cursor.fetchone()
            assert row is not None
            number = int(row[0])
            await conn.execute(
                "INSERT INTO route_versions (version, document, created_by, created_at, note) "
                "VALUES (%s, %s, %s, to_timestamp(%s), %s)",
                (number, _jsonb(document), created_by, created_at, note),
            )
            await _insert_audit(conn, audit(number))
        return RouteVersion(number, document, created_by, created_at, note)

    async def route_version(self, version: int) -> RouteVersion | None:
        rows = await self._rows(
            f"SELECT {_ROUTE_SELECT} FROM route_versions WHERE version = %s", (version,))
        return _row_to_route(rows[0]) if rows else None

    async def latest_route_version(self) -> RouteVersion | None:
        versions = await self.route_versions(limit=1)
        return versions[0] if versions else None

    async def route_versions(self, *, limit: int = 50) -> list[RouteVersion]:
        rows = await self._rows(
            f"SELECT {_ROUTE_SELECT} FROM route_versions ORDER BY version DESC LIMIT %s",
            (limit,),
        )
        return [_row_to_route(row) for row in rows]

