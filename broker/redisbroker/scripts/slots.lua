-- slots.lua: the slots of a queue's limits held by one node: a partition
-- (its limits hash) or the queue's bank (free slots, in the slot of the
-- limits record). The design and its argument are in the package
-- documentation ("Limits"); in short: a node holds c concurrency slots and r
-- rate tokens, and slots move between nodes only by transfers, each made of
-- three steps of one node each, so that no script sees two partitions:
--   give (source)  take the slots off the source and write the transfer as
--                  its outstanding record xo ("<seq>|<ce>|<re>|<dest>,<dc>,
--                  <dr>,<ages>|..."), numbered by the source's counter xs; a
--                  source with an outstanding record gives nothing more
--   apply (dest)   add a record's part to the destination once: the
--                  destination keeps, per source, the number of the last
--                  record it applied (xi:<source>) and applies only a later
--                  one
--   clear (source) drop the outstanding record once every destination has
--                  applied it
-- A record's parts count only on a node of the same era (ce, re: the limit's
-- version when it was last switched on; '0' for slots that predate eras).
-- KEYS (partition) 1 limits hash  2 starts zset (token -> start ms)
--   3 active zset  4 pending list  5 layout meta  6 scheduled zset
--   7 retry zset  8 ready grouped tasks (gq)  9 group rotation (gr)
--   10 held-back groups zset (gw: held until a time)
--   11 forgotten starts zset (token -> start ms: starts forgotten by the
--      forget op, still counted against tokens a raised limit adds)
-- KEYS (bank) 1 bank hash
-- ARGV[1] 'p' partition or 'b' bank  ARGV[2] layout ('' for the bank)
-- ARGV[3] op, then the op's arguments.
-- Limits hash fields: c, ce, r, re (held slots and their eras; no c: no
-- concurrency limit, no r: no rate limit), per (rate period ms), ct (the
-- most tasks to run at once: a cap under c while other partitions want
-- slots), cs and rs ('1': the partition holds its fair share of a limit it
-- would use more of, so wanting more is no news), ru (until when rs holds:
-- a token elsewhere may be free from then on), xs, xo, xi:<source>; the
-- pn (a shorter rate period waiting to come in: see "period"), and the
-- bank's fl: the forget lock (op lock).
local part = ARGV[1] == 'p'
local L = KEYS[1]
local op = ARGV[3]

-- alive reports a partition that exists and is not retired.
local function alive()
  if not part then return true end
  local m = redis.call('GET', KEYS[5])
  return m and m ~= 'retired'
end

local function num(f)
  local v = redis.call('HGET', L, f)
  if v then return tonumber(v) end
  return nil
end

-- waiting estimates the tasks of the partition that could start now.
local function waiting(now, lim)
  local w = redis.call('LLEN', KEYS[4])
  for _, z in ipairs({KEYS[6], KEYS[7]}) do w = w + redis.call('ZCOUNT', z, '-inf', now) end
  local g = redis.call('HMGET', L, 'gh', 'ord', 'gc')
  if g[1] ~= '1' then
    local ready = redis.call('ZCARD', KEYS[8])
    if ready > 0 then
      local groups = redis.call('ZCARD', KEYS[9])
      if groups == 0 and redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', now, 'LIMIT', 0, 1)[1] then
        groups = 1 -- a group whose hold ended: the next lease puts it back
      end
      if groups == 0 then
        -- No group may start a task now (each is held until a time, at
        -- its limit, or behind its ordered place): its ready tasks are no
        -- demand for slots, which would idle here while another partition
        -- waits (a lease refused for want of slots, or a settle, asks
        -- again when one may start).
        ready = 0
      elseif g[2] == '1' then
        ready = math.min(ready, groups)
      elseif g[3] then
        ready = math.min(ready, groups * tonumber(g[3]))
      end
      w = w + ready
    end
  end
  return math.min(w, lim)
end

