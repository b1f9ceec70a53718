-- share.lua: set one partition's settings of its queue's limits.
-- KEYS[1] limits hash of the partition (v: version; c, ce, r, re, ct, cs,
--         rs, ru, xs, xo, xi:*: its slots, see slots.lua; per: rate period ms
--         counted; pn: a shorter period that comes in with slots.lua
--         "period"; w: last announced rate wake-up)
-- KEYS[2] pending list  KEYS[3] active zset  KEYS[4] layout meta
-- KEYS[5] starts zset (start ms of the tasks started in the last period)
-- KEYS[6] group rotation zset  KEYS[7] group state hash
-- KEYS[8] held-back groups zset  KEYS[9] ready grouped tasks (groups.lua)
-- KEYS[10] grouped task IDs (gid of groups.lua: task ID -> "<group>\0<seq>")
-- ARGV[1] layout  ARGV[2] version of the queue's limits the settings come from
-- ARGV[3] concurrency era ('' for no limit)  ARGV[4] event channel
-- ARGV[5] partition  ARGV[6] rate era ('' for no limit)  ARGV[7] period ms
-- ARGV[8] group limits "<concurrency>:<rate>:<period ms>:<ordered 0|1>:
--         <hold 0|1>" (0: none); groups are not split, so these are the
--         queue's. hold: grouped tasks start nothing (a repartition runs).
-- ARGV[9] the longest rate period, ms, the queue's partitions count now
--         ('' none: the rate is new to every partition)
-- Returns 1 when the settings were written, 0 when the partition holds
-- settings of newer limits (left as they are) or a repartition has retired
-- it.
-- The slots themselves are not set here: they move between the partitions
-- and the queue's bank (slots.lua). A partition whose slots are of another
-- era than the limit's (the limit was switched on since) starts with none;
-- without the limit it loses them. When the settings leave room for tasks
-- that wait, idle servers are woken ("p" event).
-- The groups' active counts (a:<group> in the group state) are kept only
-- while a group limit (gc, gr, ord) is set (groups.lua): the first group
-- limit set rebuilds them from the partition's active tasks, and unsetting
-- the last drops them, here, so that no lease or settle sees them half made.
if redis.call('GET', KEYS[4]) == 'retired' then return 0 end
local bad = layout_error(KEYS[4], ARGV[1])
if bad then return bad end
local v = tonumber(ARGV[2])
local cur = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if cur > v then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2])
local held = redis.call('HMGET', KEYS[1], 'c', 'ce', 'r', 're')
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 'c', 'ce', 'ct', 'cs')
elseif not held[1] or (held[2] or '0') ~= ARGV[3] then
  redis.call('HSET', KEYS[1], 'c', 0, 'ce', ARGV[3])
  redis.call('HDEL', KEYS[1], 'ct', 'cs')
end
if ARGV[6] == '' then
  redis.call('HDEL', KEYS[1], 'r', 're', 'rs', 'ru', 'per', 'pn', 'w')
else
  -- The period counted: a shorter one than the partition counts comes
  -- in only once the rate's tokens add up to no more than the new limit
  -- (slots.lua "period", from the rebalance). Until then this partition
  -- may hold tokens of the old limit, and counting them over the shorter
  -- period would start more than either rate allows. A partition without
  -- tokens of the rate yet (switched on, or new in a repartition) counts
  -- over the longest period the queue's partitions count (ARGV[9]), as
  -- tokens it is given may be of the old limit.
  local per = tonumber(ARGV[7])
  local cur = tonumber(redis.call('HGET', KEYS[1], 'per') or '')
  if not held[3] or (held[4] or '0') ~= ARGV[6] then
    redis.call('HSET', KEYS[1], 'r', 0, 're', ARGV[6])
    redis.call('HDEL', KEYS[1], 'rs', 'ru')
    cur = tonumber(ARGV[9] or '')
  end
  if cur and cur > per then
    redis.call('HSET', KEYS[1], 'per', string.format('%d', cur), 'pn', ARGV[7])
  else
    redis.call('HSET', KEYS[1], 'per', ARGV[7])
    redis.call('HDEL', KEYS[1], 'pn')
  end
  redis.call('HDEL', KEYS[1], 'w')
