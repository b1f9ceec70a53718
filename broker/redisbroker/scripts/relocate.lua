-- relocate.lua: the steps in the old group's partition S of a Replace that
-- moves a grouped task with a free ID (ids.lua) into a group of another
-- partition D: the ID's partition I holds a move's claim ('v') naming both
-- groups, the task leaves S (leave), the new task is stored in D under the
-- claim (enqueue.lua), and the task left behind is deleted (gone) or, when
-- nothing was stored, put back where it was (stay). See "Free IDs on
-- several partitions" in docs/design.md.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] scheduled zset
-- KEYS[4] retry zset  KEYS[5] archived zset  KEYS[6] completed zset
-- KEYS[7] results hash  KEYS[8] attempt histories hash
-- KEYS[9] unique locks hash  KEYS[10] layout meta  KEYS[11] fences zset
-- KEYS[12] leaving hash (ID -> nonce (16 characters), score, "\0", the
-- move's deadline (ms), "\0" and the new group)  KEYS[13..18] group keys
-- (groups.lua)  KEYS[19] progress hash  KEYS[20] waiters hash
-- KEYS[21] pointers zset (ids.lua)
-- ARGV[1] layout  ARGV[2] op  ARGV[3] ID  ARGV[4] nonce of the move, then:
--   leave 5 the task's group (as its pointer names it; any group of this
--         partition holds the task of the ID)  6 time (ms) after which it may not leave (the
--         move's deadline)  7 the new group
--         8 'i' when this is the ID's own partition I (the task's record
--         is where its pointer goes: a task of no group, or of a group of
--         I, moves out of it; 6 is then '+' and the replay window (ms),
--         and leave answers 'ok:' and the deadline it set, on I's clock)
--   gone  5 event channel  6 partition  7 done channel (a waiter of the
--         task is told, "f<id>", and looks for it again where it went)
--         8 in the ID's own partition (leave's 'i'): the claim's time (ms)
--         of the confirmed pointer naming the new group that takes the
--         record's place ('' elsewhere)  9 its first look (ms from now)
--   stay  5 fence expiry (ms)  6 event channel  7 partition
-- leave takes a waiting or finished task of the group out of where it
-- waits or lies, flags its record as moving (nothing leases, runs, moves
-- or replaces it) and remembers it under the nonce; it returns 'ok' (also
-- when run again), 'gone' no task with the ID, 'busy' it runs, 'no' it
-- cannot be replaced (a workflow's step, one the broker stored itself, one
-- a repartition moves, or one without a group away from its ID's own
-- partition), 'late' the nonce is fenced
-- or the time is past, 'held' a repartition holds free IDs back (field xf).
-- gone deletes the task that left under the nonce (its record, result,
-- history, progress, unique lock and group place; an ordered group's place
-- it held is freed; in the ID's own partition the record's field takes the
-- new group's pointer): '1', or '0' none left under it.
-- stay fences the nonce (leave refuses it from then on) and puts a task
-- that left under it back as it was ('r'); else it answers 'k' a task with
-- the ID is here, or 'g' none is.
local bad = layout_error(KEYS[10], ARGV[1])
if bad then return bad end
local op, id, nonce = ARGV[2], ARGV[3], ARGV[4]
local G = g_keys(13)

-- left_under returns the score of the task that left under the nonce
-- and the group it moves into, or nil.
local function left_under()
  local v = redis.call('HGET', KEYS[12], id)
  if not v or string.sub(v, 1, 16) ~= nonce then return nil end
  local z = string.find(v, '\0', 17, true)
  local z2 = z and string.find(v, '\0', z + 1, true)
  return tonumber(string.sub(v, 17, (z or 0) - 1)), z2 and string.sub(v, z2 + 1) or ''
end

if op == 'leave' then
  local here = ARGV[8] == 'i'
  local deadline = ARGV[6]
  if left_under() then
    if here then
      local v = redis.call('HGET', KEYS[12], id)
      local z = string.find(v, '\0', 17, true)
      return 'ok:' .. string.sub(v, z + 1, string.find(v, '\0', z + 1, true) - 1)
    end
    return 'ok'
  end
  if here then deadline = string.format('%d', redis_now() + tonumber(string.sub(deadline, 2))) end
  if redis.call('ZSCORE', KEYS[11], nonce) or redis_now() > tonumber(deadline) then return 'late' end
  if redis.call('HEXISTS', G.s, 'xf') == 1 then return 'held' end
  local rec = redis.call('HGET', KEYS[1], id)
  if not rec then return 'gone' end
  local g, seq = g_of(G, id)
  if not (g or here) or not rec_ok(rec) or rec_moving(rec) or rec_flow(rec) or rec_internal(rec) then return 'no' end
  local st = rec_state(rec)
  if st == 2 then return 'busy' end
  local score = 0
  if st == 1 then
    if g then g_unready(G, g, seq, id) else redis.call('LREM', KEYS[2], 1, id) end
  else
    local z = zset_of(st, KEYS)
    if z then
      score = tonumber(redis.call('ZSCORE', z, id) or '0')
      redis.call('ZREM', z, id)
    end
  end
  rec = string.sub(rec, 1, 1) .. string.char(string.byte(rec, 2) % 64 + 64 + (rec_canceled(rec) and 128 or 0)) .. string.sub(rec, 3)
  redis.call('HSET', KEYS[1], id, rec)
  redis.call('HSET', KEYS[12], id, nonce .. string.format('%d', score) .. '\0' .. deadline .. '\0' .. ARGV[7])
  if here then return 'ok:' .. deadline end
  return 'ok'
end

if op == 'gone' then
  local score, into = left_under()
  if not score then return '0' end
  redis.call('HDEL', KEYS[12], id)
  local rec = redis.call('HGET', KEYS[1], id)
  if rec and rec_ok(rec) and rec_moving(rec) then
    release_uniq(rec, KEYS[9], id)
    if (ARGV[8] or '') ~= '' then
      -- The ID's own partition: the new group's pointer takes the
      -- record's place (ids.lua).
      redis.call('HSET', KEYS[1], id, '\0gk' .. nonce .. ARGV[8] .. '\0' .. into)
      redis.call('ZADD', KEYS[21], redis_now() + tonumber(ARGV[9]), id)
    else
      redis.call('HDEL', KEYS[1], id)
    end
    redis.call('HDEL', KEYS[7], id, dur_field(id))
    redis.call('HDEL', KEYS[8], id)
    redis.call('HDEL', KEYS[19], id)
    if g_forget(G, id) then redis.call('PUBLISH', ARGV[5], 'p' .. ARGV[6]) end
    if redis.call('HDEL', KEYS[20], id) == 1 then redis.call('PUBLISH', ARGV[7], 'f' .. id) end
  end
  return '1'
end

if op == 'stay' then
  local now = redis_now()
  redis.call('ZADD', KEYS[11], tonumber(ARGV[5]), nonce)
  redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now)
  local score = left_under()
  local rec = redis.call('HGET', KEYS[1], id)
  if not score then
    if rec_ok(rec) then return 'k' end
    return 'g'
  end
  redis.call('HDEL', KEYS[12], id)
  if not (rec and rec_ok(rec) and rec_moving(rec)) then return 'g' end -- deleted meanwhile
  rec = string.sub(rec, 1, 1) .. string.char(string.byte(rec, 2) % 64 + (rec_canceled(rec) and 128 or 0)) .. string.sub(rec, 3)
  redis.call('HSET', KEYS[1], id, rec)
  local st = rec_state(rec)
  if st == 1 then
    local g, seq = g_of(G, id)
    if g then
      if g_ready(G, g, seq, id) then redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[7]) end
    elseif redis.call('RPUSH', KEYS[2], id) == 1 then
      redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[7])
    end
  else
    local z = zset_of(st, KEYS)
    if z then
      local before = earliest(KEYS[3], KEYS[4])
      redis.call('ZADD', z, score, id)
      if (st == 3 or st == 4 or st == 7) and (not before or score < before) then
        redis.call('PUBLISH', ARGV[6], 's' .. ARGV[7] .. ':' .. string.format('%d', score))
      end
    end
  end
  return 'r'
end

return redis.error_reply('ERR relocate.lua: unknown op ' .. tostring(op))
