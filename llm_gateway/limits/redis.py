"""The Redis limiter: one atomic Lua script per request, on the Redis server's clock.

The scripts are the same epoch-aligned fixed window and token bucket as the in-process
and Postgres limiters (see llm_gateway.limits), so "N requests per window" is exact: N
are admitted in a window (a bucket's burst plus its refill) however many replicas share
it, and a refused request uses up nothing. A bucket is a hash of its tokens and when they
were last written, which expires once the bucket would be full again (a bucket that is
not there is full).

The script is called by its SHA (EVALSHA) through llm_gateway.redis_scripts (one pipelined
connection: this is every request's path); a server that has lost its script cache
(restart, failover, SCRIPT FLUSH) answers NOSCRIPT and the script is loaded again. Each
key name carries a hash tag (``{key id}``), so every key a gateway key uses maps to one
Redis Cluster slot and the script runs unchanged there.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llm_gateway.limits import (
    Granted,
    Guard,
    LimitDecision,
    LimiterUnavailable,
    bucket_decision,
    bucket_granted,
    guarded,
)
from llm_gateway.redis_scripts import RedisScripts, Script

# Times are integer milliseconds: Lua numbers are doubles, and the arguments Redis
# converts with "%.14g" would round microseconds since the epoch (16 digits).
# ARGV: limit, window seconds, cost (or a lease's amount), then the guard's limit and
# window when KEYS[2] names a guard. The scripts share how they read the clock and the
# guard, the window's two how they find the window.
_CLOCK = """
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
"""
_GUARD = """
if KEYS[2] then
  -- The guard: looked at, never counted; full means refused (2) and nothing counted.
  local guard_window_ms = tonumber(ARGV[5]) * 1000
  local guard_start_ms = now_ms - (now_ms % guard_window_ms)
  local guard = redis.call('HMGET', KEYS[2], 'start', 'count')
  local guard_stored = tonumber(guard[1])
  local guard_full = guard_stored and tonumber(guard[2]) >= tonumber(ARGV[4])
  if guard_full and guard_stored >= guard_start_ms then
    return {2, 0, math.max(0, guard_stored + guard_window_ms - now_ms), start_ms}
  end
end
"""
_WINDOW = """
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2]) * 1000
local cost = tonumber(ARGV[3])
""" + _CLOCK + """
local start_ms = now_ms - (now_ms % window_ms)
""" + _GUARD + """
local state = redis.call('HMGET', KEYS[1], 'start', 'count')
local count = 0
local stored_start = tonumber(state[1])
if stored_start and stored_start >= start_ms then
  -- The current window (or a later one, should the server clock have stepped back).
  start_ms = stored_start
  count = tonumber(state[2])
end
local reset_ms = math.max(0, start_ms + window_ms - now_ms)
"""
_COUNT = """
redis.call('HSET', KEYS[1], 'start', string.format('%.0f', start_ms), 'count', count)
-- Expiry only collects the key once its window is over; it decides nothing.
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', reset_ms + 1000))
"""
FIXED_WINDOW_SCRIPT = _WINDOW + """
if count >= limit then
  return {0, count, reset_ms}
end
if cost == 0 then
  -- Only a look: room left, nothing counted.
  return {1, count + 1, reset_ms}
end
count = count + cost
""" + _COUNT + """
return {1, count, reset_ms}
"""
# A lease (llm_gateway.leases): the amount counted at once if it fits under the limit
# (limits.lease_in_window), else nothing. Replies as the take does (1 granted, 0 no
# room, 2 the guard full), then the count, the reset and the window's start.
LEASE_SCRIPT = _WINDOW + """
if count + cost > limit then
  return {0, count, reset_ms, start_ms}
end
count = count + cost
""" + _COUNT + """
return {1, count, reset_ms, start_ms}
"""
# ARGV: the amount, the window's start (ms) it was leased in: nothing back once it is over.
GIVE_BACK_SCRIPT = """
local state = redis.call('HMGET', KEYS[1], 'start', 'count')
if tonumber(state[1]) == tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'count', math.max(0, tonumber(state[2]) - tonumber(ARGV[1])))
end
return 1
"""
# A token bucket (limits.take_from_bucket): ARGV as above, the guard's two always there
# (unused without KEYS[2]), then the tokens the call needs and the bucket's burst. A
# request needs its cost (a look, cost 0, one token), a lease its amount; a lease given
# back is a negative cost that needs nothing. Times are seconds with microseconds
# (doubles: exact to a microsecond), levels written with 17 digits (a double, exactly).
# Replies 1 granted, 0 refused, then the level after (a string: Redis would cut a
# number's fraction); or 2, the guard full, as the window's (its reset third, in ms).
TOKEN_BUCKET_SCRIPT = _CLOCK + """
local start_ms = 0
""" + _GUARD + """
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost, need, burst = tonumber(ARGV[3]), tonumber(ARGV[6]), tonumber(ARGV[7])
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local rate = limit / window
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local at = tonumber(state[2])
local level = burst
if at then
  level = math.min(burst, tonumber(state[1]) + math.max(0, now - at) * rate)
else
  at = now
end
if level < need then
  return {0, string.format('%.17g', level)}
end
if cost ~= 0 then
  level = math.min(burst, level - cost)
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', level),
             'at', string.format('%.6f', math.max(at, now)))
  -- Expiry forgets the bucket once it is full again; it decides nothing.
  local full_in = math.min(math.ceil((burst - level) / rate) + 1, 1e12)
  redis.call('EXPIRE', KEYS[1], string.format('%.0f', full_in))
