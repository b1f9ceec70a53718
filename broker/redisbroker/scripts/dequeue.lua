-- dequeue.lua: lease up to n tasks of one partition.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] active zset (lease expiry, Redis clock)
-- KEYS[4] paused flag   KEYS[5] archived zset KEYS[6] results hash
-- KEYS[7] scheduled zset KEYS[8] retry zset
-- ARGV[1] n  ARGV[2] lease ms  ARGV[3] now ms (caller's clock, for due times)
-- Returns a flat array id1, record1, id2, record2, ... of the leased tasks with
-- state set to active and the token incremented. Pending tasks come first
-- (oldest first); when fewer than n are pending, scheduled and retry tasks
-- already due are leased directly, earliest first, without a detour through
-- the pending list (this is what makes a burst of tasks due at the same
-- instant start at the rate workers take them). An ID without a record is
-- dropped; a record with an unreadable header is archived with a reason (its
-- bytes kept as the result) and not returned.
if redis.call('EXISTS', KEYS[4]) == 1 then return {} end
local n = tonumber(ARGV[1])
local ids = redis.call('RPOP', KEYS[2], n) or {}
if #ids < n then
  for _, z in ipairs({KEYS[7], KEYS[8]}) do
    local want = n - #ids
    if want <= 0 then break end
    local due = redis.call('ZRANGEBYSCORE', z, '-inf', ARGV[3], 'LIMIT', 0, want)
    if #due > 0 then
      redis.call('ZREM', z, unpack(due))
      for _, id in ipairs(due) do ids[#ids + 1] = id end
    end
  end
end
if #ids == 0 then return {} end
local now = redis_now()
local exp = now + tonumber(ARGV[2])
local out = {}
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', KEYS[1], id)
  if rec_ok(rec) then
    rec = rec_patch(rec, 2, rec_token(rec) + 1, nil, nil, nil, nil)
    redis.call('HSET', KEYS[1], id, rec)
    redis.call('ZADD', KEYS[3], exp, id)
    out[#out + 1] = id
    out[#out + 1] = rec
  elseif rec then
    redis.call('HSET', KEYS[6], id, rec)
    redis.call('HSET', KEYS[1], id, rec_corrupt(now, 'tide: undecodable task record (' .. #rec .. ' bytes, bad header); original bytes kept as the result'))
    redis.call('ZADD', KEYS[5], now, id)
  end
end
return out
