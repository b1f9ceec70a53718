-- groups.lua: helpers for grouped tasks (tide.Group), prepended like lib.lua's
-- to the scripts that use them. A group's tasks all live in one partition
-- (the group is their IDs' hash tag), so one script sees the whole group.
-- A script that handles grouped tasks takes six keys of its partition as a
-- block, read by g_keys:
--   q  zset, every score 0: the ready (pending) grouped tasks, one member
--      "<group>\0<seq><id>" each (seq: 8 bytes, the task's enqueue
--      sequence), so a group's tasks sort in enqueue order and one ZRANGEBYLEX
--      finds the group's next task
--   r  zset: the rotation, the groups that have ready tasks and may start
--      one now, scored by when they joined it (s's j); Dequeue serves them
--      in that order from a cursor (s's c, the score served last), wrapping
--      round, so each is served once per round without being moved. A group
--      that may not start a task leaves it: at the start that blocks it (an
--      ordered group's task started, its rate used up), when it has nothing
--      ready, or at the first turn that finds it at its concurrency limit
--      (mostly one of its tasks has settled by then: leaving at the start
--      would cost that settle a join); a task made ready does not bring it
--      back while it is blocked (g_enter), and what lets it go (a settle, a
--      removal, its time in w) puts it back. So Dequeue looks at a blocked
--      group at most once each time it blocks, however many tasks are made
--      ready in it meanwhile. The member '' stands for the ungrouped tasks
--      (the pending list) while there are any.
--   w  zset: groups held back until a time (throttled, or over their rate),
--      scored by that time (ms)
--   s  hash: j: the last join number handed out; c: the cursor; lc: where
--      Maintain's sweep of l stands (an HSCAN cursor); seq: the
--      last enqueue sequence; a:<group> its
--      active tasks (only while a group limit is set, see below), plus g_out() while the group is out of the rotation
--      with tasks running, so that the settle that may let it run again
--      knows to look, or twice g_out() when it left at its concurrency
--      limit, so that no task made ready brings it back before such a settle
--      (a zero is removed: absent is zero; see g_count);
--      h:<group> the task that holds an ordered group's place;
--      t:<group> throttled until (ms); xf: set while a repartition to more
--      partitions starts (enqueue.lua then refuses grouped tasks whose IDs
--      lack their group's tag)
--   id hash: task ID -> "<group>\0<seq>" for every grouped task of the
--      partition, whatever its state; deleted with the task's record
--   l  hash: group -> its start times (6 bytes each, oldest first) within
--      the group rate's window, trimmed as it starts tasks
-- A group limit comes from the partition's limits hash: gc (concurrency),
-- gr and gper (rate), ord ('1' ordered); groups are never split, so these
-- are the queue's values, not shares. Without any of them s holds no a:
-- fields: a group then leaves the rotation only when nothing is ready and
-- a task made ready brings it back, so no count is needed, and the scripts
-- skip them (G.nc, set by g_uncounted); share.lua rebuilds the counts from
-- the active tasks when a group limit is set, and drops them when the last
-- is unset, in the same script that changes the limits.

local function g_keys(i)
  return {q = KEYS[i], r = KEYS[i + 1], w = KEYS[i + 2], s = KEYS[i + 3], id = KEYS[i + 4], l = KEYS[i + 5]}
end

-- g_uncounted marks G as a partition without group limits (gc, gr, ord
-- are the limits hash's fields, nil or false when unset): its groups'
-- active counts are not kept (g_active is 0, g_count does nothing).
local function g_uncounted(G, gc, gr, ord)
  G.nc = not gc and not gr and ord ~= '1'
  return G.nc
end

-- A group's active count (s's a:<group>) is read and written through
-- g_active and g_count. A script that touches many groups calls g_cache
-- first: the counts are then read once per group (g_prefetch reads several
-- with one command) and written once, by g_flush, which the script must call
-- before it returns. Lua's redis.call costs about as much as the command
-- itself, so a batch of tasks pays a few commands, not a few per task. A
-- count that reaches zero is deleted (absent is zero), so that s stays a
-- small hash of the groups with tasks running.
local function g_cache(G)
  if G.nc then return end
  G.a, G.dirty = {}, {}
end

-- g_prefetch reads, with one command, the counts of the groups at
-- positions first, first + step, ... of list gs that the cache does not
-- hold ('' and repeats are skipped).
local function g_prefetch(G, gs, first, step)
  if not G.a then return end
  local want, fields = {}, {}
  for i = first, #gs, step do
    local g = gs[i]
    if g ~= '' and G.a[g] == nil then
      G.a[g] = 0
      want[#want + 1] = g
      fields[#fields + 1] = 'a:' .. g
    end
  end
  for i = 1, #fields, 1000 do
    local vs = redis.call('HMGET', G.s, unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #vs do
      if vs[j] then G.a[want[i + j - 1]] = tonumber(vs[j]) end
    end
  end
end

-- g_active returns group g's active count (with its g_out marks).
local function g_active(G, g)
  if G.nc then return 0 end
  if G.a then
    local v = G.a[g]
    if v == nil then
      v = tonumber(redis.call('HGET', G.s, 'a:' .. g) or '0')
      G.a[g] = v
    end
    return v
  end
  return tonumber(redis.call('HGET', G.s, 'a:' .. g) or '0')
end

-- g_count adds d to group g's active count and returns the new count; a
-- count of zero is deleted.
local function g_count(G, g, d)
  if G.nc then return 0 end
  if G.a then
    local v = g_active(G, g) + d
    G.a[g] = v
    G.dirty[g] = true
    return v
  end
  local v = redis.call('HINCRBY', G.s, 'a:' .. g, string.format('%d', d))
  if v == 0 then redis.call('HDEL', G.s, 'a:' .. g) end
  return v
end

-- g_flush writes the counts that g_count changed since the cache was made
-- or last flushed: one HSET and one HDEL at most.
local function g_flush(G)
  if not (G and G.a) then return end
  local set, del = {}, {}
  for g in pairs(G.dirty) do
    local v = G.a[g]
    if v == 0 then
      del[#del + 1] = 'a:' .. g
    else
      set[#set + 1] = 'a:' .. g
      set[#set + 1] = string.format('%d', v)
    end
  end
  for i = 1, #set, 1000 do redis.call('HSET', G.s, unpack(set, i, math.min(i + 999, #set))) end
  for i = 1, #del, 1000 do redis.call('HDEL', G.s, unpack(del, i, math.min(i + 999, #del))) end
  G.dirty = {}
end

-- g_of returns the group and enqueue sequence of task id, or nil when the
-- task has no group.
local function g_of(G, id)
  local v = redis.call('HGET', G.id, id)
  if not v then return nil end
  local sep = string.find(v, '\0', 1, true)
  return string.sub(v, 1, sep - 1), string.sub(v, sep + 1)
end

-- g_new records a new grouped task and returns its enqueue sequence; a
-- task that already has one (Replace) keeps it, and with it its place.
local function g_new(G, g, id)
  local old, seq = g_of(G, id)
  if old ~= g then
    seq = struct.pack('>I8', redis.call('HINCRBY', G.s, 'seq', 1))
    redis.call('HSET', G.id, id, g .. '\0' .. seq)
  end
  return seq
end

-- g_join puts group g at the end of the rotation unless it is in it, and
-- reports whether it joined.
local function g_join(G, g)
  return redis.call('ZADD', G.r, 'NX', redis.call('HINCRBY', G.s, 'j', 1), g) == 1
end

-- g_out is the mark added to a group's active count (a:<group>) while the
-- group is out of the rotation with tasks running: 2^40, far above any count
-- (twice it while the group is at its concurrency limit).
local function g_out() return 1099511627776 end

-- g_held reports whether an ordered group's place is held by a task other
-- than id (nil: any task) that is not ready (it runs, or waits for its
-- retry): no other task of the group may start.
local function g_held(G, g, id)
  local h = redis.call('HGET', G.s, 'h:' .. g)
  if not h or h == id then return false end
  local _, hseq = g_of(G, h)
  return not (hseq and redis.call('ZSCORE', G.q, g .. '\0' .. hseq .. h))
end

-- g_enter puts group g, which has ready tasks, in the rotation unless it is
-- in it, held back until a time, at its concurrency limit (marked so, see
-- s) or held by its ordered place (g_held; id is the task just made ready,
-- or nil). It reports whether the group joined.
local function g_enter(G, g, id)
  if redis.call('ZSCORE', G.r, g) or redis.call('ZSCORE', G.w, g) then return false end
  if g_active(G, g) >= 2 * g_out() or g_held(G, g, id) then return false end
  return g_join(G, g)
end

-- g_ready makes grouped task id ready to start: it joins its group's tasks
-- in enqueue order, and the group joins the rotation when it may start it
-- (g_enter). It reports whether the group joined the rotation (then idle
-- servers are to be woken).
local function g_ready(G, g, seq, id)
  redis.call('ZADD', G.q, 0, g .. '\0' .. seq .. id)
  return g_enter(G, g, id)
end

-- g_unready takes a ready grouped task out of its group's tasks (deleted,
-- replaced, moved).
local function g_unready(G, g, seq, id)
  redis.call('ZREM', G.q, g .. '\0' .. seq .. id)
end

-- g_next returns up to n of group g's ready tasks (members of q), first in
-- line first.
local function g_next(G, g, n)
  return redis.call('ZRANGEBYLEX', G.q, '[' .. g .. '\0', '(' .. g .. '\1', 'LIMIT', '0', string.format('%d', n))
end

-- g_release is called when task id of group g stops holding its group:
-- leaving active (left: settled or recovered) and/or finishing (finished:
-- done, archived or deleted, which frees an ordered group's place; ordered
-- false says the queue's groups are not ordered, so none holds one). A
-- group that was out of the rotation (marked, or a place freed, or a call
-- that is not a settle) goes back in when it has ready tasks and may start
-- one (not held back until a time, not at its concurrency limit unless a
-- task just left, not held by its ordered place); it reports whether it
-- went back (then idle servers are to be woken). A settle of a group in
-- the rotation costs one command.
local function g_release(G, g, id, left, finished, ordered)
  local OUT, v = g_out(), nil
  if left then v = g_count(G, g, -1) end
  local freed = false
  if finished and ordered ~= false and redis.call('HGET', G.s, 'h:' .. g) == id then
    redis.call('HDEL', G.s, 'h:' .. g)
    freed = true
  end
  if left and v < OUT and not freed then return false end
  if not left then v = g_active(G, g) end
  local mark = math.floor(v / OUT)
  local active = v - mark * OUT
  local back = false
  if redis.call('ZSCORE', G.r, g) then
    back = nil -- in the rotation already
  elseif g_next(G, g, 1)[1] and not redis.call('ZSCORE', G.w, g) and (left or mark < 2) and not g_held(G, g, nil) then
    back = g_join(G, g)
  end
  if mark > 0 then
    if active <= 0 then
      g_count(G, g, -v) -- deleted
    elseif back ~= false then
      g_count(G, g, -mark * OUT) -- in the rotation again
    elseif mark >= 2 and left then
      g_count(G, g, -OUT) -- below its limit, still out
    end
  end
  return back == true
end

-- g_waiting reports whether grouped tasks may wait for a free slot: a group
-- is in the rotation, or one held back until a time that now (ms; nil: the
-- Redis clock, read only when needed) has reached (the next Dequeue puts it
-- back). G is nil when the partition has no grouped task.
local function g_waiting(G, now)
  if not G then return false end
  if redis.call('ZCARD', G.r) > 0 then return true end
  if not now then
    local t = redis.call('TIME') -- lib.lua's redis_now, which comes after this file
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return redis.call('ZRANGEBYSCORE', G.w, '-inf', now, 'LIMIT', 0, 1)[1] ~= nil
end

-- g_forget deletes what the partition keeps of a grouped task whose record
-- is deleted; an ordered group's place it held is freed. It reports whether
-- the group went back in the rotation (then idle servers are to be woken).
local function g_forget(G, id)
  local g = g_of(G, id)
  if not g then return false end
  redis.call('HDEL', G.id, id)
  return g_release(G, g, id, false, true)
end

-- g_throttle holds group g back until at (ms): no task of it starts before.
local function g_throttle(G, g, at)
  local cur = tonumber(redis.call('HGET', G.s, 't:' .. g) or '0')
  if at <= cur then return end
  redis.call('HSET', G.s, 't:' .. g, string.format('%d', at))
  redis.call('ZREM', G.r, g)
  redis.call('ZADD', G.w, at, g)
end

-- g_rate returns group g's start log trimmed to the window that ends at now
-- and how many starts it holds.
local function g_rate(G, g, per, now)
  local log = redis.call('HGET', G.l, g)
  if not log then return '', 0 end
  local i = 1
  while i + 5 <= #log and struct.unpack('>I6', log, i) <= now - per do i = i + 6 end
  log = string.sub(log, i)
  return log, #log / 6
end
-- announce_held announces, once, the first time a held group of G may run
-- again: "p<partition>:<ms>" published on channel, the time kept in the
-- partition's meta hash (field gw) so that it is announced once; servers
-- look again then. A later one is announced by the first lease call or
-- throttling settle after that one has passed.
local function announce_held(G, meta, channel, partition)
  local held = redis.call('ZRANGE', G.w, 0, 0, 'WITHSCORES')[2]
  if held then
    local at = string.format('%d', tonumber(held))
    if redis.call('HGET', meta, 'gw') ~= at then
      redis.call('HSET', meta, 'gw', at)
      redis.call('PUBLISH', channel, 'p' .. partition .. ':' .. at)
    end
  end
end
