-- flow.lua: the bookkeeping of one workflow or batch (broker.Flows).
-- KEYS[1] flow hash  KEYS[2] failed task IDs (list)  KEYS[3] step names (list)
-- ARGV[1] op, then by op:
--   'c' create:  kind, digest, created ms, retention ms, callback step,
--                total, callback task ID
--                -> 'new', 'ok' (same digest: resumes) or 'exists'
--   'a' append:  digest, then 5 per step: name, run-on-failure ('1' or ''),
--                number of dependencies, spec, task record ('' for a step
--                without dependencies) -> 'ok' or 'exists'
--   'g' go:      digest -> the ready steps (see below), or 'exists'
--   'e' end:     step, task ID, '1' succeeded or '0' failed, reason, now ms
--                -> the ready steps, or 'x' (no such step or task); a step
--                cancelled while ready (k:<n>) whose task succeeded is
--                recorded succeeded
--   'l' release: step names -> the names among them that were cancelled
--   'r' ready:   now ms -> the ready steps (as 'g' returns them, for a
--                repair: the creator died before confirming); a flow still
--                preparing (its steps were not all stored) is cancelled
--                and ended instead, -> none; 'x' when no flow
--   'x' cancel:  now ms -> the steps whose tasks may live, each name and
--                spec: enqueued ones, and ready ones whose release was not
--                confirmed (cancelled, marked k:<n> until their task ends);
--                the same again on every call while the flow stays
--                cancelled (a lost reply, a caller that retries); 'x' when
--                no flow
-- A spec is "<queue>\n<task ID>\n<after, comma-separated>\n<dependents>".
-- Ready steps come back as a flat list: name, spec, record ('' for a step
-- without dependencies), for every step that may start and is not released.
-- The hash holds the flow's fields (_k kind, _d digest, _n steps, _s state:
-- P preparing, R running, S succeeded, F failed, X cancelled; _c created,
-- _e ended, _ok/_bad/_x counts, _ret retention, _cb a batch's callback step,
-- _cbi its task ID and _cbs its final state: the counts leave it out) and per step
-- s:<n> state (w waiting, r ready, e enqueued, S succeeded, F failed, C
-- cancelled), r:<n> dependencies left, p:<n> run on failure, d:<n> spec,
-- t:<n> record until released, e:<n> why it failed or was cancelled, k:<n>
-- a cancelled step whose task may live (see 'x').
-- Every op is safe to run twice: state decides, never a counter alone.

local H = KEYS[1]

