-- maintain.lua: claim one partition and, when owned, move it forward.
-- KEYS[1] owner key     KEYS[2] records hash  KEYS[3] pending list
-- KEYS[4] active zset   KEYS[5] scheduled zset KEYS[6] retry zset
-- KEYS[7] archived zset KEYS[8] completed zset KEYS[9] results hash
-- KEYS[10] unique locks hash  KEYS[11] stats hash  KEYS[12] layout meta
-- KEYS[13] attempt histories hash  KEYS[14] minute counters hash
-- KEYS[15..20] group keys (groups.lua)  KEYS[21] progress hash
-- KEYS[22..24] waiter keys (w_keys in lib.lua)  KEYS[25] limits hash
-- KEYS[26] events stream
-- ARGV[1] layout  ARGV[2] owner  ARGV[3] owner TTL ms  ARGV[4] event channel
-- ARGV[5] partition  ARGV[6] max archived  ARGV[7] archive TTL ms
-- ARGV[8] per-step limit  ARGV[9] today (UTC, YYYY-MM-DD)
-- ARGV[10] '1' to release the claim instead (a clean shutdown)
-- ARGV[11] back-off of a recovered task's first retry, ms (doubled per retry;
--          0: pending at once)
-- ARGV[12] this minute (Unix minutes): the pending count is sampled under it
-- ARGV[13] done channel (tasks someone waits for)
-- ARGV[14] events stream MAXLEN ('' or '0': no events)
-- ARGV[15] events kept at most this long, ms (0: no age bound)
-- ARGV[16] a hash tag of this partition (for follow-up IDs, fu_end)
-- Returns {owned, retry-in ms, pending, forwarded, recovered, trimmed, more,
--          next due ms or -1, next lease expiry in ms or -1}.
-- All times are the Redis clock's. When owned it forwards scheduled and
-- retry tasks that are due to pending; recovers active tasks whose lease
-- expired (to retry after a back-off, with "lease expired" as their last
-- error and the attempt counted, or to the archive when none is left or the
-- task was cancelled; a record that cannot be read is archived with the
-- reason); deletes completed tasks past retention; trims the archive by age
-- and size; and drops day counters older than 90 days. Each step handles at
-- most ARGV[8] tasks; more = 1 says to call again at once. Releasing deletes
-- the claim if the caller holds it and publishes "r<partition>" so that
-- another server claims the partition at once. A grouped task that becomes
-- due joins its group's ready tasks; one whose lease expired gives its
-- group's slot back (and its ordered place when it is archived); one that
-- is archived tells its waiters (w_ended) and whoever follows it (fu_end: a
-- workflow step's flow, a NotifyURL). Recovered leases free slots of the
-- partition's concurrency limit: with tasks waiting, idle servers are
-- woken. A recovered task is recorded in
-- the events stream as 'f' (lease expired) then 'r' or 'a'; events older
-- than ARGV[15] are trimmed (ev_trim_age).
local bad = layout_error(KEYS[12], ARGV[1])
if bad then return bad end
local cur = redis.call('GET', KEYS[1])
if ARGV[10] == '1' then
  if cur == ARGV[2] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[4], 'r' .. ARGV[5])
  end
  return {0, 0, 0, 0, 0, 0, 0, -1, -1}
end
if cur and cur ~= ARGV[2] then
  return {0, redis.call('PTTL', KEYS[1]), redis.call('LLEN', KEYS[3]) + redis.call('ZCARD', KEYS[15]), 0, 0, 0, 0, -1, -1}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
local now = redis_now()
local limit = tonumber(ARGV[8])
local forwarded, recovered, more = 0, 0, false
local was_empty = nil
local G = g_keys(15)
if redis.call('EXISTS', G.id) == 0 then
  G = nil
else
  local gl = redis.call('HMGET', KEYS[25], 'gc', 'gr', 'ord')
  g_uncounted(G, gl[1], gl[2], gl[3])
end
local woke = false
local W = w_keys(22)
local E = ev_new(KEYS[26], ARGV[14])
local F = {t = KEYS[2], p = KEYS[3], tag = ARGV[16]}

local due = earliest(KEYS[5], KEYS[6])
if due and due <= now then
  was_empty = redis.call('LLEN', KEYS[3]) == 0
  for _, z in ipairs({KEYS[5], KEYS[6]}) do
    local ids = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, limit)
    if #ids == limit then more = true end
    for _, id in ipairs(ids) do
      redis.call('ZREM', z, id)
      local rec = redis.call('HGET', KEYS[2], id)
      if rec_ok(rec) then
        redis.call('HSET', KEYS[2], id, rec_patch(rec, 1, nil, nil, nil, nil, nil))
      end
      local g, seq = nil, nil
      if G then g, seq = g_of(G, id) end
      if g then
        g_ready(G, g, seq, id)
        forwarded = forwarded + 1
        woke = true
      elseif rec then
        redis.call('LPUSH', KEYS[3], id)
        forwarded = forwarded + 1
      end
    end
  end
end

