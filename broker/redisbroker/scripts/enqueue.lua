-- enqueue.lua: store new tasks in one partition.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] scheduled zset
-- KEYS[4] retry zset    KEYS[5] unique locks hash  KEYS[6] layout meta
-- KEYS[7] reply cache  KEYS[8] idempotency keys of this window
-- KEYS[9] idempotency keys of the previous window
-- KEYS[10] active zset  KEYS[11] archived zset  KEYS[12] completed zset
-- KEYS[13] results hash  KEYS[14] attempt histories hash
-- KEYS[15..20] group keys (groups.lua)  KEYS[21] waiters hash
-- KEYS[22] events stream  KEYS[23] fences zset (ids.lua)
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] event channel  ARGV[5] partition
-- ARGV[6] expiry of this window's idempotency keys (ms)
-- ARGV[7] expiry of the waiter registered for a task with the 'w' flag (ms)
-- ARGV[8] events stream MAXLEN ('' or '0': no events)
-- then 8 per task: id, record, kind, due ms, unique key ('' for none),
--   unique TTL ms, idempotency key ('' for none), group ('' for none). kind
--   is 'p' (pending) or 's' (scheduled); upper case when the broker chose
--   the ID; followed by the flags 'r' to replace a task that has the ID
--   (Replace), 'w' to register a waiter for it (wait.lua) and 'f' for a
--   grouped task whose ID does not carry its group as tag (a queue of one
--   partition only: refused while the group state hash has field xf, set
--   by a repartition that starts, see repartition.go). On a queue of several
--   partitions such a task's group is followed by "\0", the nonce of its
--   claim (16 characters) and the time (ms) after which it may not be
--   stored: code '6' then, or when the nonce is in the fences zset. A
--   task whose ID holds a move's claim ('v', ids.lua) with its nonce
--   takes the claim's place (the task moves into this partition). The
--   flag 'm' marks the store of a move (relocate.lua): once stored, its
--   nonce is marked stored in the fences zset (see ids.lua's fence).
-- Returns a string of one code per task: '0' stored, '1' ID conflict,
-- '2' unique lock held, '3' a broker-chosen ID met another task (the broker
-- draws again), '4' the idempotency key was used within the window, '5' an
-- 'f' task while xf is set: nothing stored, '6' a claim fenced or too old
-- (ids.lua): nothing stored; then, for each '4', a newline and the ID of the key's task. A broker-chosen ID found holding this very record (same body)
-- is this request's own earlier run: '0'. A request run again answers from
-- the reply cache. Publishes "p<partition>" when the pending list was empty
-- and "s<partition>:<ms>" when a new task is due before every waiting one.
-- A pending task without a unique key costs two commands (HSETNX, LPUSH)
-- beyond the layout check and the reply cache. A grouped task gets its
-- enqueue sequence and, when pending, joins its group's ready tasks. A task
-- to replace another one takes the place of a waiting task with its ID
-- (keeping its enqueue sequence and history when it stays in its group; a
-- task that changes group, or gains or loses one, is a new task: its old
-- group lets it go) or of a finished one (as a new task, with
-- a new enqueue sequence: after those enqueued before it); an active one, one
-- a repartition moves, a step of a workflow or batch and a task the broker
-- stored itself (rec_internal) are an ID conflict: no enqueue takes their
-- place. Each task stored is an 'e'
-- event in the events stream (ev_add in lib.lua).
local bad = layout_error(KEYS[6], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[7], ARGV[2], tonumber(ARGV[3]))
if cached then return cached end
local out = {}
local was_empty, first_due, before = false, nil, nil
local looked = false
local now = nil
local hits = {}
local G = g_keys(15)
local E = ev_new(KEYS[22], ARGV[8])
-- unplace takes task id, whose record is rec, out of where it waits or
-- lies finished, for Replace; it returns false when the task is active or
-- being moved.
local function unplace(id, rec)
  if not rec_ok(rec) or rec_moving(rec) or rec_flow(rec) or rec_internal(rec) then return false end
  local st = rec_state(rec)
  if st == 2 then return false end
  if st == 1 then
    local g, seq = g_of(G, id)
    if g then g_unready(G, g, seq, id) else redis.call('LREM', KEYS[2], 1, id) end
  else
    local z = ({[3] = KEYS[3], [4] = KEYS[4], [5] = KEYS[11], [6] = KEYS[12], [7] = KEYS[4]})[st]
    if z then redis.call('ZREM', z, id) end
  end
  if st == 5 or st == 6 then
    redis.call('HDEL', KEYS[13], id, dur_field(id))
    redis.call('HDEL', KEYS[14], id)
    redis.call('HDEL', G.id, id) -- a new task: a new place in its group
  end
  release_uniq(rec, KEYS[5], id)
  return true
end
for i = 9, #ARGV, 8 do
  local id, rec, kind, u, ik, g = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+4], ARGV[i+6], ARGV[i+7]
  local claim = nil
  local z = string.find(g, '\0', 1, true)
  if z then g, claim = string.sub(g, 1, z - 1), string.sub(g, z + 1) end
  local replace = string.find(kind, 'r', 2, true) ~= nil
  local watch = string.find(kind, 'w', 2, true) ~= nil
  local free = string.find(kind, 'f', 2, true) ~= nil
  local move = claim and string.find(kind, 'm', 2, true) ~= nil
  kind = string.sub(kind, 1, 1)
  local code = '0'
  local own = kind == 'P' or kind == 'S'
  local first = nil
  if ik ~= '' then first = redis.call('HGET', KEYS[8], ik) or redis.call('HGET', KEYS[9], ik) end
  if free and redis.call('HEXISTS', G.s, 'xf') == 1 then
    code = '5'
  elseif claim and (redis.call('ZSCORE', KEYS[23], string.sub(claim, 1, 16)) or redis_now() > tonumber(string.sub(claim, 17))) then
    code = '6'
  elseif first then
    code = '4'
    hits[#hits + 1] = first
  elseif redis.call('HSETNX', KEYS[1], id, rec) == 0 then
    code = '1'
    local cur = claim and redis.call('HGET', KEYS[1], id)
    if cur and string.sub(cur, 1, 3) == '\0gv' and string.sub(cur, 4, 19) == string.sub(claim, 1, 16) then
      -- A move's claim (ids.lua) of this very task: the task moves here.
      redis.call('HSET', KEYS[1], id, rec)
      code = 'R'
    elseif own then
      code = own_conflict(redis.call('HGET', KEYS[1], id), rec)
    elseif replace then
      local cur = redis.call('HGET', KEYS[1], id)
      if cur and unplace(id, cur) then
        redis.call('HSET', KEYS[1], id, rec)
        local og = g_of(G, id)
        if (og or '') ~= g then
          -- A task that changes group (or gains one) is a new task: its old
          -- group lets it go, its history goes.
          if g_forget(G, id) then was_empty = true end
          redis.call('HDEL', KEYS[14], id)
        end
        code = 'R'
      end
    end
  else
    code = 'R'
  end
  if code == 'R' then
    code = '0'
    local locked = true
    if u ~= '' then
      if not now then now = redis_now() end
      locked = uniq_take(KEYS[5], u, id, now, now + tonumber(ARGV[i+5]))
    end
    local seq = nil
    if locked and g ~= '' then seq = g_new(G, g, id) end
    if not locked then
      redis.call('HDEL', KEYS[1], id)
      g_forget(G, id)
      code = '2'
    elseif kind == 'p' or kind == 'P' then
      if seq then
        if g_ready(G, g, seq, id) then was_empty = true end
      elseif redis.call('LPUSH', KEYS[2], id) == 1 then
        was_empty = true
      end
    else
      if not looked then
        before, looked = earliest(KEYS[3], KEYS[4]), true
      end
      local due = tonumber(ARGV[i+3])
      redis.call('ZADD', KEYS[3], due, id)
      if not first_due or due < first_due then first_due = due end
    end
    if E and code == '0' then ev_add(E, 'e', id, rec_type(rec)) end
    if code == '0' and watch then redis.call('HSET', KEYS[21], id, ARGV[7]) end
    if code == '0' and ik ~= '' then
      redis.call('HSET', KEYS[8], ik, id)
      redis.call('PEXPIREAT', KEYS[8], tonumber(ARGV[6]))
    end
    if code == '0' and move then
      -- A move's store: its nonce is marked stored ('s' and the nonce in
      -- the fences zset, an hour past the claim's deadline), so that the
      -- repair of a move whose client died finishes the move even when the
      -- task stored here has run and is gone by then (ids.lua's fence).
      redis.call('ZADD', KEYS[23], tonumber(string.sub(claim, 17)) + 3600000, 's' .. string.sub(claim, 1, 16))
      redis.call('ZREMRANGEBYSCORE', KEYS[23], '-inf', redis_now())
    end
  end
  out[#out + 1] = code
end
if was_empty then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
if first_due and (not before or first_due < before) then
  redis.call('PUBLISH', ARGV[4], 's' .. ARGV[5] .. ':' .. string.format('%d', first_due))
end
ev_flush(E)
local reply = table.concat(out)
if #hits > 0 then reply = reply .. '\n' .. table.concat(hits, '\n') end
req_put(KEYS[7], ARGV[2], reply, tonumber(ARGV[3]))
return reply
