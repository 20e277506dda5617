"""The Postgres limiter: the shared limiter when there is no Redis.

One statement per request, one round trip: an upsert on the key's window row that
counts the request only while the window has room (``WHERE request_count < limit``), or
on its token bucket's row (migration 14) that takes the request's tokens only while the
bucket, refilled to now, holds them (limits.take_from_bucket). Postgres row locks make
concurrent upserts from any number of replicas exact. The time is the database server's
(``clock_timestamp()``), so replicas with skewed clocks still agree on the window and
the refill.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.limits import (
    Granted,
    Guard,
    LimitDecision,
    LimiterUnavailable,
    bucket_decision,
    bucket_granted,
    bucket_name,
    decide,
    guarded,
    window_start,
)
from llm_gateway.stores import StoreUnavailable
from llm_gateway.stores.postgres import PostgresStore

# The statement's one instant, and the count of the guard's window at it (a key's budget of
# failed upstream requests), which both kinds of limit read.
_CLOCK_AND_GUARD = """
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
guard AS (
    SELECT coalesce((SELECT request_count FROM rate_limit_windows g, clock
                     WHERE g.bucket = %(guard)s AND g.window_start =
                         to_timestamp(floor(now / %(guard_window)s) * %(guard_window)s)), 0)
        AS count
),
"""

# `clock` is referenced twice, so Postgres evaluates it once: the window the row is
# counted in and the `now` returned for Retry-After come from the same instant.
# A refused request updates nothing and returns NULL as its count. A row whose window
# is newer than this statement's (a concurrent statement crossed the boundary first)
# is never moved back. `need` is the room the window must have: 1 for a request (counted
# while the window has room, whatever its cost), the whole amount for a lease
# (limits.lease_in_window).
_TAKE = _CLOCK_AND_GUARD + """counted AS (
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


# A token bucket (limits.take_from_bucket): ``cost`` taken when the bucket, refilled to
# now at limit / window per second, holds ``need``; nothing written for a look (cost 0)
# or a refusal. A refusal's level (for Retry-After) is read locking the row: the latest
# version, not the statement's snapshot, which a concurrent take may have changed since
# (a granted call's row, updated by this very statement, is skipped there: its level is
# what the upsert returns). A lease given back is a negative cost that needs nothing.
# Times are epoch seconds on the database's clock; a clock that stepped back refills
# nothing.
_REFILLED = ("least(%(burst)s::float8, b.tokens + greatest(0, {now} - b.refilled_at)"
             " * (%(limit)s::float8 / %(window)s))")
_TAKE_BUCKET = _CLOCK_AND_GUARD + """before AS (
    SELECT """ + _REFILLED.format(now="now") + """ AS level
    FROM rate_limit_buckets b, clock WHERE b.bucket = %(bucket)s FOR UPDATE OF b
),
taken AS (
    INSERT INTO rate_limit_buckets AS b (bucket, tokens, refilled_at)
    SELECT %(bucket)s, least(%(burst)s::float8, %(burst)s::float8 - %(cost)s), now
    FROM clock, guard
    WHERE guard.count < %(guard_limit)s AND %(cost)s <> 0 AND %(need)s <= %(burst)s
    ON CONFLICT (bucket) DO UPDATE
        SET tokens = least(%(burst)s::float8,
                           """ + _REFILLED.format(now="EXCLUDED.refilled_at") + """ - %(cost)s),
            refilled_at = GREATEST(b.refilled_at, EXCLUDED.refilled_at)
        WHERE """ + _REFILLED.format(now="EXCLUDED.refilled_at") + """ >= %(need)s
    RETURNING tokens
)
SELECT (SELECT tokens FROM taken), now, (SELECT count FROM guard),
       coalesce((SELECT level FROM before), %(burst)s::float8) FROM clock
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

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        if burst is not None:
            need = max(1, cost)
            level, granted, guard_reset = await self._bucket(
                key_id, limit, window_seconds, burst, cost, need, guard)
            if guard is not None and guard_reset is not None:
                return guarded(guard, guard_reset)
            return bucket_decision(limit, window_seconds, burst, level, granted, need)
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
                    guard: Guard | None = None, burst: int | None = None) -> Granted:
        if burst is not None:
            level, granted, guard_reset = await self._bucket(
                key_id, limit, window_seconds, burst, amount, amount, guard)
            if guard_reset is not None:
                return Granted(0, 0, guard_reset, 0.0)
            return bucket_granted(granted, amount, level, burst)
        count, now, _, start = await self._run(
            _TAKE, self._params(key_id, limit, window_seconds, amount, amount, guard))
        start = window_start(now, window_seconds) if start is None else start
        return Granted(0 if count is None else amount, count or 0,
                       start + window_seconds - now, start)

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float, burst: int | None = None) -> None:
        if burst is not None:
            await self._bucket(key_id, limit, window_seconds, burst, -amount, 0, None)
            return
        await self._run(_GIVE_BACK, {"amount": amount, "start": window,
                                     "bucket": bucket_name(key_id, limit, window_seconds)},
                        fetch=False)

    async def _bucket(self, key_id: str, limit: int, window_seconds: int, burst: int,
                      cost: int, need: int,
                      guard: Guard | None) -> tuple[float, bool, float | None]:
        """The bucket's level after the call, whether it was granted, and the guard's
        reset when the guard is full (then nothing was taken)."""
        params = self._params(key_id, limit, window_seconds, cost, need, guard, burst)
        tokens, now, guard_count, level = await self._run(_TAKE_BUCKET, params)
        if guard is not None and guard_count >= guard.limit:
            start = window_start(now, guard.window_seconds)
            return level, False, start + guard.window_seconds - now
        if cost == 0:
            return level, level >= need, None
        return (level, False, None) if tokens is None else (tokens, True, None)

    @staticmethod
    def _params(key_id: str, limit: int, window_seconds: int, cost: int, need: int,
                guard: Guard | None, burst: int | None = None) -> dict[str, object]:
        return {
            "bucket": bucket_name(key_id, limit, window_seconds, burst),
            "burst": burst,
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