local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) <= now then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, limit)
  if #expired == limit then more = true end
  local base = tonumber(ARGV[11])
  local err = 'tide: lease expired: the worker died, stalled or lost Redis while processing the task'
  for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[4], id)
    local rec = redis.call('HGET', KEYS[2], id)
    local g, seq = nil, nil
    if G then g, seq = g_of(G, id) end
    local finished = true
    if rec_ok(rec) then
      hist_add(KEYS[13], id, 0, now, 'l', '', err)
      local n = rec_retried(rec)
      local typ = E and rec_type(rec)
      if E then ev_add(E, 'f', id, typ, err) end
      if rec_canceled(rec) then
        if was_empty == nil then was_empty = redis.call('LLEN', KEYS[3]) == 0 end
        fu_end(F, E, id, rec, 'a', now, 'tide: task cancelled; ' .. err, now)
        release_uniq(rec, KEYS[10], id)
        redis.call('HSET', KEYS[2], id, rec_patch(rec, 5, nil, nil, nil, now, 'tide: task cancelled; ' .. err))
        redis.call('ZADD', KEYS[7], now, id)
        ev_add(E, 'a', id, typ, 'tide: task cancelled; ' .. err)
      elseif n < rec_maxretry(rec) then
        -- Back off like a failed attempt: a task that kills its worker must
        -- not hit the fleet again at once.
        local d = math.min(base * 2 ^ math.min(n, 20), 3600000)
        finished = false
        ev_add(E, 'r', id, typ, err)
        if d <= 0 then
          redis.call('HSET', KEYS[2], id, rec_patch(rec, 1, nil, n + 1, now, now, err))
          if g then
            g_ready(G, g, seq, id)
          else
            redis.call('RPUSH', KEYS[3], id)
            if was_empty == nil then was_empty = redis.call('LLEN', KEYS[3]) == 1 end
          end
        else
          -- equal jitter (between half and all of d), varied by task
          local h = now % 997
          for c = 1, #id do h = (h * 31 + string.byte(id, c)) % 997 end
          local at = now + math.floor(d / 2 + (d / 2) * (h / 997))
          redis.call('HSET', KEYS[2], id, rec_patch(rec, 4, nil, n + 1, at, now, err))
          redis.call('ZADD', KEYS[6], at, id)
        end
      else
        if was_empty == nil then was_empty = redis.call('LLEN', KEYS[3]) == 0 end
        fu_end(F, E, id, rec, 'a', now, err .. '; no retries left', now)
        release_uniq(rec, KEYS[10], id)
        redis.call('HSET', KEYS[2], id, rec_patch(rec, 5, nil, nil, nil, now, err .. '; no retries left'))
        redis.call('ZADD', KEYS[7], now, id)
        ev_add(E, 'a', id, typ, err .. '; no retries left')
      end
    elseif rec then
      redis.call('HSET', KEYS[9], id, rec)
      redis.call('HSET', KEYS[2], id, rec_corrupt(now, 'tide: undecodable task record (' .. #rec .. ' bytes, bad header), found when its lease expired; original bytes kept as the result'))
      redis.call('ZADD', KEYS[7], now, id)
      ev_add(E, 'a', id, '', 'tide: undecodable task record')
    end
    if g and g_release(G, g, id, true, finished) then woke = true end
    if finished then w_ended(W, id, 'a' .. string.format('%d', now), now, ARGV[13]) end
    recovered = recovered + 1
  end
  count_day(KEYS[11], ARGV[9], recovered, recovered)
  count_minute(KEYS[14], ARGV[12], recovered, recovered)
  first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
end
ev_flush(E)
local ev_age = tonumber(ARGV[15]) or 0
if ev_age > 0 then ev_trim_age(KEYS[26], now - ev_age) end

-- Groups' rate windows: forget those whose newest start left the window, a
-- few at a time from a cursor, so that groups gone idle leave nothing.
local GL, GS = KEYS[20], KEYS[18] -- rate windows and group state (g_keys(15))
if redis.call('EXISTS', GL) == 1 then
  local per = tonumber(redis.call('HGET', KEYS[25], 'gper') or '0')
  local r = redis.call('HSCAN', GL, redis.call('HGET', GS, 'lc') or '0', 'COUNT', 100)
  redis.call('HSET', GS, 'lc', r[1])
  for j = 1, #r[2], 2 do
    local log = r[2][j + 1]
    if #log < 6 or struct.unpack('>I6', log, #log - 5) <= now - per then redis.call('HDEL', GL, r[2][j]) end
  end
end
local trimmed, tmore = trim(KEYS[8], KEYS[7], KEYS[2], KEYS[9], KEYS[13], now, tonumber(ARGV[6]), tonumber(ARGV[7]), limit, G, KEYS[21])
more = more or tmore
if redis.call('HLEN', KEYS[11]) > 184 then
  -- p:<day> and f:<day>: keep the newest 92 days
  local fields = redis.call('HKEYS', KEYS[11])
  table.sort(fields, function(x, y) return string.sub(x, 3) < string.sub(y, 3) end)
  for i = 1, #fields - 184 do redis.call('HDEL', KEYS[11], fields[i]) end
end

due = earliest(KEYS[5], KEYS[6])
local pending = redis.call('LLEN', KEYS[3]) + redis.call('ZCARD', KEYS[15])
-- The live view's backlog, and its counters kept for two hours.
redis.call('HSET', KEYS[14], 'q:' .. ARGV[12], pending)
if redis.call('HLEN', KEYS[14]) > 400 then
  local cut = tonumber(ARGV[12]) - 120
  for _, f in ipairs(redis.call('HKEYS', KEYS[14])) do
    if (tonumber(string.sub(f, 3)) or 0) < cut then redis.call('HDEL', KEYS[14], f) end
  end
end
if (was_empty and pending > 0) or woke or (recovered > 0 and redis.call('HEXISTS', KEYS[25], 'c') == 1 and (redis.call('LLEN', KEYS[3]) > 0 or g_waiting(G, now))) then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
local lease = -1
if first[2] then lease = math.max(tonumber(first[2]) - now, 1) end
return {1, 0, pending, forwarded, recovered, trimmed, more and 1 or 0, due or -1, lease}
