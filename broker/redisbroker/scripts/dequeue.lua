-- dequeue.lua: lease up to n tasks of one partition.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] active zset (lease expiry)
-- KEYS[4] paused flag   KEYS[5] archived zset KEYS[6] results hash
-- KEYS[7] scheduled zset KEYS[8] retry zset  KEYS[9] token sequence
-- KEYS[10] layout meta  KEYS[11] reply cache  KEYS[12] limits hash (see share.lua)
-- KEYS[13] starts zset (token -> start ms)
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] n  ARGV[5] lease ms  ARGV[6] event channel  ARGV[7] partition
-- Returns a flat array id1, record1, id2, record2, ... of the leased tasks with
-- state set to active and a fresh token each. Pending tasks come first
-- (oldest first); when fewer than n are pending, scheduled and retry tasks
-- due by the Redis clock are leased directly, earliest first, without a
-- detour through the pending list (this is what makes a burst of tasks due at
-- the same instant start at the rate workers take them). An ID without a
-- record is dropped; a record with an unreadable header is archived with a
-- reason (its bytes kept as the result) and not returned. A request run again
-- returns the tasks its first run leased that are still leased to it, and
-- leases nothing more. When the partition has a concurrency share (field c of
-- its limits hash, see share.lua), it leases at most the room left under it:
-- the share minus the tasks active in the partition (leased, not settled nor
-- recovered). When it has a rate share (r tasks per per ms), it leases at most
-- r minus the tasks it started in the last per ms (the starts zset, a sliding
-- window), and records each start; when that leaves no room while tasks wait,
-- it announces once when room opens again ("p<partition>:<ms>" event).
local bad = layout_error(KEYS[10], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[11], ARGV[2], tonumber(ARGV[3]))
if cached then
  local out = {}
  local prev = cmsgpack.unpack(cached)
  for i = 1, #prev, 2 do
    local rec = redis.call('HGET', KEYS[1], prev[i])
    if rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == prev[i+1] then
      out[#out + 1] = prev[i]
      out[#out + 1] = rec
    end
  end
  return out
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {} end
local n = tonumber(ARGV[4])
local lim = redis.call('HMGET', KEYS[12], 'c', 'r', 'per')
if lim[1] then
  local room = tonumber(lim[1]) - redis.call('ZCARD', KEYS[3])
  if room <= 0 then return {} end
  if room < n then n = room end
end
local now = redis_now()
local per = nil
if lim[2] then
  per = tonumber(lim[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[13], '-inf', now - per)
  local room = tonumber(lim[2]) - redis.call('ZCARD', KEYS[13])
  if room <= 0 then
    local first = redis.call('ZRANGE', KEYS[13], 0, 0, 'WITHSCORES')
    local at = string.format('%d', (tonumber(first[2]) or now) + per)
    if redis.call('LLEN', KEYS[2]) > 0 and redis.call('HGET', KEYS[12], 'w') ~= at then
      redis.call('HSET', KEYS[12], 'w', at)
      redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[7] .. ':' .. at)
    end
    return {}
  end
  if room < n then n = room end
end
local ids = redis.call('RPOP', KEYS[2], n) or {}
if #ids < n then
  for _, z in ipairs({KEYS[7], KEYS[8]}) do
    local want = n - #ids
    if want <= 0 then break end
    local due = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, want)
    if #due > 0 then
      redis.call('ZREM', z, unpack(due))
      for _, id in ipairs(due) do ids[#ids + 1] = id end
    end
  end
end
if #ids == 0 then return {} end
local exp = now + tonumber(ARGV[5])
local tok = next_tokens(KEYS[9], #ids)
local out, leased = {}, {}
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', KEYS[1], id)
  if rec_ok(rec) then
    rec = rec_patch(rec, 2, tok, nil, nil, nil, nil)
    redis.call('HSET', KEYS[1], id, rec)
    redis.call('ZADD', KEYS[3], exp, id)
    out[#out + 1] = id
    out[#out + 1] = rec
    leased[#leased + 1] = id
    leased[#leased + 1] = tok
    tok = tok + 1
  elseif rec then
    redis.call('HSET', KEYS[6], id, rec)
    redis.call('HSET', KEYS[1], id, rec_corrupt(now, 'tide: undecodable task record (' .. #rec .. ' bytes, bad header); original bytes kept as the result'))
    redis.call('ZADD', KEYS[5], now, id)
  end
end
if per and #leased > 0 then
  local starts = {}
  for i = 2, #leased, 2 do
    starts[#starts + 1] = now
    starts[#starts + 1] = string.format('%d', leased[i])
  end
  redis.call('ZADD', KEYS[13], unpack(starts))
  redis.call('PEXPIRE', KEYS[13], per)
end
req_put(KEYS[11], ARGV[2], cmsgpack.pack(leased), tonumber(ARGV[3]))
return out