end
local gc, gr, gper, ord, hold = string.match(ARGV[8], '^(%d+):(%d+):(%d+):([01]):([01])$')
local function set(f, v)
  if v == nil or v == '0' then redis.call('HDEL', KEYS[1], f) else redis.call('HSET', KEYS[1], f, v) end
end
-- drop_state deletes the group state's fields that match pattern ('a:*'
-- counts, 'h:*' ordered places) and gives each of their groups a turn in
-- the rotation unless it is held back until a time.
local function drop_state(pattern)
  local cursor = '0'
  repeat
    local r = redis.call('HSCAN', KEYS[7], cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for j = 1, #r[2], 2 do
      redis.call('HDEL', KEYS[7], r[2][j])
      local g = string.sub(r[2][j], 3)
      if not redis.call('ZSCORE', KEYS[8], g) then redis.call('ZADD', KEYS[6], 'NX', 0, g) end
    end
  until cursor == '0'
end
local had = redis.call('HMGET', KEYS[1], 'gc', 'gr', 'ord')
local counted_before = had[1] or had[2] or had[3] == '1'
local counted = gc ~= '0' or gr ~= '0' or ord == '1'
if counted_before ~= counted then
  -- Drop the counts (a:<group>), then, when a group limit is switched on,
  -- count the active tasks by group (the active zset is bounded by the
  -- partition's running tasks; each grouped task's group is in KEYS[10]).
  -- A group out of the rotation at its old limits gets a turn again (the
  -- loop below no longer finds its count).
  drop_state('a:*')
  if counted then
    local n, groups = {}, {}
    local active = redis.call('ZRANGE', KEYS[3], 0, -1)
    for i = 1, #active, 1000 do
      local vs = redis.call('HMGET', KEYS[10], unpack(active, i, math.min(i + 999, #active)))
      for j = 1, #vs do
        if vs[j] then
          local g = string.sub(vs[j], 1, string.find(vs[j], '\0', 1, true) - 1)
          if not n[g] then groups[#groups + 1] = g end
          n[g] = (n[g] or 0) + 1
        end
      end
    end
    for _, g in ipairs(groups) do redis.call('HSET', KEYS[7], 'a:' .. g, string.format('%d', n[g])) end
  end
end
set('gc', gc)
set('gr', gr)
set('gper', gr ~= '0' and gper or nil)
if ord ~= '1' and redis.call('HGET', KEYS[1], 'ord') == '1' then
  -- No longer ordered: forget which task holds each group's place (the
  -- settle of a group's task only looks for one while ordered); the groups
  -- that waited for a holder (one waiting to be retried) get a turn again
  -- with the others below.
  drop_state('h:*')
end
set('ord', ord)
set('gh', hold)
-- Groups left out of the rotation under the old limits get a turn again:
-- those at their concurrency (running tasks) or waiting in a sequence (a
-- place held), and those held for their rate; throttled ones stay held
-- until their time. A group with nothing ready leaves the rotation again at
-- its turn.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, g in ipairs(redis.call('ZRANGE', KEYS[8], 0, -1)) do
  if tonumber(redis.call('HGET', KEYS[7], 't:' .. g) or '0') <= now then
    redis.call('ZREM', KEYS[8], g)
    redis.call('ZADD', KEYS[6], 'NX', 0, g)
  end
end
local cursor = '0'
repeat
  local r = redis.call('HSCAN', KEYS[7], cursor, 'COUNT', 1000)
  cursor = r[1]
  for j = 1, #r[2], 2 do
    local kind, g = string.sub(r[2][j], 1, 2), string.sub(r[2][j], 3)
    if (kind == 'a:' or kind == 'h:') and not redis.call('ZSCORE', KEYS[8], g) then
      redis.call('ZADD', KEYS[6], 'NX', 0, g)
    end
  end
until cursor == '0'
local c = redis.call('HGET', KEYS[1], 'c')
if (redis.call('LLEN', KEYS[2]) > 0 or redis.call('ZCARD', KEYS[9]) > 0) and (not c or redis.call('ZCARD', KEYS[3]) < tonumber(c)) then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
return 1
