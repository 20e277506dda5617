"""Who sends a budget alert: the first replica to claim it in the shared store, once per
budget, window start and threshold (llm_gateway.billing.alerts' ``dedup_key``).

A claim is ``claim(key, alert_id, until)``: True for the one caller that made it, False
for every other, in any number of processes at once. ``until`` is when the budget's window
ends; after it the claim is of no use (the next window's counter has another name), so
Redis expires it and the SQL stores sweep it now and then.

- Redis (when REDIS_URL is set, as the ledger is): ``SET key id NX PX ttl``, one key per
  claim under the namespace, through the pipelined script connection the ledger shares.
- Postgres and SQLite (the key store's database): a row of ``budget_alerts`` (migration
  13) whose primary key is the claim, ``INSERT ... ON CONFLICT DO NOTHING``: the one
  insert that wrote a row won.
- In process (``MemoryClaims``): one process, one set.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by whoever builds them: redis-py and psycopg only when used
    from llm_gateway.redis_scripts import RedisScripts
    from llm_gateway.stores.postgres import PostgresStore
    from llm_gateway.stores.sqlite import SqliteStore

# KEYS: the claim. ARGV: the alert's id, the claim's time to live in milliseconds.
CLAIM_SCRIPT = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
# A claim is kept a day past its window (what was alerted stays visible that long).
KEEP_SECONDS = 86400.0
SWEEP_ROWS = 500

_SQLITE_CLAIM = ("INSERT INTO budget_alerts (alert_key, alert_id, claimed_at, expires_at)"
                 " VALUES (?, ?, ?, ?) ON CONFLICT (alert_key) DO NOTHING")
_SQLITE_SWEEP = ("DELETE FROM budget_alerts WHERE alert_key IN (SELECT alert_key FROM"
                 " budget_alerts WHERE expires_at < ? ORDER BY expires_at LIMIT ?)")
_POSTGRES_CLAIM = ("INSERT INTO budget_alerts (alert_key, alert_id, claimed_at, expires_at)"
                   " VALUES (%s, %s, %s, %s) ON CONFLICT (alert_key) DO NOTHING")
_POSTGRES_SWEEP = ("DELETE FROM budget_alerts WHERE alert_key IN (SELECT alert_key FROM"
                   " budget_alerts WHERE expires_at < %s ORDER BY expires_at LIMIT %s"
                   " FOR UPDATE SKIP LOCKED)")


class MemoryClaims:
    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._claims: dict[str, float] = {}
        self._clock = clock

    async def claim(self, key: str, alert_id: str, until: float) -> bool:
        now = self._clock()
        if len(self._claims) > 10_000:
            self._claims = {k: end for k, end in self._claims.items() if end > now}
        if key in self._claims:
            return False
        self._claims[key] = until + KEEP_SECONDS
        return True


class RedisClaims:
    backend = "redis"

    def __init__(self, scripts: RedisScripts, *, namespace: str = "llmg",
                 clock: Callable[[], float] = time.time) -> None:
        from llm_gateway.redis_scripts import Script

        self._scripts = scripts  # the ledger's connection: the ledger closes it
        self._script = Script(CLAIM_SCRIPT)
        self._prefix = f"{namespace}:alerts:"
        self._clock = clock

    async def claim(self, key: str, alert_id: str, until: float) -> bool:
        ttl_ms = max(1000, math.ceil((until + KEEP_SECONDS - self._clock()) * 1000))
        answer = await self._scripts.run(self._script, [self._prefix + key], [alert_id, ttl_ms])
        return answer is not None


class SqliteClaims:
    backend = "sqlite"

    def __init__(self, store: SqliteStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store  # its connection and thread; the store owns and closes them
        self._clock = clock

    async def claim(self, key: str, alert_id: str, until: float) -> bool:
        now = self._clock()

        def write(db: sqlite3.Connection) -> bool:
            won = db.execute(_SQLITE_CLAIM, (key, alert_id, now, until + KEEP_SECONDS)
                             ).rowcount == 1
            if won:  # claims are few: a sweep with each costs nothing
                db.execute(_SQLITE_SWEEP, (now, SWEEP_ROWS))
            return won

        return bool(await self._store._run(write))


class PostgresClaims:
    backend = "postgres"

    def __init__(self, store: PostgresStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store  # shares the store's pool; the store owns and closes it
        self._clock = clock

    async def claim(self, key: str, alert_id: str, until: float) -> bool:
        now = self._clock()
        async with self._store.connection() as conn:
            cursor = await conn.execute(_POSTGRES_CLAIM, (
                key, alert_id, _moment(now), _moment(until + KEEP_SECONDS)))
            won = cursor.rowcount == 1
            if won:
                await conn.execute(_POSTGRES_SWEEP, (_moment(now), SWEEP_ROWS))
        return won


def _moment(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
