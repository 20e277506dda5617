"""The ledger in Redis: one Lua script reserves, another settles, each atomic on the server
(and on its clock, for the token buckets), run through llm_gateway.redis_scripts (one
pipelined connection: both are on every budgeted request's path). Every budget key
carries one hash tag, so the scripts run unchanged on Redis Cluster (all budgets then live
in one slot)."""

from __future__ import annotations

from redis.exceptions import RedisError

from llm_gateway.billing.ledger import Draw, Hold, LedgerAnswer
from llm_gateway.redis_scripts import RedisScripts, Script

# ARGV: the number of holds, then (limit, amount, expire-at ms) per hold, then
# (capacity, amount) per draw. KEYS: the holds' counters, then the draws' buckets.
RESERVE_SCRIPT = """
local holds = tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local refused, left, levels = '', {}, {}
for i = 1, holds do
  local limit, amount = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local state = redis.call('HMGET', KEYS[i], 'spent', 'reserved')
  local spent, reserved = tonumber(state[1] or '0'), tonumber(state[2] or '0')
  left[#left + 1] = limit - spent - reserved
  if refused == '' and spent + reserved + amount > limit then refused = KEYS[i] end
end
local base = 1 + 3 * holds
for j = 1, #KEYS - holds do
  local capacity, amount = tonumber(ARGV[base + 2 * j - 1]), tonumber(ARGV[base + 2 * j])
  local state = redis.call('HMGET', KEYS[holds + j], 'level', 'at')
  local level = tonumber(state[1]) or capacity
  local at = tonumber(state[2]) or now
  level = math.min(capacity, level + (now - at) * capacity / 60)
  levels[j] = level
  left[#left + 1] = math.floor(level)
  if refused == '' and level < amount then refused = KEYS[holds + j] end
end
if refused ~= '' then return {0, refused, left} end
for i = 1, holds do
  redis.call('HINCRBY', KEYS[i], 'reserved', ARGV[3 * i])
  redis.call('PEXPIREAT', KEYS[i], ARGV[3 * i + 1])
end
for j = 1, #KEYS - holds do
  local amount = tonumber(ARGV[base + 2 * j])
  redis.call('HSET', KEYS[holds + j], 'level', string.format('%.6f', levels[j] - amount),
             'at', string.format('%.6f', now))
  redis.call('EXPIRE', KEYS[holds + j], 120)
end
return {1, '', left}
"""

# ARGV: the number of holds, then (held, spent, expire-at ms) per hold, then
# (capacity, drawn, used) per draw.
SETTLE_SCRIPT = """
local holds = tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
for i = 1, holds do
  local reserved = redis.call('HINCRBY', KEYS[i], 'reserved', -tonumber(ARGV[3 * i - 1]))
  if reserved < 0 then redis.call('HSET', KEYS[i], 'reserved', 0) end
  redis.call('HINCRBY', KEYS[i], 'spent', ARGV[3 * i])
  redis.call('PEXPIREAT', KEYS[i], ARGV[3 * i + 1])
end
local base = 1 + 3 * holds
for j = 1, #KEYS - holds do
  local capacity = tonumber(ARGV[base + 3 * j - 2])
  local drawn, used = tonumber(ARGV[base + 3 * j - 1]), tonumber(ARGV[base + 3 * j])
  local state = redis.call('HMGET', KEYS[holds + j], 'level', 'at')
  local level = tonumber(state[1]) or capacity
  local at = tonumber(state[2]) or now
  level = math.min(capacity, level + (now - at) * capacity / 60 + drawn - used)
  redis.call('HSET', KEYS[holds + j], 'level', string.format('%.6f', level),
             'at', string.format('%.6f', now))
  redis.call('EXPIRE', KEYS[holds + j], 120)
end
return 1
"""

RESERVE, SETTLE = Script(RESERVE_SCRIPT), Script(SETTLE_SCRIPT)
SETTLE_GRACE_SECONDS = 0.05


class RedisLedger:
    backend = "redis"

    def __init__(self, url: str, *, namespace: str = "llmg",
                 scripts: RedisScripts | None = None) -> None:
        self._scripts = scripts or RedisScripts(url)  # the limiter's, when wiring shares it
        self._prefix = f"{namespace}:{{budgets}}:"

    async def reserve(self, holds: list[Hold], draws: list[Draw]) -> LedgerAnswer:
        keys = [self._prefix + hold.name for hold in holds] + [
            self._prefix + draw.name for draw in draws]
        args: list[int | str] = [len(holds)]
        for hold in holds:
            args += [hold.limit, hold.amount, int(hold.expires_at * 1000)]
        for draw in draws:
            args += [draw.capacity, draw.amount]
        granted, refused, left = await self._scripts.run(RESERVE, keys, args)
        names = [hold.name for hold in holds] + [draw.name for draw in draws]
        refused_name = refused.decode() if isinstance(refused, bytes) else str(refused)
        return LedgerAnswer(bool(granted), refused_name.removeprefix(self._prefix) or None,
                            dict(zip(names, (int(value) for value in left), strict=True)))

    async def settle(self, holds: list[Hold], spent: list[int], draws: list[Draw],
                     used: list[int], ticket: object = None) -> None:
        keys = [self._prefix + hold.name for hold in holds] + [
            self._prefix + draw.name for draw in draws]
        args: list[int | str] = [len(holds)]
        for hold, amount in zip(holds, spent, strict=True):
            args += [hold.amount, amount, int(hold.expires_at * 1000)]
        for draw, amount in zip(draws, used, strict=True):
            args += [draw.capacity, draw.amount, amount]
        # No request waits on a settlement: while other calls are under way it rides along
        # with the next one (one write, one read for both), its budget held a few
        # milliseconds longer; on an idle connection it goes at once.
        await self._scripts.run(SETTLE, keys, args, grace=SETTLE_GRACE_SECONDS)

    async def close(self) -> None:
        await self._scripts.close()


LedgerError = RedisError
