"""The ledger in Redis: one Lua script reserves, another settles, each atomic on the server
(and on its clock, for the token buckets), run through llm_gateway.redis_scripts (one
pipelined connection: both are on every budgeted request's path). Every budget key
carries one hash tag, so the scripts run unchanged on Redis Cluster (all budgets then live
in one slot).

Owners (llm_gateway.billing.ledger) live under the same tag, beside the counters: a sorted
set of processes scored by when each was last heard of (Redis's clock, ``TIME``), and per
process a hash of its held rows (request -> the holds' names and amounts, as JSON) and a
hash of its tombstones (request -> when swept), which expires ``TOMBSTONE_SECONDS`` after
its last sweep; a held hash expires as long after its last reservation, and the set as
long after the last heartbeat, so nothing of a process outlives it for long even if no
gateway ever sweeps again. A reservation with an
owner adds one ``ZADD`` and one hash write to its script, a settlement one hash read and
delete and the row's counters. The sweep script takes a few processes silent for
``ORPHAN_SECONDS`` (oldest first) and a bounded number of their rows: Redis runs one
script at a time, so sweeps from every replica at once release each row once. The
counters a row names are found from it inside the settle and sweep scripts (keys not
passed as KEYS, as Redis's docs would have it, but under the one hash tag: the same slot,
which is what Redis Cluster checks).
"""

from __future__ import annotations

import json

from redis.exceptions import RedisError

from llm_gateway.billing.ledger import (
    ORPHAN_SECONDS,
    SWEEP_PROCESSES,
    SWEEP_ROWS,
    TOMBSTONE_SECONDS,
    Draw,
    Hold,
    LedgerAnswer,
    Owner,
)
from llm_gateway.redis_scripts import RedisScripts, Script

# What a held row's amounts are released with (settle, sweep): only a counter that still
# exists (one whose window is over is gone, and is not made again without its expiry).
_RELEASE = """
local function release(key, amount)
  if amount > 0 and redis.call('EXISTS', key) == 1 then
    local reserved = redis.call('HINCRBY', key, 'reserved', -amount)
    if reserved < 0 then redis.call('HSET', key, 'reserved', 0) end
  end
end
"""

# ARGV: the number of holds and of draws, the owner's process and request ('': none), its
# row (JSON) and how long a held hash is kept, then (limit, amount, expire-at ms) per
# hold, then (capacity, amount) per draw. KEYS: the holds' counters, then the draws'
# buckets, then with an owner the processes' set and its held hash.
RESERVE_SCRIPT = """
local holds, draws = tonumber(ARGV[1]), tonumber(ARGV[2])
local process, request = ARGV[3], ARGV[4]
local h = 6
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local refused, left, levels = '', {}, {}
for i = 1, holds do
  local limit, amount = tonumber(ARGV[h + 3 * i - 2]), tonumber(ARGV[h + 3 * i - 1])
  local state = redis.call('HMGET', KEYS[i], 'spent', 'reserved')
  local spent, reserved = tonumber(state[1] or '0'), tonumber(state[2] or '0')
  left[#left + 1] = limit - spent - reserved
  if refused == '' and spent + reserved + amount > limit then refused = KEYS[i] end
end
local base = h + 3 * holds
for j = 1, draws do
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
  redis.call('HINCRBY', KEYS[i], 'reserved', ARGV[h + 3 * i - 1])
  redis.call('PEXPIREAT', KEYS[i], ARGV[h + 3 * i])
end
for j = 1, draws do
  local amount = tonumber(ARGV[base + 2 * j])
  redis.call('HSET', KEYS[holds + j], 'level', string.format('%.6f', levels[j] - amount),
             'at', string.format('%.6f', now))
  redis.call('EXPIRE', KEYS[holds + j], 120)
end
if process ~= '' then
  redis.call('ZADD', KEYS[holds + draws + 1], now, process)
  if holds > 0 then
    local held, row = KEYS[holds + draws + 2], ARGV[5]
    local before = redis.call('HGET', held, request)
    -- A second reservation of one owner joins its row (two JSON arrays made one).
    if before then row = string.sub(before, 1, -2) .. ',' .. string.sub(row, 2) end
    redis.call('HSET', held, request, row)
    redis.call('EXPIRE', held, ARGV[6])
  end
end
return {1, '', left}
"""

