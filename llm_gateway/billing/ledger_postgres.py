"""The ledger in Postgres: two functions (migration 5), each called in one statement.
Counter and bucket rows are locked in name order, so concurrent reservations of any
replicas never deadlock and never both take the last of a budget; buckets refill on the
database's clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from llm_gateway.billing.ledger import Draw, Hold, LedgerAnswer


class _Connections(Protocol):
    def connection(self) -> Any: ...


class PostgresLedger:
    backend = "postgres"

    def __init__(self, store: _Connections) -> None:
        self._store = store  # shares the store's pool; the store owns and closes it

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer:
        async with self._store.connection() as conn:
            cursor = await conn.execute(
                "SELECT * FROM llmg_reserve(%s, %s, %s, %s, %s, %s, %s)",
                ([h.name for h in holds], [h.limit for h in holds], [h.amount for h in holds],
                 [datetime.fromtimestamp(h.expires_at, UTC) for h in holds],
                 [d.name for d in draws], [d.capacity for d in draws],
                 [d.amount for d in draws]),
            )
            granted, refused, left = await cursor.fetchone()
        names = [hold.name for hold in holds] + [draw.name for draw in draws]
        return LedgerAnswer(granted, refused, dict(zip(names, left or [], strict=True)))

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None) -> None:
        async with self._store.connection() as conn:
            await conn.execute(
                "SELECT llmg_settle(%s, %s, %s, %s, %s, %s, %s, %s)",
                ([h.name for h in holds], [h.amount for h in holds], spent,
                 [datetime.fromtimestamp(h.expires_at, UTC) for h in holds],
                 [d.name for d in draws], [d.capacity for d in draws],
                 [d.amount for d in draws], used),
            )

    async def close(self) -> None:
        return None