-- used counts the rate tokens used in the last period (starts still in the
-- window). Older starts stay: dequeue.lua keeps every start for the longest
-- period a rate may have, so that a rate changed later counts them.
local function used(now, per)
  per = per or num('per')
  if not per then return 0 end
  return redis.call('ZCOUNT', KEYS[2], '(' .. string.format('%d', now - per), '+inf')
end

-- keep_starts makes the starts zset live at least per ms (it may live longer:
-- dequeue.lua keeps it for broker.MaxRatePer).
local function keep_starts(per)
  if per and redis.call('PTTL', KEYS[2]) < per then redis.call('PEXPIRE', KEYS[2], per) end
end

if op == 'state' then
  -- ARGV[4] the most waiting tasks worth counting  ARGV[5] the queue's
  -- rate period, ms ('' none): starts are counted in it also where the
  -- partition has no tokens of the rate yet (it was switched on, and this
  -- partition not told yet). Returns meta, c, ce, r, re, ct, xo, active,
  -- waiting, used, cs, rs, and the ms until the oldest start in the
  -- period leaves it ('' for a missing field, or no such start), the
  -- forgotten starts in the period, and the shorter period that waits to
  -- come in (pn, see "period").
  local f = redis.call('HMGET', L, 'c', 'ce', 'r', 're', 'ct', 'xo', 'cs', 'rs')
  if not part then
    return {'bank', f[1] or '', f[2] or '0', f[3] or '', f[4] or '0', '', f[6] or '', 0, 0, 0, '', '', '', 0, ''}
  end
  local meta = redis.call('GET', KEYS[5]) or ''
  local now = redis_now()
  local u, frees, fu = 0, '', 0
  local per = tonumber(ARGV[5] or '') or (f[3] and num('per'))
  if per then
    u = used(now, per)
    if u > 0 then
      local first = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now - per), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if first[2] then frees = string.format('%d', math.max(tonumber(first[2]) + per - now, 0)) end
    end
    fu = redis.call('ZCOUNT', KEYS[11], '(' .. string.format('%d', now - per), '+inf')
  end
  return {meta, f[1] or '', f[2] or '0', f[3] or '', f[4] or '0', f[5] or '', f[6] or '',
    redis.call('ZCARD', KEYS[3]), waiting(now, tonumber(ARGV[4])), u, f[7] or '', f[8] or '', frees, fu,
    redis.call('HGET', L, 'pn') or ''}
end

if op == 'period' then
  -- ARGV[4] the limits version the caller read  ARGV[5] event channel
  -- ARGV[6] partition index. A Rate changed to a shorter period keeps
  -- counting over the longer one (share.lua) until the rebalance has
  -- brought the tokens the partitions hold down to the new limit: tokens
  -- of the old limit counted over the shorter period would start more
  -- than either rate allows. The rebalance then calls this on each
  -- partition: the shorter period comes in, if the limits are still that
  -- version (a change since may have left the bank in debt again).
  -- Returns 1 when it came in. Wakes idle servers: starts out of the
  -- shorter period may leave tokens free.
  if not part or not alive() then return 0 end
  if (redis.call('HGET', L, 'v') or '0') ~= ARGV[4] then return 0 end
  local pn = redis.call('HGET', L, 'pn')
  if not pn then return 0 end
  redis.call('HSET', L, 'per', pn)
  redis.call('HDEL', L, 'pn', 'w', 'rs', 'ru')
  if waiting(redis_now(), 1) > 0 then redis.call('PUBLISH', ARGV[5], 'p' .. ARGV[6]) end
  return 1
end

