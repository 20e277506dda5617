"""The Postgres fixed-window limiter: the shared limiter when there is no Redis.

One statement per request, one round trip: an upsert on the key's window row that
counts the request only while the window has room (``WHERE request_count < limit``).
Postgres row locks make concurrent upserts from any number of replicas exact. The time
is the database server's (``clock_timestamp()``), so replicas with skewed clocks still
agree on the window.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.limits import (
    Granted,
    Guard,
    LimitDecision,
    LimiterUnavailable,
    bucket_name,
    decide,
    guarded,
    window_start,
)
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.postgres import PostgresStore

# `clock` is referenced twice, so Postgres evaluates it once: the window the row is
# counted in and the `now` returned for Retry-After come from the same instant.
# A refused request updates nothing and returns NULL as its count. A row whose window
# is newer than this statement's (a concurrent statement crossed the boundary first)
# is never moved back. `need` is the room the window must have: 1 for a request (counted
# while the window has room, whatever its cost), the whole amount for a lease
# (limits.lease_in_window).
_TAKE = """
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
guard AS (
    SELECT coalesce((SELECT request_count FROM rate_limit_windows g, clock
                     WHERE g.bucket = %(guard)s AND g.window_start =
                         to_timestamp(floor(now / %(guard_window)s) * %(guard_window)s)), 0)
        AS count
),
counted AS (
    INSERT INTO rate_limit_windows AS w (bucket, window_start, request_count)
    SELECT %(bucket)s, to_timestamp(floor(now / %(window)s) * %(window)s), %(cost)s
    FROM clock, guard WHERE guard.count < %(guard_limit)s AND %(need)s <= %(limit)s
    ON CONFLICT (bucket) DO UPDATE
        SET window_start = GREATEST(w.window_start, EXCLUDED.window_start),
            request_count = CASE WHEN EXCLUDED.window_start > w.window_start THEN %(cost)s
                                 ELSE w.request_count + %(cost)s END
        WHERE EXCLUDED.window_start > w.window_start
           OR w.request_count + %(need)s <= %(limit)s
    RETURNING request_count, extract(epoch FROM window_start)::float8 AS start
)
SELECT (SELECT request_count FROM counted), now, (SELECT count FROM guard),
       (SELECT start FROM counted) FROM clock
"""
# Only a look (cost 0): the current window's count, nothing written.
_LOOK = """
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)
SELECT coalesce((SELECT request_count FROM rate_limit_windows w
                 WHERE w.bucket = %(bucket)s
                   AND w.window_start = to_timestamp(floor(now / %(window)s) * %(window)s)), 0),
       now FROM clock
"""


# A lease's unused room, back into the window it was counted in (none once that is over).
_GIVE_BACK = """
UPDATE rate_limit_windows SET request_count = GREATEST(0, request_count - %(amount)s)
WHERE bucket = %(bucket)s AND window_start = to_timestamp(%(start)s)
"""


class PostgresRateLimiter:
    backend = "postgres"

    def __init__(self, store: PostgresStore) -> None:
        self._store = store  # shares the store's pool; the store owns and closes it

    async def take(self, key_id: str, limit: int, window_seconds: int,
                   cost: int = 1, guard: Guard | None = None) -> LimitDecision:
        if not cost:
            count, now = await self._run(_LOOK, self._params(key_id, limit, window_seconds,
                                                            0, 1, guard))
            return decide(count + 1, limit, now, window_seconds)
        count, now, guard_count, _ = await self._run(
            _TAKE, self._params(key_id, limit, window_seconds, cost, 1, guard))
        if guard is not None and guard_count >= guard.limit:
            reset = window_start(now, guard.window_seconds) + guard.window_seconds - now
            return guarded(guard, reset)
        count_after = limit + 1 if count is None else count
        return decide(count_after, limit, now, window_seconds)

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None) -> Granted:
        count, now, _, start = await self._run(
            _TAKE, self._params(key_id, limit, window_seconds, amount, amount, guard))
        start = window_start(now, window_seconds) if start is None else start
        return Granted(0 if count is None else amount, count or 0,
                       start + window_seconds - now, start)

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float) -> None:
        await self._run(_GIVE_BACK, {"amount": amount, "start": window,
                                     "bucket": bucket_name(key_id, limit, window_seconds)},
                        fetch=False)

    @staticmethod
    def _params(key_id: str, limit: int, window_seconds: int, cost: int, need: int,
                guard: Guard | None) -> dict[str, object]:
        return {
            "bucket": bucket_name(key_id, limit, window_seconds),
            "window": window_seconds,
            "limit": limit,
            "cost": cost,
            "need": need,
            # No guard: a bucket no row has, and a limit nothing reaches.
            "guard": bucket_name(guard.key_id, guard.limit, guard.window_seconds)
            if guard else "",
            "guard_window": guard.window_seconds if guard else 1,
            "guard_limit": guard.limit if guard else 1,
        }

    async def _run(self, statement: str, params: dict[str, object],
                   fetch: bool = True) -> tuple[Any, ...]:
        try:
            async with self._store.connection() as conn:
                cursor = await conn.execute(statement, params)
                row = await cursor.fetchone() if fetch else ()
        except StoreUnavailable as exc:
            raise LimiterUnavailable(self.backend, exc.__cause__ or exc) from exc
        assert row is not None  # the outer SELECT always yields one row
        return tuple(row)

    async def ping(self) -> None:
        try:
            await self._store.ping()
        except StoreUnavailable as exc:
            raise LimiterUnavailable(self.backend, exc.__cause__ or exc) from exc

    async def close(self) -> None:
        return None
