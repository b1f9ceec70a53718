-- dequeue.lua: lease up to n tasks of one partition.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] active zset (lease expiry)
-- KEYS[4] paused flag   KEYS[5] archived zset KEYS[6] results hash
-- KEYS[7] scheduled zset KEYS[8] retry zset  KEYS[9] token sequence
-- KEYS[10] layout meta  KEYS[11] reply cache  KEYS[12] limits hash (see share.lua)
-- KEYS[13] starts zset (token -> start ms)  KEYS[14..19] group keys (groups.lua)
-- KEYS[20] events stream
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] n  ARGV[5] lease ms  ARGV[6] event channel  ARGV[7] partition
-- ARGV[8] events stream MAXLEN ('' or '0': no events)
-- ARGV[9] how long starts are kept, ms (broker.MaxRatePer)
-- ARGV[10] how many starts are kept at most (broker.MaxQueueRate)
-- Returns a flat array id1, record1, records1, id2, record2, records2, ... of
-- the leased tasks with state set to active and a fresh token each, and
-- their durable records ('' for none; see dur_with). Pending tasks come first
-- (oldest first); when fewer than n are pending, scheduled and retry tasks
-- due by the Redis clock are leased directly, earliest first, without a
-- detour through the pending list (this is what makes a burst of tasks due at
-- the same instant start at the rate workers take them). An ID without a
-- record is dropped; a record with an unreadable header is archived with a
-- reason (its bytes kept as the result) and not returned. A request run again
-- returns the tasks its first run leased that are still leased to it, and
-- leases nothing more. When the partition holds concurrency slots (field c of
-- its limits hash, see slots.lua), it leases at most the room left under
-- them (and under its cap ct, when set): the slots minus the tasks active in
-- the partition (leased, not settled nor recovered). When it holds rate
-- tokens (r tasks per per ms), it leases at most r minus the tasks it
-- started in the last per ms (the starts zset, a sliding window); when that
-- leaves no room while tasks wait, it announces once when room opens again
-- ("p<partition>:<ms>" event). Every start is recorded, with rate tokens or
-- without, and kept for the longest period a rate may have (ARGV[9]; at
-- most the ARGV[10] newest, as no rate counts more), so that a rate set or
-- changed later counts the starts made in its period before the change. A
-- call refused for want of slots while tasks wait, or that leaves free
-- slots unused under a cap, returns {'!'} alone: the caller rebalances the
-- queue's slots. A partition that holds its fair share (cs, rs) does not
-- ask, but for rate tokens only until ru, when a token in use somewhere
-- becomes free (maybe where nothing waits): a call refused after that asks
-- again, and one refused before announces ru too; and a refused call that
-- puts back a group whose hold ended asks (the share was computed without
-- it, and a slot may be free elsewhere with nothing to run).
-- When the partition holds grouped tasks, due scheduled and retry tasks are
-- not leased directly but made ready by Maintain (grouped ones join their
-- group), and the groups with ready tasks are served round-robin, one task per turn, the ungrouped tasks
-- taking turns as one more group; a group leaves the rotation at the start
-- after which it may not start another (an ordered group's task started,
-- its rate is used up), at the first turn that finds it at its concurrency
-- limit, and when it is throttled, and only what lets it go puts it back
-- (groups.lua), so a call walks past a blocked group at most once each time
-- it blocks, never once per task made ready in it. A group held until a time
-- (throttled, over its rate) returns at that time, the earliest announced
-- with a "p<partition>:<ms>" event; a call refused for want of slots or rate
-- tokens puts such groups back too, so that the rebalance it asks for
-- counts their tasks as waiting (slots.lua counts the rotation's groups). A call that still met more groups
-- unable to start a task than it could look at (their limits changed)
-- publishes "p<partition>" for the next call to go on. While a repartition
-- runs, no grouped task starts (field gh of the limits hash; see move.lua).
-- Each task leased is an 's' event in the events stream, each archived
-- record an 'a' event.
local bad = layout_error(KEYS[10], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[11], ARGV[2], tonumber(ARGV[3]))
if cached then
  -- The tasks the first run leased that are still leased to it.
  return dur_with(KEYS[6], leased_again(KEYS[3], KEYS[1], cached))
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {} end
local n = tonumber(ARGV[4])
local lim = redis.call('HMGET', KEYS[12], 'c', 'r', 'per', 'gc', 'gr', 'gper', 'ord', 'gh', 'ct', 'cs', 'rs', 'ru')
-- want is the reply of a call that starts nothing for want of slots: {'!'}
-- asks the caller to rebalance the queue's slots (slots.lua) when tasks
-- wait here and the partition may get more (fair is not '1'), and when
-- nothing waits here while it holds a free concurrency slot under a cap
-- (other partitions want slots: refused for want of rate tokens, it would
-- keep the slot idle, and a partition at its fair share does not ask for
-- it), else nothing.
local function want(fair)
  local waits = redis.call('LLEN', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[14]) == 1
  if fair ~= '1' and waits then return {'!'} end
  if not waits and lim[9] and lim[1] and tonumber(lim[1]) > redis.call('ZCARD', KEYS[3]) then return {'!'} end
  return {}
end
-- release_held puts back in the rotation the groups whose hold (a throttle,
-- a GroupRate window) has ended: a group comes back when let go. Returns
-- whether one with a task ready came back.
local function release_held(G, now)
  local back = false
  for _, g in ipairs(redis.call('ZRANGEBYSCORE', G.w, '-inf', now)) do
    redis.call('ZREM', G.w, g)
    redis.call('HDEL', G.s, 't:' .. g) -- a throttle that ended
    if g_next(G, g, 1)[1] then
      g_enter(G, g, nil)
      back = true
    end
  end
  return back
end
-- want_held is want for a call that found no room: groups whose hold
-- ended come back first, and when one did the call asks even at the
-- partition's fair share, which was computed without them (another
-- partition's slot may be free with nothing to run). The next hold's end
-- is announced as by a call that looks at the groups: woken by the end of
-- one hold, a call refused here was the only one to announce the next,
-- whose groups then waited for a settle or the maintainer to bring a call.
local function want_held(fair, now)
  if redis.call('EXISTS', KEYS[14]) == 1 then
    local G = g_keys(14)
    if release_held(G, now) then fair = nil end
    announce_held(G, KEYS[12], ARGV[6], ARGV[7])
  end
  return want(fair)
end
if lim[1] then
  local cap, act = tonumber(lim[1]), redis.call('ZCARD', KEYS[3])
  if lim[9] and tonumber(lim[9]) < cap then cap = tonumber(lim[9]) end
  local room = cap - act
  if room <= 0 then
    if act < tonumber(lim[1]) then return {'!'} end -- free slots over its cap: to give away
    -- Groups whose hold ended are waiting tasks too: back in the rotation,
    -- they count in the rebalance that the reply asks for (slots.lua).
    return want_held(lim[10], redis_now())
  end
  if room < n then n = room end
end
local now = redis_now()
local per = nil
if lim[2] then
  per = tonumber(lim[3])
  local since = '(' .. string.format('%d', now - per)
  local made = redis.call('ZCOUNT', KEYS[13], since, '+inf')
  local room = tonumber(lim[2]) - made
  if room <= 0 then
    -- Room opens when the start that leaves the last one too many has
    -- left the window.
    local first = redis.call('ZRANGEBYSCORE', KEYS[13], since, '+inf', 'WITHSCORES', 'LIMIT', made - tonumber(lim[2]), 1)
    local at = (tonumber(first[2]) or now) + per
    -- Held at its fair share of the tokens (rs), the partition asks for
    -- more again once a token of the queue may have become free elsewhere
    -- (ru), and until then has servers come back at that moment.
    local fair, ru = lim[11], tonumber(lim[12] or '')
    if fair == '1' and ru then
      if ru <= now then fair = nil elseif ru < at then at = ru end
    end
    at = string.format('%d', at)
    if (redis.call('LLEN', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[14]) == 1) and redis.call('HGET', KEYS[12], 'w') ~= at then
      redis.call('HSET', KEYS[12], 'w', at)
      redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[7] .. ':' .. at)
    end
    return want_held(fair, now)
  end
  if room < n then n = room end
