"""Prices and budgets written straight into a store, for the accounting tests."""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal

from llm_gateway.billing.model import Budget, BudgetScope, Price
from llm_gateway.stores import open_store
from llm_gateway.stores.admin import AuditEvent


def _event(action: str) -> AuditEvent:
    return AuditEvent(id=str(uuid.uuid4()), at=time.time(), actor="test", action=action,
                      target="test")


def set_price(database_url: str, provider: str, model: str, input_usd: str, output_usd: str,
              effective_from: float = 0.0, cached_input_usd: str | None = None) -> None:
    cached = None if cached_input_usd is None else Decimal(cached_input_usd)

    async def work() -> None:
        store = open_store(database_url)
        try:
            await store.migrate()
            await store.set_price(Price(provider, model, Decimal(input_usd), Decimal(output_usd),  # type: ignore[attr-defined]
                                        effective_from, cached), audit=_event("price.set"))
        finally:
            await store.close()

    asyncio.run(work())


def set_budget(database_url: str, scope: BudgetScope, scope_id: str, **limits: object) -> None:
    async def work() -> None:
        store = open_store(database_url)
        try:
            await store.migrate()
            await store.set_budget(Budget(scope, scope_id, **limits),  # type: ignore[attr-defined,arg-type]
                                   audit=_event("budget.set"))
        finally:
            await store.close()

    asyncio.run(work())