if op == 'oldest' then
  -- ARGV[4] k  ARGV[5] the rate's period, ms. Returns the starts in the
  -- period now, then member, age (ms) of the k oldest of them, oldest
  -- first.
  local per = tonumber(ARGV[5])
  if not part or not per then return {'0'} end
  local now = redis_now()
  local zs = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now - per), '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
  local out = {tostring(used(now, per))}
  for j = 1, #zs, 2 do
    out[#out + 1] = zs[j]
    out[#out + 1] = string.format('%d', math.max(now - tonumber(zs[j + 1]), 0))
  end
  return out
end

if op == 'lock' or op == 'unlock' then
  -- On the bank only. ARGV[4] the caller's token  ARGV[5] (lock) how long
  -- the lock holds, ms. lock: takes the queue's forget lock (bank field fl,
  -- "<token>:<until ms>") unless another token holds it; returns 1 taken,
  -- 0 held elsewhere. unlock: drops it if the token holds it. Forgetting
  -- starts (Broker.dropUnbacked) decides from counts of several partitions:
  -- two rebalances that did it at once would each forget the excess.
  if part then return redis.error_reply('ERR slots.lua: ' .. op .. ' is a bank op') end
  local fl = redis.call('HGET', L, 'fl')
  local tok, untl
  if fl then tok, untl = string.match(fl, '^(.*):(%d+)$') end
  local now = redis_now()
  if op == 'unlock' then
    if tok == ARGV[4] then redis.call('HDEL', L, 'fl') end
    return 1
  end
  if tok and tok ~= ARGV[4] and tonumber(untl) > now then return 0 end
  redis.call('HSET', L, 'fl', ARGV[4] .. ':' .. string.format('%d', now + tonumber(ARGV[5])))
  return 1
end

if op == 'forget' then
  -- ARGV[4] how long starts are kept, ms (broker.MaxRatePer), then
  -- members of the starts zset: starts no token backs, the oldest of the
  -- queue's period (see Broker.dropUnbacked), are no longer counted
  -- against this partition's tokens. By member, so a call sent twice
  -- forgets nothing more. They are real starts all the same: they move to
  -- the forgotten starts zset, which the rebalance counts against the
  -- tokens it shares out (a limit raised while they are in the period
  -- adds that many fewer free tokens). Forgetting never leaves the
  -- partition room to start tasks it had not: a start forgotten here may
  -- back a token of this partition (the starts in excess are elsewhere, or
  -- a lowered limit left the bank in debt), and a token it frees would let
  -- a task start while the queue's period holds as many starts as the
  -- limit. Such tokens go to the bank in the same step, as a transfer (see
  -- give) that the rebalance completes; with a transfer outstanding
  -- nothing is forgotten (the rebalance completes it, counts again and
  -- forgets then). Returns the starts forgotten.
  if not part or not alive() or #ARGV < 5 then return 0 end
  if redis.call('HGET', L, 'xo') then return 0 end
  local r = num('r')
  local now = redis_now()
  local before = r and used(now) or 0
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(ARGV, 5))
  local zs = {}
  for i = 1, #scores do
    if scores[i] then
      zs[#zs + 1] = scores[i]
      zs[#zs + 1] = ARGV[4 + i]
    end
  end
  if #zs == 0 then return 0 end
  local k = redis.call('ZREM', KEYS[2], unpack(ARGV, 5))
  local keep = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[11], unpack(zs))
  redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now - keep)
  redis.call('PEXPIRE', KEYS[11], keep)
  if r then
    local freed = math.max(r - used(now), 0) - math.max(r - before, 0)
    if freed > 0 then
      redis.call('HINCRBY', L, 'r', -freed)
      local seq = redis.call('HINCRBY', L, 'xs', 1)
      redis.call('HSET', L, 'xo', seq .. '|' .. (redis.call('HGET', L, 'ce') or '0') .. '|' .. (redis.call('HGET', L, 're') or '0') .. '|B,0,' .. freed .. ',')
    end
  end
  return k
end