end
local G = g_keys(14)
local ids = {}
local taken = {} -- grouped ID -> its group, for those taken from their group
if redis.call('EXISTS', G.id) == 0 then
  ids = redis.call('RPOP', KEYS[2], n) or {}
  if #ids < n then
    for _, z in ipairs({KEYS[7], KEYS[8]}) do
      local want = n - #ids
      if want <= 0 then break end
      local due = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, want)
      if #due > 0 then
        call_many('ZREM', z, due, 1)
        for _, id in ipairs(due) do ids[#ids + 1] = id end
      end
    end
  end
else
  -- Grouped: serve the rotation, which holds the groups that may start a
  -- task, and until their next turn those that reached their concurrency
  -- limit (see groups.lua). Due scheduled and retry tasks are made ready by
  -- the partition's maintainer (which a due time wakes), so that each call
  -- here costs a few commands only.
  g_uncounted(G, lim[4], lim[5], lim[7]) -- no group limit: no counts kept
  -- The first held group, read once: most calls find none, and then
  -- neither release nor announce anything (unless a group goes on hold
  -- here, held).
  local first_held = redis.call('ZRANGE', G.w, 0, 0, 'WITHSCORES')[2]
  local held = first_held ~= nil
  if held and tonumber(first_held) <= now then release_held(G, now) end
  local gc, grl, gper, ord, hold = tonumber(lim[4]), tonumber(lim[5]), tonumber(lim[6]), lim[7] == '1', lim[8] == '1'
  local c = redis.call('HGET', G.s, 'c')
  local ungrouped = redis.call('LLEN', KEYS[2])
  if ungrouped > 0 and not hold then g_join(G, '') end -- the ungrouped tasks take turns too
  g_cache(G)
  -- Tasks taken from q are removed with one command after the loop, and
  -- when the call wraps round (a group is met at most once before and once
  -- after); an ordered group's at once (its holder may go out of turn).
  local unq = {}
  local tries, capped = 0, false
  -- The rotation from the cursor on, read a batch at a time, wrapping round
  -- once per call at most.
  local heads, hi, wrapped = {}, 1, false
  local OUT = g_out()
  -- window_end is when a group whose rate log (after its starts) holds
  -- started starts has room again.
  local function window_end(log, started)
    return struct.unpack('>I6', log, 1 + 6 * (started - grl)) + gper
  end
  while #ids < n do
    if tries >= 4 * n + 32 then
      -- Groups in the rotation that could not start a task after all
      -- (their limits changed); the next call goes on from the cursor.
      capped = true
      break
    end
    tries = tries + 1
    if hold then
      -- A repartition holds the groups: the ungrouped tasks run alone.
      ids = redis.call('RPOP', KEYS[2], n) or {}
      break
    end
    if hi > #heads then
      local lim = string.format('%d', n - #ids + 1)
      heads, hi = redis.call('ZRANGEBYSCORE', G.r, c and ('(' .. c) or '-inf', '+inf', 'WITHSCORES', 'LIMIT', '0', lim), 1
      if #heads == 0 and c and not wrapped then
        wrapped, c = true, nil
        call_many('ZREM', G.q, unq, 1)
        unq = {}
        heads = redis.call('ZRANGEBYSCORE', G.r, '-inf', '+inf', 'WITHSCORES', 'LIMIT', '0', lim)
      end
      if #heads == 0 then break end
      g_prefetch(G, heads, 1, 2)
    end
    local g = heads[hi]
    c = heads[hi + 1]
    if g == '' then
      hi = hi + 2
      local id = redis.call('RPOP', KEYS[2])
      ungrouped = ungrouped - 1
      if id then ids[#ids + 1] = id end
      if not id or ungrouped <= 0 then redis.call('ZREM', G.r, '') end
    else
      hi = hi + 2
      -- Count the task as running before looking (one call when it is
      -- taken, as it mostly is); undone when the group cannot start one.
      -- A throttled group is never here: it waits in w.
      local holder = ord and redis.call('HGET', G.s, 'h:' .. g)
      local v = g_count(G, g, 1)
      local mark = math.floor(v / OUT)
      local active = v - mark * OUT
      local full = gc and active > gc
      local first, id, more = nil, nil, false
      if not full then
        local next = redis.call('ZRANGEBYLEX', G.q, '[' .. g .. '\0', '(' .. g .. '\1', 'LIMIT', '0', '2')
        first, more = next[1], next[2] ~= nil
        id = first and string.sub(first, #g + 10)
      end
      if first and holder and holder ~= id then
        -- The task holding the sequence's place goes first when it is
        -- ready again (back from retry), even behind an earlier task that
        -- became due meanwhile.
        local _, hseq = g_of(G, holder)
        local m = hseq and (g .. '\0' .. hseq .. holder)
        if m and redis.call('ZSCORE', G.q, m) then first, id, more = m, holder, true end
      end
      local log, started = '', 0
      if grl and first then log, started = g_rate(G, g, gper, now) end
      if not first or (holder and holder ~= id) or (grl and started >= grl) then
        -- In the rotation though it cannot start a task (at its
        -- concurrency limit since its last turn, its limits changed, or
        -- nothing is ready): out until a task becomes ready or one of its
        -- tasks settles (marked 2 when at its concurrency limit). Over its
        -- rate: back at the time a start leaves the window.
        active = active - 1
        if active <= 0 then
          g_count(G, g, -v) -- deleted
        else
          g_count(G, g, ((full and 2 or 1) - mark) * OUT - 1)
        end
        redis.call('ZREM', G.r, g)
        if first and grl and started >= grl then
          redis.call('ZADD', G.w, window_end(log, started), g)
          held = true
        end
      else
        if ord then
          redis.call('ZREM', G.q, first)
          redis.call('HSET', G.s, 'h:' .. g, id)
        else
          unq[#unq + 1] = first
        end
        if grl then
          log, started = log .. struct.pack('>I6', now), started + 1
          redis.call('HSET', G.l, g, log)
        end
        -- An ordered group waits for this task and one whose rate this
        -- start used up for its time in w: they leave the rotation now. A
        -- group that reached its concurrency limit stays: one of its tasks
        -- mostly settles before its next turn, and taking it out would
        -- cost that settle a join; a turn that finds it still at its limit
        -- takes it out (marked 2).
        local limited = gc and active >= gc
        local spent = grl and started >= grl
        if more and not ord and not spent then
          if mark > 0 then g_count(G, g, -mark * OUT) end
        else
          redis.call('ZREM', G.r, g)
          local want = limited and 2 or 1
          if want ~= mark then g_count(G, g, (want - mark) * OUT) end
          if more and spent and not ord and not limited then
            redis.call('ZADD', G.w, window_end(log, started), g)
            held = true
          end
        end
        ids[#ids + 1] = id
        taken[id] = g
      end
    end
  end
  call_many('ZREM', G.q, unq, 1)
  g_flush(G)
  if c then redis.call('HSET', G.s, 'c', c) end
  if capped then redis.call('PUBLISH', ARGV[6], 'p' .. ARGV[7]) end
  if held then announce_held(G, KEYS[12], ARGV[6], ARGV[7]) end
end
if #ids == 0 then
  -- Nothing to start: free slots held while other partitions want some
  -- (a cap is set) are to be given away.
  if lim[9] and lim[1] and tonumber(lim[1]) > redis.call('ZCARD', KEYS[3]) then return {'!'} end
  return {}
end
local exp = now + tonumber(ARGV[5])
-- Scores go to Redis as strings: a Lua number is formatted with %.17g on
-- every redis.call, which costs more than the command it feeds.
local exps, nows = string.format('%d', exp), string.format('%d', now)
local tok = next_tokens(KEYS[9], #ids)
local first_tok = tok
local E = ev_new(KEYS[20], ARGV[8])
local out, leased = {}, {}
-- The records are read with one HMGET, and the leased ones and their leases
-- written with one HSET and one ZADD after the loop (call_many).
local recs, act = {}, {}
local got = hget_many(KEYS[1], ids)
for k, id in ipairs(ids) do
  local rec = got[k]
  if rec_ok(rec) then
    rec = rec_patch(rec, 2, tok, nil, nil, nil, nil)
    recs[#recs + 1] = id
    recs[#recs + 1] = rec
    act[#act + 1] = exps
    act[#act + 1] = id
    out[#out + 1] = id
    out[#out + 1] = rec
    leased[#leased + 1] = id
    leased[#leased + 1] = tok
    if E then ev_add(E, 's', id, rec_type(rec)) end
    tok = tok + 1
  else
    if rec then
      redis.call('HSET', KEYS[6], id, rec)
      redis.call('HSET', KEYS[1], id, rec_corrupt(now, 'tide: undecodable task record (' .. #rec .. ' bytes, bad header); original bytes kept as the result'))
      redis.call('ZADD', KEYS[5], now, id)
      ev_add(E, 'a', id, '', 'tide: undecodable task record')
    end
    if taken[id] then
      -- Not leased after all: the group gets its slot (and place) back.
      g_release(G, taken[id], id, true, true)
      if not rec then redis.call('HDEL', G.id, id) end
    end
  end
end
call_many('HSET', KEYS[1], recs, 2)
call_many('ZADD', KEYS[3], act, 2)
if #leased > 0 then
  local starts = {}
  for i = 2, #leased, 2 do
    starts[#starts + 1] = nows
    starts[#starts + 1] = string.format('%d', leased[i])
  end
  call_many('ZADD', KEYS[13], starts, 2)
  local keep = tonumber(ARGV[9])
  redis.call('ZREMRANGEBYSCORE', KEYS[13], '-inf', now - keep)
  local over = redis.call('ZCARD', KEYS[13]) - tonumber(ARGV[10])
  if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[13], 0, over - 1) end
  redis.call('PEXPIRE', KEYS[13], keep)
end
g_flush(G)
ev_flush(E)
req_put(KEYS[11], ARGV[2], string.format('%d:%d:%d', exp, first_tok, #leased / 2), tonumber(ARGV[3]))
return dur_with(KEYS[6], out)