local function split(s, sep)
  local out = {}
  if not s or s == '' then return out end
  local i = 1
  while true do
    local j = string.find(s, sep, i, true)
    if not j then
      out[#out + 1] = string.sub(s, i)
      return out
    end
    out[#out + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
end

local function spec(n) return split(redis.call('HGET', H, 'd:' .. n) or '', '\n') end
local function dependents(n) return split(spec(n)[4], ',') end

-- collect lists the ready steps that n's end made (or makes) startable:
-- its ready dependents, and through cancelled dependents theirs.
local function collect(n)
  local out, seen, stack = {}, {}, {n}
  if redis.call('HGET', H, '_s') == 'X' then return out end
  while #stack > 0 do
    local x = table.remove(stack)
    for _, d in ipairs(dependents(x)) do
      if not seen[d] then
        seen[d] = true
        local st = redis.call('HGET', H, 's:' .. d)
        if st == 'r' then
          out[#out + 1] = d
          out[#out + 1] = redis.call('HGET', H, 'd:' .. d) or ''
          out[#out + 1] = redis.call('HGET', H, 't:' .. d) or ''
        elseif st == 'C' then
          stack[#stack + 1] = d
        end
      end
    end
  end
  return out
end

-- ready_all lists every ready step that is not released, as collect does.
local function ready_all()
  local out = {}
  for _, n in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    if redis.call('HGET', H, 's:' .. n) == 'r' then
      out[#out + 1] = n
      out[#out + 1] = redis.call('HGET', H, 'd:' .. n) or ''
      out[#out + 1] = redis.call('HGET', H, 't:' .. n) or ''
    end
  end
  return out
end

-- tally sets step n's final state and counts it: in _ok, _bad or _x, or
-- for a batch's callback in _cbs (a batch's counts are of its tasks).
local function tally(n, st, field, reason)
  redis.call('HSET', H, 's:' .. n, st)
  if reason then redis.call('HSET', H, 'e:' .. n, reason) end
  redis.call('HDEL', H, 't:' .. n)
  if n == redis.call('HGET', H, '_cb') then
    redis.call('HSET', H, '_cbs', st)
    return false
  end
  redis.call('HINCRBY', H, field, 1)
  return true
end

-- ended records the flow's end once every step has finished.
local function ended(now)
  local m = redis.call('HMGET', H, '_n', '_ok', '_bad', '_x', '_s', '_ret', '_cbs')
  local n, ok, bad, x = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), tonumber(m[4])
  if m[7] then n = n - 1 end
  if ok + bad + x < n or redis.call('HEXISTS', H, '_e') == 1 then return end
  if m[5] == 'R' or m[5] == 'P' then
    local good = bad + x == 0 and m[7] ~= 'F' and m[7] ~= 'C'
    redis.call('HSET', H, '_s', good and 'S' or 'F')
  end
  redis.call('HSET', H, '_e', now)
  local ret = tonumber(m[6])
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ret) end
end

local op = ARGV[1]

if op == 'c' then
  local d = redis.call('HGET', H, '_d')
  if d then return d == ARGV[3] and 'ok' or 'exists' end
  redis.call('HSET', H, '_k', ARGV[2], '_d', ARGV[3], '_c', ARGV[4], '_ret', ARGV[5], '_cb', ARGV[6],
    '_n', ARGV[7], '_cbi', ARGV[8], '_s', 'P', '_ok', 0, '_bad', 0, '_x', 0)
  return 'new'
end

if op == 'a' or op == 'g' then
  if redis.call('HGET', H, '_d') ~= ARGV[2] then return 'exists' end
  local st = redis.call('HGET', H, '_s')
  if op == 'a' then
    if st ~= 'P' then return 'ok' end
    for i = 3, #ARGV, 5 do
      local n = ARGV[i]
      if redis.call('HEXISTS', H, 's:' .. n) == 0 then redis.call('RPUSH', KEYS[3], n) end
      local deps = tonumber(ARGV[i + 2])
      redis.call('HSET', H, 's:' .. n, deps == 0 and 'r' or 'w', 'r:' .. n, deps, 'd:' .. n, ARGV[i + 3])
      if ARGV[i + 1] == '1' then redis.call('HSET', H, 'p:' .. n, '1') end
      if ARGV[i + 4] ~= '' then redis.call('HSET', H, 't:' .. n, ARGV[i + 4]) end
    end
    return 'ok'
  end
  if st == 'P' then redis.call('HSET', H, '_s', 'R') end
  if st == 'X' then return {} end
  return ready_all()
end

if op == 'e' then
  local n, ok, reason, now = ARGV[2], ARGV[4] == '1', ARGV[5], ARGV[6]
  local st = redis.call('HGET', H, 's:' .. n)
  if not st then return 'x' end
  local sp = spec(n)
  if sp[2] ~= ARGV[3] then return 'x' end
  -- Its task ended: cancel finds nothing to stop.
  local live = redis.call('HDEL', H, 'k:' .. n) == 1
  if st == 'C' and live and ok then
    -- Cancelled while ready, its release unconfirmed, and its task (the
    -- release had stored it) succeeded before the cancel reached it: the
    -- step keeps its task's outcome, as an enqueued step does.
    if n ~= redis.call('HGET', H, '_cb') then redis.call('HINCRBY', H, '_x', -1) end
    redis.call('HDEL', H, 'e:' .. n)
    tally(n, 'S', '_ok', nil)
  end
  if st == 'r' or st == 'e' then
    local canceled = redis.call('HGET', H, '_s') == 'X'
    if ok then
      tally(n, 'S', '_ok', nil)
    elseif canceled then
      tally(n, 'C', '_x', reason)
    elseif tally(n, 'F', '_bad', reason) then
      redis.call('RPUSH', KEYS[2], sp[2])
    end
    -- Release or cancel the dependents, and theirs when cancelled.
    local work = {{n, ok}}
    while #work > 0 do
      local w = table.remove(work)
      for _, d in ipairs(dependents(w[1])) do
        if redis.call('HGET', H, 's:' .. d) == 'w' then
          if not w[2] and redis.call('HEXISTS', H, 'p:' .. d) == 0 then
            tally(d, 'C', '_x', 'tide: not run: step ' .. w[1] .. ' did not succeed')
            work[#work + 1] = {d, false}
          elseif redis.call('HINCRBY', H, 'r:' .. d, -1) <= 0 then
            redis.call('HSET', H, 's:' .. d, 'r')
          end
        end
      end
    end
    ended(now)
  end
  return collect(n)
end

if op == 'l' then
  local out = {}
  for i = 2, #ARGV do
    local n = ARGV[i]
    local st = redis.call('HGET', H, 's:' .. n)
    if st == 'r' then
      redis.call('HSET', H, 's:' .. n, 'e')
      redis.call('HDEL', H, 't:' .. n)
    elseif st == 'C' then
      out[#out + 1] = n
    end
  end
  return out
end

if op == 'x' then
  local st = redis.call('HGET', H, '_s')
  if not st then return 'x' end
  local out = {}
  if st == 'S' or st == 'F' then return out end
  local first = st ~= 'X'
  redis.call('HSET', H, '_s', 'X')
  for _, n in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    local s = redis.call('HGET', H, 's:' .. n)
    if first and s == 'r' then
      -- Its task may have been stored by a release that never confirmed.
      redis.call('HSET', H, 'k:' .. n, '1')
    end
    if first and (s == 'w' or s == 'r') then
      tally(n, 'C', '_x', 'tide: workflow cancelled')
      s = 'C'
    end
    if s == 'e' or (s == 'C' and redis.call('HEXISTS', H, 'k:' .. n) == 1) then
      out[#out + 1] = n
      out[#out + 1] = redis.call('HGET', H, 'd:' .. n) or ''
    end
  end
  ended(ARGV[2])
  return out
end

if op == 'r' then
  local st = redis.call('HGET', H, '_s')
  if not st then return 'x' end
  local out = {}
  if st == 'P' then
    redis.call('HSET', H, '_s', 'X', '_n', redis.call('LLEN', KEYS[3]))
    for _, n in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
      local s = redis.call('HGET', H, 's:' .. n)
      if s == 'w' or s == 'r' then tally(n, 'C', '_x', "tide: the workflow's creation did not finish") end
    end
    ended(ARGV[2])
    return out
  end
  if st == 'X' then return out end
  return ready_all()
end

return redis.error_reply('ERR tide: flow.lua: unknown op ' .. tostring(op))
