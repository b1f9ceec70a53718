-- move.lua: the steps of a repartition, which moves every task that is not
-- active from a partition of the old span (O) to its partition of the new
-- span (N) without losing or doubling one, whatever step a crash stops at:
--   peek (O)     list up to ARGV[3] tasks that are not active, with their
--                records and unique-lock values (nothing changes)
--   reserve (N)  write a placeholder under each ID (lookups then look in O,
--                an Enqueue of the ID is a conflict), remember it in the
--                reserved set; copy each unique lock (same holder, same expiry)
--   take (O)     take each task out of its structure, flag its record as
--                moving and remember it in the moving set; returns record,
--                score (due, archive or expiry time) and result
--   place (N)    replace each placeholder with the record and put the task in
--                its structure with its score; a missing placeholder means
--                the task was deleted meanwhile: nothing is placed
--   finish (O)   delete the moved records (and results) from O
--   unreserve (N) drop placeholders (a task that turned active or vanished;
--                never one that another run took: it places it); without
--                IDs, once every old partition is retired: all of them,
--                and reserve and lock refuse from then on
--   mark (O)     turn O's meta from the old layout to "<old>><new>"
--   retire (O)   when O holds nothing at all, no slot or rate token of its
--                queue's limits and no transfer of them either (a rebalance
--                may give it some until then: see releaseSlots), mark it
--                retired (every later call on it is refused) and delete
--                its keys (reply caches expire on their own)
-- KEYS (every op): 1 records hash  2 pending list  3 scheduled zset
--   4 retry zset  5 archived zset  6 completed zset  7 results hash
--   8 active zset  9 unique locks hash  10 moving zset (ID -> score before
--   the move)  11 reserved set  12 layout meta  13 stats hash
--   14 token sequence  15 owner  16 paused flag  17 attempt histories hash
--   18 minute counters hash  19..24 group keys (groups.lua)
--   25 progress hash  26..28 waiter keys (w_keys in lib.lua)
-- KEYS (retire): 1..28 the keys of every op  29 limits hash (slots.lua)
-- ARGV[1] layout (the caller's view of the partition's meta)  ARGV[2] op
-- ARGV[3..] the op's arguments (below)
--   groups (O)   after O holds nothing: a page of its groups' rate windows
--                and throttles, for adopt
--   adopt (N)    take over those windows and throttles (see below)
-- A grouped task moves with its group (take returns it; an ordered group's
-- place moves with the task that holds it) and keeps its enqueue sequence,
-- so its group's order is the order of enqueue, not of the move. A new
-- span's sequences start above every older span's (the repartition sets its
-- partitions' counters to epoch * 2^40 before any task can reach them), so
-- a task enqueued in N while the move runs comes after every moved one.
-- Grouped tasks start nowhere while a repartition runs (field gh of the
-- limits hash), so a group's rate window and throttle in O stop changing
-- once O has no task running; adopt copies them to N before the hold ends.
local bad = layout_error(KEYS[12], ARGV[1])
if bad then return bad end
local op = ARGV[2]
local PH = '\0mv'
local OVER = '\0over' -- in the reserved set: the repartition into this span is over
local G = g_keys(19)

-- group_field is what take tells of task id's group: '' for none, else
-- "<group>\0<seq><h>": the group, the task's enqueue sequence (8 bytes) and
-- 'h' when the task holds its ordered group's place, '-' when not.
local function group_field(id)
  local g, seq = g_of(G, id)
  if not g then return '' end
  if redis.call('HGET', G.s, 'h:' .. g) == id then return g .. '\0' .. seq .. 'h' end
  return g .. '\0' .. seq .. '-'
end

if op == 'peek' or op == 'peekids' then
  -- peek: ARGV[3] limit; peekids: ARGV[3..] the tasks to look at (a task
  -- moved ahead of the others: Replace). Returns a flat array: id, record,
  -- lock value ('' none).
  local limit = tonumber(ARGV[3])
  local out, n = {}, 0
  local function add(id)
    local rec = redis.call('HGET', KEYS[1], id)
    if rec and not (rec_ok(rec) and rec_moving(rec)) then
      local lock = ''
      if rec_ok(rec) then
        local u = rec_uniq(rec)
        if u then lock = redis.call('HGET', KEYS[9], u) or '' end
      end
      out[#out + 1] = id
      out[#out + 1] = rec
      out[#out + 1] = lock
      n = n + 1
    end
  end
  if op == 'peekids' then
    for i = 3, #ARGV do add(ARGV[i]) end
    return out
  end
  for _, z in ipairs({KEYS[5], KEYS[6], KEYS[3], KEYS[4]}) do
    if n >= limit then break end
    for _, id in ipairs(redis.call('ZRANGE', z, 0, limit - n - 1)) do add(id) end
  end
  if n < limit then
    for _, id in ipairs(redis.call('LRANGE', KEYS[2], -(limit - n), -1)) do add(id) end
  end
  if n < limit then
    for _, m in ipairs(redis.call('ZRANGE', G.q, 0, limit - n - 1)) do
      local sep = string.find(m, '\0', 1, true)
      add(string.sub(m, sep + 9))
    end
  end
  return out
end

if op == 'reserve' then
  -- ARGV: then triples id, unique key ('' none), lock value ('' none).
  -- Returns one code per task: '1' reserved, '0' another task has the ID,
  -- '2' the repartition into this span is over (see unreserve): nothing
  -- is written.
  local out = {}
  if redis.call('SISMEMBER', KEYS[11], OVER) == 1 then
    return string.rep('2', (#ARGV - 2) / 3)
  end
  for i = 3, #ARGV, 3 do
    local id, u, lock = ARGV[i], ARGV[i+1], ARGV[i+2]
    local cur = redis.call('HGET', KEYS[1], id)
    if cur and cur ~= PH then
      out[#out + 1] = '0'
    else
      redis.call('HSET', KEYS[1], id, PH)
      redis.call('SADD', KEYS[11], id)
      out[#out + 1] = '1'
    end
    if u ~= '' and lock ~= '' then redis.call('HSETNX', KEYS[9], u, lock) end
  end
  return table.concat(out)
end

if op == 'lock' then
  -- ARGV: then pairs unique key, lock value: copy locks whose partition
  -- in the new span is not their task's. Returns 1, or 0 when the
  -- repartition into this span is over (nothing is copied).
  if redis.call('SISMEMBER', KEYS[11], OVER) == 1 then return 0 end
  for i = 3, #ARGV, 2 do redis.call('HSETNX', KEYS[9], ARGV[i], ARGV[i+1]) end
  return 1
end

if op == 'take' then
  -- ARGV: then ids. Returns a flat array per task: id, status ('ok',
  -- 'busy' active now, 'moving' taken by another run, 'gone'), record,
  -- state, score, result (or ''), attempt history (or ''), group
  -- (group_field), durable records (or '').
  local out = {}
  for i = 3, #ARGV do
    local id = ARGV[i]
    local rec = redis.call('HGET', KEYS[1], id)
    if not rec then
      for _, v in ipairs({id, 'gone', '', 0, 0, '', '', '', ''}) do out[#out + 1] = v end
    elseif rec_ok(rec) and rec_moving(rec) then
      for _, v in ipairs({id, 'moving', '', 0, 0, '', '', '', ''}) do out[#out + 1] = v end
    elseif rec_ok(rec) and rec_state(rec) == 2 then
      for _, v in ipairs({id, 'busy', '', 0, 0, '', '', '', ''}) do out[#out + 1] = v end
    else
      local st, score = 5, redis_now()
      if rec_ok(rec) then st = rec_state(rec) end
      local g, seq = g_of(G, id)
      if st == 1 then
        if g then g_unready(G, g, seq, id) else redis.call('LREM', KEYS[2], 1, id) end
      else
        local z = zset_of(st, KEYS)
        local sc = redis.call('ZSCORE', z, id)
        if sc then score = tonumber(sc) end
        redis.call('ZREM', z, id)
      end
      if rec_ok(rec) then
        release_uniq(rec, KEYS[9], id)
        rec = string.sub(rec, 1, 1) .. string.char(string.byte(rec, 2) % 64 + 64 + (rec_canceled(rec) and 128 or 0)) .. string.sub(rec, 3)
      end
      redis.call('HSET', KEYS[1], id, rec)
      redis.call('ZADD', KEYS[10], score, id)
      local res = redis.call('HGET', KEYS[7], id) or ''
      local h = redis.call('HGET', KEYS[17], id) or ''
      local dr = redis.call('HGET', KEYS[7], dur_field(id)) or ''
      for _, v in ipairs({id, 'ok', rec, st, score, res, h, group_field(id), dr}) do out[#out + 1] = v end
    end
  end
  return out
end

if op == 'moving' then
  -- ARGV[3] limit: the tasks a crashed repartition left flagged as moving,
  -- as take returns them; or, with ids after the limit, those of them that
  -- are flagged as moving (taken by a run that may yet place them).
  local out = {}
  local ids
  if #ARGV > 3 then
    ids = {}
    for i = 4, #ARGV do
      local sc = redis.call('ZSCORE', KEYS[10], ARGV[i])
      if sc then
        ids[#ids + 1] = ARGV[i]
        ids[#ids + 1] = sc
      end
    end
  else
    ids = redis.call('ZRANGE', KEYS[10], 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
  end
  for i = 1, #ids, 2 do
    local id = ids[i]
    local rec = redis.call('HGET', KEYS[1], id)
    if rec then
      local st = 5
      if rec_ok(rec) then st = rec_state(rec) end
      for _, v in ipairs({id, 'ok', rec, st, tonumber(ids[i+1]), redis.call('HGET', KEYS[7], id) or '', redis.call('HGET', KEYS[17], id) or '', group_field(id), redis.call('HGET', KEYS[7], dur_field(id)) or ''}) do out[#out + 1] = v end
    else
      redis.call('ZREM', KEYS[10], id)
    end
  end
  return out
end

if op == 'place' then
  -- ARGV[3] event channel  ARGV[4] partition index, then per task 8:
  -- id, record, state, score, result ('' none), attempt history ('' none),
  -- group (as take returns it), durable records ('' none).
  -- Returns one code per task: '1' placed, '0' not (deleted meanwhile, or
  -- placed before).
  local out = {}
  local was_empty = redis.call('LLEN', KEYS[2]) == 0
  local before = earliest(KEYS[3], KEYS[4])
  local first_due
  local woke = false
  for i = 5, #ARGV, 8 do
    local id, rec, st, score, res, h, g, dr = ARGV[i], ARGV[i+1], tonumber(ARGV[i+2]), tonumber(ARGV[i+3]), ARGV[i+4], ARGV[i+5], ARGV[i+6], ARGV[i+7]
    local seq, holds = nil, false
    if g ~= '' then
      local sep = string.find(g, '\0', 1, true)
      seq, holds = string.sub(g, sep + 1, sep + 8), string.sub(g, sep + 9) == 'h'
      g = string.sub(g, 1, sep - 1)
    end
    if redis.call('HGET', KEYS[1], id) == PH then
      if rec_ok(rec) then -- no longer moving; a cancel flag only matters while active
        rec = string.sub(rec, 1, 1) .. string.char(string.byte(rec, 2) % 64) .. string.sub(rec, 3)
      end
      redis.call('HSET', KEYS[1], id, rec)
      if seq then
        redis.call('HSET', G.id, id, g .. '\0' .. seq)
        if holds then redis.call('HSET', G.s, 'h:' .. g, id) end
      end
      if st == 1 and seq then
        g_ready(G, g, seq, id)
        woke = true
      elseif st == 1 then
        redis.call('RPUSH', KEYS[2], id)
      else
        redis.call('ZADD', zset_of(st, KEYS), score, id)
        if (st == 3 or st == 4 or st == 7) and (not first_due or score < first_due) then first_due = score end
      end
      if res ~= '' then redis.call('HSET', KEYS[7], id, res) end
      if h ~= '' then redis.call('HSET', KEYS[17], id, h) end
      if dr ~= '' then redis.call('HSET', KEYS[7], dur_field(id), dr) end
      out[#out + 1] = '1'
    else
      out[#out + 1] = '0'
    end
    redis.call('SREM', KEYS[11], id)
  end
  if woke or was_empty and redis.call('LLEN', KEYS[2]) > 0 then
    redis.call('PUBLISH', ARGV[3], 'p' .. ARGV[4])
  end
  if first_due and (not before or first_due < before) then
    redis.call('PUBLISH', ARGV[3], 's' .. ARGV[4] .. ':' .. string.format('%d', first_due))
  end
  return table.concat(out)
end

if op == 'finish' then
  -- ARGV: then ids.
  for i = 3, #ARGV do
    local id = ARGV[i]
    local rec = redis.call('HGET', KEYS[1], id)
    if rec and rec_ok(rec) and rec_moving(rec) or rec and not rec_ok(rec) then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[7], id, dur_field(id))
      redis.call('HDEL', KEYS[17], id)
      local g = g_of(G, id)
      if g then
        -- The task (and an ordered place it held) went to N.
        redis.call('HDEL', G.id, id)
        if redis.call('HGET', G.s, 'h:' .. g) == id then redis.call('HDEL', G.s, 'h:' .. g) end
      end
    end
    redis.call('ZREM', KEYS[10], id)
  end
  return 1
end

if op == 'unreserve' then
  -- ARGV: then ids; none: the repartition is over (every old partition
  -- is retired, so no task is left to move): drop every reserved ID still
  -- a placeholder and mark the span's partition so that reserve and lock
  -- write nothing from now on. A step that read the old span before it was
  -- retired and reaches this span only now would otherwise leave a
  -- placeholder that nothing drops, holding the ID for good. A new span's
  -- keys belong to one repartition only, so the mark stays.
  local ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
  local over = #ids == 0
  if over then ids = redis.call('SMEMBERS', KEYS[11]) end
  local n = 0
  for _, id in ipairs(ids) do
    if id ~= OVER then
      if redis.call('HGET', KEYS[1], id) == PH then redis.call('HDEL', KEYS[1], id) end
      redis.call('SREM', KEYS[11], id)
      n = n + 1
    end
  end
  if over then redis.call('SADD', KEYS[11], OVER) end
  return n
end

if op == 'retire' then
  -- Returns {1, 0} retired, {0, n} not empty yet (n: the count of what is
  -- left), {0, -1} it holds slots or tokens of the queue's limits, or a
  -- transfer of them: a rebalance that read it before its starts were
  -- dropped gave it some after the release's last look. Checked here, in
  -- the step that retires it, or they would be lost with it (a transfer
  -- that reaches it once retired goes to the bank instead: slots.go).
  local lim = redis.call('HMGET', KEYS[29], 'c', 'r', 'xo')
  if tonumber(lim[1] or '0') > 0 or tonumber(lim[2] or '0') > 0 or lim[3] then return {0, -1} end
  local left = redis.call('HLEN', KEYS[1]) + redis.call('ZCARD', KEYS[10])
  if left > 0 then return {0, left} end
  redis.call('SET', KEYS[12], 'retired')
  for k = 2, 11 do redis.call('DEL', KEYS[k]) end
  for k = 13, 28 do redis.call('DEL', KEYS[k]) end
  return {1, 0}
end

if op == 'groups' then
  -- ARGV[3] cursor ('0' to start). Returns the next cursor ('0': done),
  -- then per group: group, rate window (G.l's start times, '' for none),
  -- throttled until (ms, '' for none). The first page also lists every
  -- throttled group.
  local r = redis.call('HSCAN', G.l, ARGV[3], 'COUNT', 200)
  local out = {r[1]}
  for j = 1, #r[2], 2 do
    local g = r[2][j]
    for _, v in ipairs({g, r[2][j + 1], redis.call('HGET', G.s, 't:' .. g) or ''}) do out[#out + 1] = v end
  end
  if ARGV[3] == '0' then
    for _, g in ipairs(redis.call('ZRANGE', G.w, 0, -1)) do
      local t = redis.call('HGET', G.s, 't:' .. g)
      if t then
        for _, v in ipairs({g, '', t}) do out[#out + 1] = v end
      end
    end
  end
  return out
end

if op == 'adopt' then
  -- ARGV: then triples as groups returns them, for groups of this
  -- partition: each rate window replaces the group's (no grouped task
  -- starts here while the repartition runs, so it has none of its own) and
  -- each throttle still running holds the group back here too.
  local now = redis_now()
  for i = 3, #ARGV, 3 do
    local g, log, t = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    if log ~= '' then redis.call('HSET', G.l, g, log) end
    if t and t > now then g_throttle(G, g, t) end
  end
  return 1
end

if op == 'mark' then
  -- ARGV[3] the meta the partition takes, when it still says ARGV[1] (the
  -- layout check above): an old partition of a repartition that starts.
  redis.call('SET', KEYS[12], ARGV[3])
  return 1
end

if op == 'stats' then
  -- ARGV[3] marker, then pairs field, count: add an old partition's day
  -- counters to this one's, once (the marker records it).
  if redis.call('HSETNX', KEYS[13], ARGV[3], '1') == 1 then
    for i = 4, #ARGV, 2 do
      if string.sub(ARGV[i], 1, 2) == 'p:' or string.sub(ARGV[i], 1, 2) == 'f:' then
        redis.call('HINCRBY', KEYS[13], ARGV[i], tonumber(ARGV[i+1]) or 0)
      end
    end
  end
  return 1
end

return redis.error_reply('ERR move.lua: unknown op ' .. tostring(op))