end
return {1, string.format('%.17g', level)}
"""
FIXED_WINDOW = Script(FIXED_WINDOW_SCRIPT)
FIXED_WINDOW_SHA = FIXED_WINDOW.sha
LEASE, GIVE_BACK = Script(LEASE_SCRIPT), Script(GIVE_BACK_SCRIPT)
TOKEN_BUCKET = Script(TOKEN_BUCKET_SCRIPT)
# No request waits on a lease given back: it may ride along with the next call.
GIVE_BACK_GRACE_SECONDS = 0.05


def window_key(key_id: str, limit: int, window_seconds: int, namespace: str = "llmg") -> str:
    """The counter of one gateway key and limit setting. The hash tag is the key's id up
    to its first '!' (a guard's bucket is "<key id>!<what>"), so a key's counters share
    one Redis Cluster slot and one script may touch them together."""
    tag, mark, rest = key_id.partition("!")
    suffix = f"!{rest}" if mark else ""
    return f"{namespace}:rl:{{{tag}}}{suffix}:{limit}/{window_seconds}"


def bucket_key(key_id: str, limit: int, window_seconds: int, burst: int,
               namespace: str = "llmg") -> str:
    """The token bucket of one gateway key and limit setting (its burst included), in the
    key's Cluster slot beside its windows (a guard's window is read with it)."""
    tag, mark, rest = key_id.partition("!")
    suffix = f"!{rest}" if mark else ""
    return f"{namespace}:tb:{{{tag}}}{suffix}:{limit}/{window_seconds}/{burst}"


class RedisRateLimiter:
    backend = "redis"

    def __init__(self, url: str, *, namespace: str = "llmg",
                 scripts: RedisScripts | None = None) -> None:
        self.namespace = namespace
        # One pipelined connection, not a pool (dozens of replicas open one each), shared
        # with the budget ledger when wiring passes it. A Redis that does not answer fails
        # over within its 2 s reply timeout.
        self.scripts = scripts or RedisScripts(url)

    @property
    def script_loads(self) -> int:
        """How often the script was (re)loaded: tests, diagnostics."""
        return self.scripts.script_loads

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        if burst is not None:
            need = max(1, cost)
            reply = await self._bucket(key_id, limit, window_seconds, burst, cost, need, guard)
            if reply[0] == 2 and guard is not None:
                return guarded(guard, int(reply[2]) / 1000)
            return bucket_decision(limit, window_seconds, burst, float(reply[1]),
                                   reply[0] == 1, need)
        allowed, count, reset_ms = (await self._run(FIXED_WINDOW, key_id, limit,
                                                    window_seconds, cost, guard))[:3]
        # The script already measured the time to the window's end on the server.
        if allowed == 2 and guard is not None:
            return guarded(guard, int(reset_ms) / 1000)
        return LimitDecision(bool(allowed), limit, max(0, limit - int(count)),
                             int(reset_ms) / 1000)

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None, burst: int | None = None) -> Granted:
        if burst is not None:
            reply = await self._bucket(key_id, limit, window_seconds, burst, amount, amount,
                                       guard)
            if reply[0] == 2:  # the guard full
                return Granted(0, 0, int(reply[2]) / 1000, 0.0)
            return bucket_granted(reply[0] == 1, amount, float(reply[1]), burst)
        granted, count, reset_ms, start_ms = await self._run(
            LEASE, key_id, limit, window_seconds, amount, guard)
        return Granted(amount if granted == 1 else 0, int(count), int(reset_ms) / 1000,
                       float(start_ms))

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float, burst: int | None = None) -> None:
        if burst is not None:
            await self._bucket(key_id, limit, window_seconds, burst, -amount, 0, None,
                               grace=GIVE_BACK_GRACE_SECONDS)
            return
        try:
            await self.scripts.run(
                GIVE_BACK, [window_key(key_id, limit, window_seconds, self.namespace)],
                [amount, f"{window:.0f}"], grace=GIVE_BACK_GRACE_SECONDS)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise LimiterUnavailable(self.backend, exc) from exc

    async def _bucket(self, key_id: str, limit: int, window_seconds: int, burst: int,
                      cost: int, need: int, guard: Guard | None,
                      grace: float = 0.0) -> list[Any]:
        keys = [bucket_key(key_id, limit, window_seconds, burst, self.namespace)]
        args: list[int] = [limit, window_seconds, cost, 0, 0, need, burst]
        if guard is not None:
            keys.append(window_key(guard.key_id, guard.limit, guard.window_seconds,
                                   self.namespace))
            args[3:5] = [guard.limit, guard.window_seconds]
        try:
            return await self.scripts.run(  # type: ignore[no-any-return]
                TOKEN_BUCKET, keys, args, grace=grace)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise LimiterUnavailable(self.backend, exc) from exc

    async def _run(self, script: Script, key_id: str, limit: int, window_seconds: int,
                   cost: int, guard: Guard | None) -> list[int]:
        keys = [window_key(key_id, limit, window_seconds, self.namespace)]
        args = [limit, window_seconds, cost]
        if guard is not None:
            keys.append(window_key(guard.key_id, guard.limit, guard.window_seconds,
                                   self.namespace))
            args += [guard.limit, guard.window_seconds]
        try:
            return await self.scripts.run(script, keys, args)  # type: ignore[no-any-return]
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise LimiterUnavailable(self.backend, exc) from exc

    async def ping(self) -> None:
        try:
            await self.scripts.ping()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise LimiterUnavailable(self.backend, exc) from exc

    async def close(self) -> None:
        await self.scripts.close()