# ARGV: the number of holds and of draws, the owner's request ('': none), the counters'
# key prefix, then (held, spent, expire-at ms) per hold, then (capacity, drawn, used) per
# draw. KEYS: the holds' counters, the draws' buckets, then with an owner its held hash
# and its tombstones' hash.
SETTLE_SCRIPT = _RELEASE + """
local holds, draws, request, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local h = 4
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
if request == '' then
  for i = 1, holds do
    local reserved = redis.call('HINCRBY', KEYS[i], 'reserved', -tonumber(ARGV[h + 3 * i - 2]))
    if reserved < 0 then redis.call('HSET', KEYS[i], 'reserved', 0) end
    redis.call('HINCRBY', KEYS[i], 'spent', ARGV[h + 3 * i - 1])
    redis.call('PEXPIREAT', KEYS[i], ARGV[h + 3 * i])
  end
else
  -- Exactly once: the row, or else its tombstone, is deleted by one call only.
  local held, swept = KEYS[holds + draws + 1], KEYS[holds + draws + 2]
  local row = redis.call('HGET', held, request)
  local booked = true
  if row then
    redis.call('HDEL', held, request)
    for _, entry in ipairs(cjson.decode(row)) do release(prefix .. entry[1], entry[2]) end
  else
    booked = redis.call('HDEL', swept, request) == 1
  end
  if booked then
    for i = 1, holds do
      redis.call('HINCRBY', KEYS[i], 'spent', ARGV[h + 3 * i - 1])
      redis.call('PEXPIREAT', KEYS[i], ARGV[h + 3 * i])
    end
  end
end
local base = h + 3 * holds
for j = 1, draws do
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

# KEYS: the processes' set. ARGV: the process, how long the set outlives the last
# heartbeat of any process.
HEARTBEAT_SCRIPT = """
local clock = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(clock[1]) + tonumber(clock[2]) / 1000000, ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: the processes' set. ARGV: seconds of silence that make a process dead, at most how
# many processes and rows, how long tombstones are kept, the owners' key base, the
# counters' key prefix. Returns how many rows were released.
SWEEP_SCRIPT = _RELEASE + """
local processes = KEYS[1]
local orphan, most_processes = tonumber(ARGV[1]), tonumber(ARGV[2])
local most_rows, keep, base, prefix = tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local silent = redis.call('ZRANGEBYSCORE', processes, '-inf',
                          '(' .. string.format('%.6f', now - orphan), 'LIMIT', 0, most_processes)
local released = 0
for _, process in ipairs(silent) do
  if released >= most_rows then break end
  local held, swept = base .. '#held:' .. process, base .. '#swept:' .. process
  local most, rows, cursor = most_rows - released, {}, '0'
  repeat
    local page = redis.call('HSCAN', held, cursor, 'COUNT', most)
    cursor = page[1]
    for k = 1, #page[2], 2 do
      if #rows < most then rows[#rows + 1] = {page[2][k], page[2][k + 1]} end
    end
  until cursor == '0' or #rows >= most
  for _, row in ipairs(rows) do
    if redis.call('HDEL', held, row[1]) == 1 then  -- a scan may return a field twice
      for _, entry in ipairs(cjson.decode(row[2])) do release(prefix .. entry[1], entry[2]) end
      redis.call('HSET', swept, row[1], string.format('%.0f', now))
      released = released + 1
    end
  end
  if #rows > 0 then redis.call('EXPIRE', swept, keep) end
  if redis.call('EXISTS', held) == 0 then redis.call('ZREM', processes, process) end
end
return released
"""

# KEYS: counters. Returns what each has spent ('0' for one that does not exist).
SPENT_SCRIPT = """
local spent = {}
for i = 1, #KEYS do spent[i] = redis.call('HGET', KEYS[i], 'spent') or '0' end
return spent
"""

RESERVE, SETTLE = Script(RESERVE_SCRIPT), Script(SETTLE_SCRIPT)
HEARTBEAT, SWEEP = Script(HEARTBEAT_SCRIPT), Script(SWEEP_SCRIPT)
SPENT = Script(SPENT_SCRIPT)
SETTLE_GRACE_SECONDS = 0.05


class RedisLedger:
    backend = "redis"

    def __init__(self, url: str, *, namespace: str = "llmg",
                 scripts: RedisScripts | None = None,
                 orphan_seconds: float = ORPHAN_SECONDS) -> None:
        self._scripts = scripts or RedisScripts(url)  # the limiter's, when wiring shares it
        self._base = f"{namespace}:{{budgets}}"
        self._prefix = self._base + ":"  # a counter's or bucket's key: this and its name
        self._processes = self._base + "#processes"  # no name makes a key of this
        self._orphan_seconds = orphan_seconds

    async def reserve(self, holds: list[Hold], draws: list[Draw],
                      owner: Owner | None = None) -> LedgerAnswer:
        keys = [self._prefix + hold.name for hold in holds] + [
            self._prefix + draw.name for draw in draws]
        args: list[int | str] = [len(holds), len(draws)]
        if owner is None:
            args += ["", "", "", 0]
        else:
            keys += [self._processes, f"{self._base}#held:{owner.process}"]
            args += [owner.process, owner.request,
                     json.dumps([[hold.name, hold.amount] for hold in holds],
                                separators=(",", ":")),
                     int(TOMBSTONE_SECONDS)]
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
                     used: list[int], ticket: object = None, owner: Owner | None = None,
                     ) -> None:
        keys = [self._prefix + hold.name for hold in holds] + [
            self._prefix + draw.name for draw in draws]
        args: list[int | str] = [len(holds), len(draws),
                                 owner.request if owner is not None else "", self._prefix]
        if owner is not None:
            keys += [f"{self._base}#held:{owner.process}", f"{self._base}#swept:{owner.process}"]
        for hold, amount in zip(holds, spent, strict=True):
            args += [hold.amount, amount, int(hold.expires_at * 1000)]
        for draw, amount in zip(draws, used, strict=True):
            args += [draw.capacity, draw.amount, amount]
        # No request waits on a settlement: while other calls are under way it rides along
        # with the next one (one write, one read for both), its budget held a few
        # milliseconds longer; on an idle connection it goes at once.
        await self._scripts.run(SETTLE, keys, args, grace=SETTLE_GRACE_SECONDS)

    async def heartbeat(self, process: str) -> None:
        await self._scripts.run(HEARTBEAT, [self._processes], [process, int(TOMBSTONE_SECONDS)],
                                grace=SETTLE_GRACE_SECONDS)  # nothing waits on it either

    async def sweep(self) -> int:
        return int(await self._scripts.run(SWEEP, [self._processes], [
            repr(self._orphan_seconds), SWEEP_PROCESSES, SWEEP_ROWS, int(TOMBSTONE_SECONDS),
            self._base, self._prefix]))

    async def spent(self, names: list[str]) -> dict[str, int]:
        if not names:
            return {}
        found = await self._scripts.run(SPENT, [self._prefix + name for name in names], [])
        return dict(zip(names, (int(value) for value in found), strict=True))

    async def close(self) -> None:
        await self._scripts.close()


LedgerError = RedisError

