-- remove.lua: delete or cancel one task.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] scheduled zset
-- KEYS[4] retry zset    KEYS[5] archived zset KEYS[6] completed zset
-- KEYS[7] results hash  KEYS[8] active zset   KEYS[9] unique locks hash
-- KEYS[10] layout meta  KEYS[11] reply cache KEYS[12] moving zset (repartition)
-- KEYS[13] attempt histories hash  KEYS[14..19] group keys (groups.lua)
-- KEYS[20] progress hash  KEYS[21..23] waiter keys (w_keys in lib.lua)
-- KEYS[24] events stream  KEYS[25] leaving hash (relocate.lua)
-- KEYS[26] pointers zset (ids.lua)
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] id  ARGV[5] op  ARGV[6] event channel  ARGV[7] done channel
-- ARGV[8] events stream MAXLEN ('' or '0': no events)
-- ARGV[9] a hash tag of this partition (for follow-up IDs, fu_end)
-- ARGV[10] partition (for the 'p' event when a follow-up was stored)
-- ARGV[11] '1' when this is the task ID's own partition: a task deleted
--   while a Replace moves it out of it (relocate.lua, leave 'i') leaves
--   the move's claim (ids.lua, 'v') in its place, so that the ID stays
--   taken for the task the move stores in its new group
-- ARGV[12] '1' when this lookup removed the task's placeholder in the new
--   span (answer '5' before): only then is a record that a repartition has
--   taken (flagged as moving, in the moving zset) deleted or cancelled,
--   else the answer is '9' and the caller looks again (the step that took
--   it would place its copy over the placeholder)
-- op 'delete': delete a task that is not active.
-- op 'cancel': delete a task that is not active, or record the cancellation
--   of an active one (flag in its record, read by Extend and Settle) and
--   publish "c<id>" so that the server running it cancels its handler now.
-- op 'cancelactive': only the latter; a task that is not active is refused.
-- op 'cancelstep': 'cancel' for the step of a cancelled flow
--   (broker.Flows.CancelStepTask): a finished followed task is left as it
--   is ('8'); a task not found answers '7' when a follow-up of it is still
--   stored (its end will reach the flow), else '0'; an unreadable record
--   is removed and answers '0' (nothing will report its end).
-- Returns '1' deleted, '0' not found, '2' active (delete refused),
-- '3' cancellation recorded, '4<state>' not active (cancelactive refused),
-- '5' the task was about to move in here from the old span of a repartition:
-- its placeholder is removed, the caller removes it there too; '6' a
-- workflow follow-up (rec_flowfu), which is left alone; '7' and '8' as
-- above; '9' a free ID's pointer (ids.lua) stands here, written since the
-- caller looked, or a record a repartition has taken while ARGV[12] is not
-- '1': it is left alone (not cached) and the caller looks again.
-- A flow's step that has not finished is archived instead of deleted
-- ("deleted by an operator", "cancelled"), which is its end: its follow-up
-- is stored (fu_end) so that its flow learns. A deleted task's waiters are
-- told (w_ended); a deleted task that had not finished gets no follow-up (a
-- NotifyURL reports completed and archived tasks only). Deleting the task
-- that holds an ordered group's place lets the group run again: idle
-- servers are woken ("p<partition>"). A request run again
-- answers from the reply cache. The events stream gets 'x' for a task
-- deleted by 'delete', 'c' for one deleted by 'cancel' and for a
-- cancellation recorded.
local bad = layout_error(KEYS[10], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[11], ARGV[2], tonumber(ARGV[3]))
if cached then return cached end
local id, op = ARGV[4], ARGV[5]
local G = g_keys(14)
local E = ev_new(KEYS[24], ARGV[8])

local function answer(code)
  req_put(KEYS[11], ARGV[2], code, tonumber(ARGV[3]))
  return code
end

local rec = redis.call('HGET', KEYS[1], id)
if not rec then
  if op == 'cancelstep' then
    -- Ended and gone (deleted as done, or by an earlier run of this
    -- request): its follow-up, stored in this partition when it ended
    -- (fu_end), tells its flow unless it already has.
    local base = 'tide:f{' .. ARGV[9] .. '}:' .. id
    if redis.call('HEXISTS', KEYS[1], base) == 1 then return answer('7') end
    for k = 2, 8 do
      if redis.call('HEXISTS', KEYS[1], base .. '#' .. k) == 1 then return answer('7') end
    end
  end
  return answer('0')
end
if rec_absent(rec) then
  if op == 'cancelactive' then return answer('0') end
  redis.call('HDEL', KEYS[1], id)
  return answer('5')
end
if string.sub(rec, 1, 2) == '\0g' then return '9' end -- a pointer is no task
if ARGV[12] ~= '1' and op ~= 'cancelactive' and rec_ok(rec) and rec_moving(rec) and redis.call('ZSCORE', KEYS[12], id) then
  return '9' -- a repartition took it: its placeholder goes first
