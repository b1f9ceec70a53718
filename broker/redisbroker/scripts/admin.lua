-- admin.lua: operator actions on tasks of one partition.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] scheduled zset
-- KEYS[4] retry zset    KEYS[5] archived zset KEYS[6] completed zset
-- KEYS[7] results hash  KEYS[8] active zset   KEYS[9] unique locks hash
-- KEYS[10] layout meta  KEYS[11] reply cache KEYS[12] attempt histories hash
-- KEYS[13..18] group keys (groups.lua)  KEYS[19] progress hash
-- KEYS[20..22] waiter keys (w_keys in lib.lua)  KEYS[23] events stream
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] op: 'run' | 'archive' (one task) or 'runall' | 'archiveall' | 'deleteall'
-- ARGV[5] task ID (one task) or state number (bulk)
-- ARGV[6] limit (bulk)  ARGV[7] event channel  ARGV[8] partition
-- ARGV[9] done channel: archived and deleted tasks tell their waiters
-- ARGV[10] events stream MAXLEN ('' or '0': no events)
-- ARGV[11] a hash tag of this partition (for follow-up IDs, fu_end)
-- Returns, for one task: 1 done, 0 not found, -state when the task's state
-- does not allow the action, -97 for an archived workflow step or batch
-- task (its end is recorded: it does not run again), -96 for archiving a
-- workflow follow-up (rec_flowfu: tide's own bookkeeping), -98 while a
-- repartition moves it, -99 when its record is unreadable (answered from
-- the reply cache when run again);
-- for bulk: the number of tasks handled (at most the limit; call again
-- until 0). Run again, a request answers from the reply cache: a bulk one
-- with the count of its first run, not with what is left then.
-- 'run' makes a scheduled, retry, waiting or archived task pending at the
-- front (a waiting one's wait ends now: dur_wake_now)
-- ('runall' passes over archived workflow steps, looking at most ten times
-- the limit); 'archive' archives a pending, scheduled, retry or waiting task (its
-- unique lock is released); 'deleteall' deletes tasks that are not active,
-- but archives a workflow step or batch task that has not finished (as
-- remove.lua's delete does). 'archiveall' and 'deleteall' pass over
-- workflow follow-ups. Archiving is a task's end: whoever follows it
-- gets its follow-up (fu_end). An archived or deleted task that held an
-- ordered group's place lets the group run again, which wakes idle
-- servers. A grouped task
-- made pending joins its group's ready tasks; the bulk operations on
-- pending tasks take the ungrouped ones first, then the grouped ones.
-- The events stream gets 'r' for a task run, 'a' for one archived and 'x'
-- for one deleted.
local bad = layout_error(KEYS[10], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[11], ARGV[2], tonumber(ARGV[3]))
if cached then return tonumber(cached) end
local op, now = ARGV[4], redis_now()
local was_empty = redis.call('LLEN', KEYS[2]) == 0
local G = g_keys(13)
local W = w_keys(20)
local woke = false
local E = ev_new(KEYS[23], ARGV[10])
local F = {t = KEYS[1], p = KEYS[2], tag = ARGV[11]}

local function run(id, rec, st)
  redis.call('ZREM', zset_of(st, KEYS), id)
  if rec_state(rec) == 7 then dur_wake_now(KEYS[7], id, now) end
  redis.call('HSET', KEYS[1], id, rec_patch(rec, 1, nil, nil, now, nil, nil))
  local g, seq = g_of(G, id)
  if g then
    g_ready(G, g, seq, id)
    woke = true
  else
    redis.call('RPUSH', KEYS[2], id)
  end
  if E then ev_add(E, 'r', id, rec_type(rec)) end
end

-- archive moves a task to the archive; in_list says the caller removes a
-- pending task from the list itself.
local function archive(id, rec, st, in_list, why)
  local g, seq = g_of(G, id)
  if st ~= 1 then redis.call('ZREM', zset_of(st, KEYS), id)
  elseif g then g_unready(G, g, seq, id)
  elseif not in_list then redis.call('LREM', KEYS[2], 1, id) end
  if g and g_release(G, g, id, false, true) then woke = true end
  release_uniq(rec, KEYS[9], id)
  fu_end(F, E, id, rec, 'a', now, why or 'tide: archived by an operator', now)
  redis.call('HSET', KEYS[1], id, rec_patch(rec, 5, nil, nil, nil, now, why))
  redis.call('ZADD', KEYS[5], now, id)
  w_ended(W, id, 'a' .. string.format('%d', now), now, ARGV[9])
  if E then ev_add(E, 'a', id, rec_type(rec)) end
end

local function remove(id, rec)
  if rec_ok(rec) then release_uniq(rec, KEYS[9], id) end
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[7], id, dur_field(id))
  redis.call('HDEL', KEYS[12], id)
  redis.call('HDEL', KEYS[19], id)
  if g_forget(G, id) then woke = true end
  if not (rec_ok(rec) and (rec_state(rec) == 5 or rec_state(rec) == 6)) then
    w_ended(W, id, 'x', now, ARGV[9]) -- a finished task's end was told already
  end
  if E then ev_add(E, 'x', id, rec_type(rec)) end
end

local function done(n)
  ev_flush(E)
  if woke or (was_empty and redis.call('LLEN', KEYS[2]) > 0) then
    redis.call('PUBLISH', ARGV[7], 'p' .. ARGV[8])
  end
  return n
end

if op == 'run' or op == 'archive' then
  local function answer(code)
    req_put(KEYS[11], ARGV[2], tostring(code), tonumber(ARGV[3]))
    return code
  end
  local id = ARGV[5]
  local rec = redis.call('HGET', KEYS[1], id)
  if rec_absent(rec) then return answer(0) end
  if not rec_ok(rec) then return answer(-99) end
  if rec_moving(rec) then return answer(-98) end
  local st = rec_state(rec)
  if op == 'run' then
    if st ~= 3 and st ~= 4 and st ~= 5 and st ~= 7 then return answer(-st) end
    if st == 5 and rec_flow(rec) then return answer(-97) end
    run(id, rec, st)
  else
    if st ~= 1 and st ~= 3 and st ~= 4 and st ~= 7 then return answer(-st) end
    if rec_flowfu(rec) then return answer(-96) end
    archive(id, rec, st, false)
  end
  return answer(done(1))
end

-- bulk_done answers a bulk request, keeping its answer for a run again.
local function bulk_done(n)
  req_put(KEYS[11], ARGV[2], tostring(n), tonumber(ARGV[3]))
  return done(n)
end

local st, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local ids
if st == 1 then
  if op == 'runall' then return 0 end
  -- Take the oldest (right-hand) end of the list and cut it off in one step.
  local len = redis.call('LLEN', KEYS[2])
  ids = redis.call('LRANGE', KEYS[2], math.max(len - limit, 0), -1)
  if #ids >= len then
    redis.call('DEL', KEYS[2]) -- LTRIM 0 -1 would keep everything
  else
    redis.call('LTRIM', KEYS[2], 0, len - #ids - 1)
  end
  if #ids < limit then
    -- then grouped ones: taken out of their groups here, so in_list below
    for _, m in ipairs(redis.call('ZRANGE', G.q, 0, limit - #ids - 1)) do
      local sep = string.find(m, '\0', 1, true)
      local g, id = string.sub(m, 1, sep - 1), string.sub(m, sep + 9)
      g_unready(G, g, string.sub(m, sep + 1, sep + 8), id)
      ids[#ids + 1] = id
    end
  end
  local n = 0
  for _, id in ipairs(ids) do
    local rec = redis.call('HGET', KEYS[1], id)
    if rec_flowfu(rec) then
      -- tide's own: back in the list, behind the others, so that the next
      -- call reaches them
      redis.call('LPUSH', KEYS[2], id)
      n = n - 1
    elseif op == 'deleteall' and rec_ok(rec) and rec_flow(rec) then
      archive(id, rec, 1, true, 'tide: deleted by an operator')
    elseif op == 'deleteall' then
      if rec then remove(id, rec) end
    elseif rec_ok(rec) then
      archive(id, rec, 1, true)
    elseif rec then
      redis.call('HSET', KEYS[7], id, rec)
      redis.call('HSET', KEYS[1], id, rec_corrupt(now, 'tide: undecodable task record; archived by an operator'))
      redis.call('ZADD', KEYS[5], now, id)
      ev_add(E, 'a', id, '', 'tide: undecodable task record')
    end
    n = n + 1
  end
  return bulk_done(n)
end
local z = zset_of(st, KEYS)
if not z then return 0 end
-- Tasks passed over (archived workflow steps that 'runall' does not run)
-- stay in z: the next page starts after them.
local n, skipped = 0, 0
while n < limit and skipped < 10 * limit do
  ids = redis.call('ZRANGE', z, skipped, skipped + limit - n - 1)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local rec = redis.call('HGET', KEYS[1], id)
    if (rec_flowfu(rec) and op ~= 'runall') or (st == 7 and not (rec_ok(rec) and rec_state(rec) == 7)) then
      skipped = skipped + 1
    elseif op == 'deleteall' and st ~= 5 and st ~= 6 and rec_ok(rec) and rec_flow(rec) then
      archive(id, rec, st, false, 'tide: deleted by an operator')
      n = n + 1
    elseif op == 'deleteall' then
      redis.call('ZREM', z, id)
      if rec then remove(id, rec) end
      n = n + 1
    elseif rec_ok(rec) and op == 'runall' and (st == 3 or st == 4 or st == 7 or (st == 5 and not rec_flow(rec))) then
      run(id, rec, st)
      n = n + 1
    elseif rec_ok(rec) and op == 'archiveall' and (st == 3 or st == 4 or st == 7) then
      archive(id, rec, st, false)
      n = n + 1
    else
      skipped = skipped + 1
    end
  end
end
return bulk_done(n)
