-- maintain.lua: claim one partition and, when owned, move it forward.
-- KEYS[1] owner key     KEYS[2] records hash  KEYS[3] pending list
-- KEYS[4] active zset   KEYS[5] scheduled zset KEYS[6] retry zset
-- KEYS[7] archived zset KEYS[8] completed zset KEYS[9] results hash
-- ARGV[1] owner  ARGV[2] owner TTL ms  ARGV[3] now ms (caller's clock, for due times)
-- ARGV[4] event channel  ARGV[5] partition  ARGV[6] unique-lock key prefix
-- ARGV[7] max archived  ARGV[8] archive TTL ms  ARGV[9] per-step limit
-- ARGV[10] today (UTC, YYYY-MM-DD): recovered tasks count as failed attempts
-- ARGV[11] '1' to trim archived and completed tasks this time
-- Returns {owned, retry-in ms, pending, forwarded, recovered, next due ms or -1,
--          next lease expiry in ms or -1}.
-- When owned it forwards scheduled and retry tasks due by ARGV[3] to pending,
-- recovers active tasks whose lease expired by the Redis clock (retry at once
-- with the attempt counted, or archive when none is left), and, when asked,
-- deletes completed tasks past retention and trims archived ones by age and
-- count. Each step handles at most ARGV[9] tasks; a due time <= now in the
-- reply means "call again now". With nothing due or expired it runs seven
-- commands.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), redis.call('LLEN', KEYS[3]), 0, 0, -1, -1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local now = tonumber(ARGV[3])
local limit = tonumber(ARGV[9])
local rnow = redis_now()
local forwarded, recovered = 0, 0
local was_empty = nil

local due = earliest(KEYS[5], KEYS[6])
if due and due <= now then
  was_empty = redis.call('LLEN', KEYS[3]) == 0
  for _, z in ipairs({KEYS[5], KEYS[6]}) do
    local ids = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, limit)
    for _, id in ipairs(ids) do
      redis.call('ZREM', z, id)
      local rec = redis.call('HGET', KEYS[2], id)
      if rec_ok(rec) then
        redis.call('HSET', KEYS[2], id, rec_patch(rec, 1, nil, nil, nil, nil, nil))
      end
      if rec then
        redis.call('LPUSH', KEYS[3], id)
        forwarded = forwarded + 1
      end
    end
  end
  due = earliest(KEYS[5], KEYS[6])
end

local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) <= rnow then
  if was_empty == nil then was_empty = redis.call('LLEN', KEYS[3]) == 0 end
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', rnow, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[4], id)
    local rec = redis.call('HGET', KEYS[2], id)
    if rec_ok(rec) then
      local err = 'tide: lease expired: the worker died, stalled or lost Redis while processing the task'
      if rec_retried(rec) < rec_maxretry(rec) then
        redis.call('HSET', KEYS[2], id, rec_patch(rec, 1, nil, rec_retried(rec) + 1, now, now, err))
        redis.call('RPUSH', KEYS[3], id)
      else
        release_uniq(rec, ARGV[6], id)
        redis.call('HSET', KEYS[2], id, rec_patch(rec, 5, nil, nil, nil, now, err .. '; no retries left'))
        redis.call('ZADD', KEYS[7], now, id)
      end
      recovered = recovered + 1
    end
  end
  count_day(KEYS[2], ARGV[10], recovered, recovered)
  first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
end

if ARGV[11] == '1' then
  local function drop(z, ids)
    for _, id in ipairs(ids) do
      redis.call('ZREM', z, id)
      redis.call('HDEL', KEYS[2], id)
      redis.call('HDEL', KEYS[9], id)
    end
  end
  drop(KEYS[8], redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now, 'LIMIT', 0, limit))
  drop(KEYS[7], redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now - tonumber(ARGV[8]), 'LIMIT', 0, limit))
  local excess = redis.call('ZCARD', KEYS[7]) - tonumber(ARGV[7])
  if excess > 0 then
    drop(KEYS[7], redis.call('ZRANGE', KEYS[7], 0, math.min(excess, limit) - 1))
  end
end

local pending = redis.call('LLEN', KEYS[3])
if was_empty and pending > 0 then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
local lease = -1
if first[2] then lease = math.max(tonumber(first[2]) - rnow, 1) end
return {1, 0, pending, forwarded, recovered, due or -1, lease}