end
if rec_flowfu(rec) then return answer('6') end -- tide's own bookkeeping
local st = nil
if rec_ok(rec) then st = rec_state(rec)
elseif redis.call('ZSCORE', KEYS[8], id) then st = 2 end
if st == 2 then
  if op == 'delete' then return answer('2') end
  if rec_ok(rec) and not rec_canceled(rec) then
    redis.call('HSET', KEYS[1], id, rec_mark_canceled(rec))
    if E then
      ev_add(E, 'c', id, rec_type(rec))
      ev_flush(E)
    end
  end
  redis.call('PUBLISH', ARGV[6], 'c' .. id)
  return answer('3')
end
if op == 'cancelactive' then return answer('4' .. (st or 0)) end
if op == 'cancelstep' and (st == 5 or st == 6) then
  -- Finished: its follow-up was stored when it ended; one that is not
  -- followed has nothing to report it (answered as not found).
  if rec_followed(rec) then return answer('8') end
  return answer('0')
end
if st and st ~= 5 and st ~= 6 and rec_flow(rec) then
  -- A flow's step that has not finished is not deleted: it is archived,
  -- and its end recorded for its flow. One a repartition is moving out
  -- (its placeholder in the new partition is gone by now: see
  -- Broker.remove) stays here, archived, and moves with the next round.
  local now = redis_now()
  local why = op == 'delete' and 'tide: deleted by an operator' or 'tide: task cancelled'
  local g, seq = g_of(G, id)
  if rec_moving(rec) then redis.call('ZREM', KEYS[12], id)
  elseif st == 1 then
    if g then g_unready(G, g, seq, id) else redis.call('LREM', KEYS[2], 1, id) end
  else redis.call('ZREM', zset_of(st, KEYS), id) end
  local woke = g and g_release(G, g, id, false, true)
  release_uniq(rec, KEYS[9], id)
  local was_empty = redis.call('LLEN', KEYS[2]) == 0
  local F = {t = KEYS[1], p = KEYS[2], tag = ARGV[9]}
  if (fu_end(F, E, id, rec, 'a', now, why, now) and was_empty) or woke then
    redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[10])
  end
  redis.call('HSET', KEYS[1], id, rec_patch(rec, 5, nil, nil, nil, now, why))
  redis.call('ZADD', KEYS[5], now, id)
  w_ended(w_keys(21), id, 'a' .. string.format('%d', now), now, ARGV[7])
  if E then
    ev_add(E, 'a', id, rec_type(rec), why)
    ev_flush(E)
  end
  return answer('1')
end
local leaving = nil
if st and rec_moving(rec) then
  -- Taken out of its structure by a repartition or a move: only the record
  -- is left.
  redis.call('ZREM', KEYS[12], id)
  release_uniq(rec, KEYS[9], id)
  if ARGV[11] == '1' then leaving = redis.call('HGET', KEYS[25], id) end
elseif st then
  if st == 1 then
    local g, seq = g_of(G, id)
    if g then g_unready(G, g, seq, id) else redis.call('LREM', KEYS[2], 1, id) end
  else redis.call('ZREM', zset_of(st, KEYS), id) end
  release_uniq(rec, KEYS[9], id)
else
  -- Unreadable record: remove every trace.
  redis.call('LREM', KEYS[2], 0, id)
  for k = 3, 6 do redis.call('ZREM', KEYS[k], id) end
end
redis.call('HDEL', KEYS[1], id)
if leaving then
  -- "<nonce><score>\0<deadline>\0<new group>": the move's claim, from
  -- no group of another partition, its time the deadline (later than the
  -- move's: its repair waits a little longer).
  local z = string.find(leaving, '\0', 17, true)
  local z2 = string.find(leaving, '\0', z + 1, true)
  local deadline = string.sub(leaving, z + 1, z2 - 1)
  redis.call('HSET', KEYS[1], id, '\0gv' .. string.sub(leaving, 1, 16) .. deadline .. '\0' .. string.sub(leaving, z2 + 1) .. '\0')
  redis.call('ZADD', KEYS[26], tonumber(deadline), id)
end
redis.call('HDEL', KEYS[7], id, dur_field(id))
redis.call('HDEL', KEYS[13], id)
redis.call('HDEL', KEYS[20], id)
if g_forget(G, id) then redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[10]) end
if st ~= 5 and st ~= 6 then
  -- A finished task's end was told when it finished.
  w_ended(w_keys(21), id, 'x', redis_now(), ARGV[7])
end
if E then
  ev_add(E, op == 'delete' and 'x' or 'c', id, rec_type(rec))
  ev_flush(E)
end
if op == 'cancelstep' and not st then return answer('0') end
return answer('1')