if op == 'starts' then
  -- ARGV[4] how long starts are kept, ms  ARGV[5] offset  ARGV[6] count
  -- ARGV[7] 'f' for the forgotten starts (else the starts zset).
  -- Returns member, age (ms) of the starts kept, newest first, from offset
  -- on: those a repartition copies from an old partition (Broker.copyStarts).
  if not part then return {} end
  local z = ARGV[7] == 'f' and KEYS[11] or KEYS[2]
  local now = redis_now()
  local zs = redis.call('ZREVRANGEBYSCORE', z, '+inf', '(' .. string.format('%d', now - tonumber(ARGV[4])), 'WITHSCORES', 'LIMIT', tonumber(ARGV[5]), tonumber(ARGV[6]))
  local out = {}
  for j = 1, #zs, 2 do
    out[#out + 1] = zs[j]
    out[#out + 1] = string.format('%d', math.max(now - tonumber(zs[j + 1]), 0))
  end
  return out
end

if op == 'vacate' then
  -- ARGV[4] 'f' for the forgotten starts (else the starts zset), then
  -- members. On an old partition a repartition empties, once a new
  -- partition has adopted these starts (Broker.copyStarts): they are
  -- dropped here, so that no rebalance gives this partition tokens to back
  -- them again. Not while it holds slots or a transfer (a rebalance gave
  -- it tokens since it gave its own away: they move first, or they would
  -- be lost when it is retired): returns -1 then, else the starts dropped.
  if not part then return 0 end
  local f = redis.call('HMGET', L, 'c', 'r', 'xo')
  if tonumber(f[1] or '0') > 0 or tonumber(f[2] or '0') > 0 or f[3] then return -1 end
  if #ARGV < 5 then return 0 end
  return redis.call('ZREM', ARGV[4] == 'f' and KEYS[11] or KEYS[2], unpack(ARGV, 5))
end

if op == 'adopt' or op == 'adoptf' then
  -- ARGV[4] source ID  ARGV[5] how long starts are kept, ms, then pairs
  -- member, age: starts of an old partition of a repartition, entered here
  -- with their ages (later than they were read: they count at least as
  -- long as there) under names of their own, so a copy sent twice counts
  -- once; adoptf enters forgotten starts among the forgotten ones.
  if not part or not alive() then return 0 end
  local z = op == 'adoptf' and KEYS[11] or KEYS[2]
  local now = redis_now()
  local zs = {}
  for i = 6, #ARGV - 1, 2 do
    zs[#zs + 1] = string.format('%d', now - tonumber(ARGV[i + 1]))
    zs[#zs + 1] = 'o' .. ARGV[4] .. '.' .. ARGV[i]
  end
  if #zs == 0 then return 0 end
  redis.call('ZADD', z, unpack(zs))
  if redis.call('PTTL', z) < tonumber(ARGV[5]) then redis.call('PEXPIRE', z, ARGV[5]) end
  return #zs / 2
end

if op == 'give' then
  -- ARGV[4] this node's ID, then quadruples: destination ID, concurrency
  -- slots, rate tokens, '1' to give the slots even if tasks use them (only
  -- to the bank, which a lowered limit left in debt). Gives at most what
  -- the node can: free concurrency slots (held, not used by a running
  -- task), rate tokens (free ones first, then used ones, each with the age
  -- of the start that used it, which counts at the destination as it did
  -- here; used ones given to the bank leave their starts here). Returns {'ok', record}, {'none', ''} when nothing could be
  -- given, or {'busy', record} when a record is outstanding (complete it
  -- first; it may be this very call's, sent twice).
  if part then
    local bad = layout_error(KEYS[5], ARGV[2])
    if bad then return bad end
  end
  local xo = redis.call('HGET', L, 'xo')
  if xo then return {'busy', xo} end
  local c, r = num('c'), num('r')
  local now = redis_now()
  local act = 0
  if part and c then act = redis.call('ZCARD', KEYS[3]) end
  local freec = c and math.max(c - act, 0) or 0
  local u = 0
  if part and r then u = used(now) end
  local freer = r and math.max(r - u, 0) or 0
  local parts, gc, gr = {}, 0, 0
  for i = 5, #ARGV, 4 do
    local dc, dr = 0, 0
    if c then
      local want = tonumber(ARGV[i + 1])
      if ARGV[i + 3] == '1' then
        dc = math.min(want, c - gc)
      else
        dc = math.min(want, freec)
        freec = freec - dc
      end
      if dc < 0 then dc = 0 end
      gc = gc + dc
    end
    local ages = {}
    if r then
      dr = math.max(math.min(tonumber(ARGV[i + 2]), r - gr), 0)
      local fromfree = math.min(dr, freer)
      freer = freer - fromfree
      local n = dr - fromfree
      if n > 0 and part and ARGV[i] ~= 'B' then
        -- the oldest starts still in the window: the tokens they use go
        -- with their ages. Tokens that pay the bank's debt (a lowered
        -- limit) leave their starts here: the starts were made all the
        -- same, so this partition starts nothing more until they are out
        -- of the period, and the bank, which keeps no starts, gets no
        -- token it could give out again while its start is in the period.
        local zs = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now - num('per')), '+inf', 'WITHSCORES', 'LIMIT', 0, n)
        for j = 1, #zs, 2 do
          redis.call('ZREM', KEYS[2], zs[j])
          ages[#ages + 1] = string.format('%d', math.max(now - tonumber(zs[j + 1]), 0))
        end
      end
      gr = gr + dr
    end
    if dc > 0 or dr > 0 then
      parts[#parts + 1] = ARGV[i] .. ',' .. dc .. ',' .. dr .. ',' .. table.concat(ages, '.')
    end
  end
  if #parts == 0 then return {'none', ''} end
  if gc > 0 then redis.call('HINCRBY', L, 'c', -gc) end
  if gr > 0 then redis.call('HINCRBY', L, 'r', -gr) end
  local seq = redis.call('HINCRBY', L, 'xs', 1)
  local rec = seq .. '|' .. (redis.call('HGET', L, 'ce') or '0') .. '|' .. (redis.call('HGET', L, 're') or '0') .. '|' .. table.concat(parts, '|')
  redis.call('HSET', L, 'xo', rec)
  return {'ok', rec}
end

if op == 'apply' then
  -- ARGV[4] source ID  ARGV[5] record number  ARGV[6] its concurrency era
  -- ARGV[7] its rate era  ARGV[8] slots  ARGV[9] tokens  ARGV[10] ages of
  -- the used tokens ('.'-separated ms)  ARGV[11] event channel
  -- ARGV[12] partition index ('' for none)  ARGV[13] how long starts are
  -- kept, ms (broker.MaxRatePer; '' or missing: the rate's period).
  -- Returns 'ok', 'dup' (applied before), 'gone' (the partition is
  -- retired and never applied the part: the caller gives it to the bank,
  -- see slots.go complete) or 'lost' (retired, and its limits hash, which
  -- tells whether it applied the part, is gone: the part is dropped, never
  -- doubled). A retired partition applies nothing more, so its xi fields,
  -- kept with its limits hash until finishRepartition lets it expire, tell
  -- for good whether a part reached it.
  local seq = tonumber(ARGV[5])
  local last = num('xi:' .. ARGV[4])
  if last and last >= seq then return 'dup' end
  if not alive() then
    if redis.call('EXISTS', L) == 1 then return 'gone' end
    return 'lost'
  end
  redis.call('HSET', L, 'xi:' .. ARGV[4], ARGV[5])
  local dc, dr = tonumber(ARGV[8]), tonumber(ARGV[9])
  local f = redis.call('HMGET', L, 'c', 'ce', 'r', 're')
  local added = false
  if dc ~= 0 and f[1] and (f[2] or '0') == ARGV[6] then
    redis.call('HINCRBY', L, 'c', dc)
    added = dc > 0
  end
  if dr ~= 0 and f[3] and (f[4] or '0') == ARGV[7] then
    redis.call('HINCRBY', L, 'r', dr)
    added = added or dr > 0
  end
  if part and ARGV[10] ~= '' then
    -- The starts come whatever became of the tokens: the source no
    -- longer counts them, and a rate switched off and on again since
    -- the give (a new era, in which the tokens do not count here) or
    -- changed later counts every start of its period.
    local now = redis_now()
    local i = 0
    for age in string.gmatch(ARGV[10], '%d+') do
      i = i + 1
      redis.call('ZADD', KEYS[2], now - tonumber(age), 'x' .. ARGV[4] .. '.' .. ARGV[5] .. '.' .. i)
    end
    keep_starts(num('per'))
    local keep = tonumber(ARGV[13] or '')
    if keep and redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
  end
  if added and part and ARGV[12] ~= '' and waiting(redis_now(), 1) > 0 then
    redis.call('PUBLISH', ARGV[11], 'p' .. ARGV[12])
  end
  return 'ok'
end

if op == 'clear' then
  -- ARGV[4] record number: drops the outstanding record if it is that one.
  local xo = redis.call('HGET', L, 'xo')
  if xo and string.sub(xo, 1, #ARGV[4] + 1) == ARGV[4] .. '|' then redis.call('HDEL', L, 'xo') end
  return 1
end

if op == 'hold' then
  -- ARGV[4] the limits version the caller computed with. Holds the
  -- partition while the bank is in concurrency debt (see slots.go,
  -- planSlots): ct 0 (it starts nothing; a settle that frees a slot wakes
  -- servers, whose dequeue asks for a rebalance) and cs. Written whatever
  -- the slots became since the caller read them, as a hold only stops
  -- starts; not when the limits changed since (returns 0).
  local bad = layout_error(KEYS[5], ARGV[2])
  if bad then return bad end
  if (redis.call('HGET', L, 'v') or '0') ~= ARGV[4] then return 0 end
  redis.call('HSET', L, 'ct', 0, 'cs', '1')
  return 1
end

if op == 'cap' then
  -- ARGV[4] ct ('' none)  ARGV[5] cs  ARGV[6] rs  ARGV[7] event channel
  -- ARGV[8] partition index  ARGV[9..11] c, r and ct as the caller read
  -- them ('' missing)  ARGV[12] the limits version it computed with: when
  -- any of these changed since, the cap was computed from a state that is
  -- gone and nothing is written (returns 0)  ARGV[13] with rs, the ms from
  -- now after which rs is stale ('' never): a rate token of the queue
  -- becomes free then, maybe where no task wants it, so a dequeue refused
  -- for want of tokens after that asks for a rebalance again (field ru,
  -- the Redis time). Wakes idle servers when a higher cap leaves room for
  -- tasks that wait.
  local bad = layout_error(KEYS[5], ARGV[2])
  if bad then return bad end
  local seen = redis.call('HMGET', L, 'c', 'r', 'ct', 'v')
  seen[4] = seen[4] or '0'
  for i = 1, 4 do
    if (seen[i] or '') ~= ARGV[8 + i] then return 0 end
  end
  local old = num('ct')
  if ARGV[4] == '' then redis.call('HDEL', L, 'ct') else redis.call('HSET', L, 'ct', ARGV[4]) end
  for _, kv in ipairs({{'cs', ARGV[5]}, {'rs', ARGV[6]}}) do
    if kv[2] == '1' then redis.call('HSET', L, kv[1], '1') else redis.call('HDEL', L, kv[1]) end
  end
  if ARGV[6] == '1' and (ARGV[13] or '') ~= '' then
    redis.call('HSET', L, 'ru', string.format('%d', redis_now() + tonumber(ARGV[13])))
  else
    redis.call('HDEL', L, 'ru')
  end
  local new = tonumber(ARGV[4])
  if old and (not new or new > old) and waiting(redis_now(), 1) > 0 then
    redis.call('PUBLISH', ARGV[7], 'p' .. ARGV[8])
  end
  return 1
end

return redis.error_reply('ERR slots.lua: unknown op ' .. tostring(op))
