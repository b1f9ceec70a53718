-- settle.lua: apply the settlements of leased tasks of one partition.
-- KEYS[1] records hash  KEYS[2] active zset  KEYS[3] pending list
-- KEYS[4] retry zset    KEYS[5] archived zset KEYS[6] completed zset
-- KEYS[7] results hash  KEYS[8] scheduled zset KEYS[9] unique locks hash
-- KEYS[10] stats hash   KEYS[11] layout meta  KEYS[12] reply cache
-- KEYS[13] attempt histories hash  KEYS[14] minute counters hash
-- KEYS[15] limits hash (c: concurrency share; gw: last announced end of a group's hold)  KEYS[16..21] group keys (groups.lua)
-- KEYS[22] progress hash  KEYS[23..25] waiter keys (w_keys in lib.lua)
-- KEYS[26] events stream
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] event channel  ARGV[5] partition
-- ARGV[6] today (UTC, YYYY-MM-DD) for the processed/failed day counters
-- ARGV[7] max archived  ARGV[8] archive TTL ms  ARGV[9] this minute (Unix minutes)
-- ARGV[10] done channel (tasks someone waits for)
-- ARGV[11] events stream MAXLEN ('' or '0': no events)
-- ARGV[12] a hash tag of this partition (for follow-up IDs, fu_end)
-- then 9 per settlement: op, id, token, a, b, c, started ms, server, group
-- ('' for none, '?' when the caller does not know, else the task's group as
-- its record says), where op is
--   'd' done:      c = done-at ms; a, b unused            -> deleted
--   'c' completed: a = new record, b = expire-at ms, c = completed-at ms -> kept until b
--   'r' retry:     a = retry-at ms ('+<ms>': that long from now on the Redis
--                  clock, as for 'w' and 't'), b = failed-at ms, c = error
--   'a' archive:   b = failed-at ms, c = error
--   'q' requeue:   back to the front of pending, attempt not counted
--   'w' defer:     like retry, but Retried unchanged and not counted as
--                  processed or failed (the handler asked to wait)
--   't' throttle:  like defer, and the task's group starts nothing before
--                  a (tide.ThrottleGroup)
--   'p' park:      a = wake-at ms (as for 'r'), b = what it waits for
--                  ('sleep:<name>', 'signal:<name>'): waiting (state 7) in
--                  the retry zset until a, its durable records noting the
--                  wait ('p', dur_park); pending at once instead when a has
--                  come or the signal is stored already. Like defer it
--                  keeps Retried and counts as neither processed nor failed
-- Returns a string of one code per settlement: '0' applied, '1' lease lost
-- (nothing changed), '3' no such task here (gone, or it may be in the old
-- span of a repartition). A task whose cancellation was recorded is archived as
-- cancelled instead of being retried or requeued. The unique lock is released
-- by done, completed and archive. Done, retry and archive count as processed
-- today and this minute; retry and archive as failed. Retry, defer, archive
-- and completed add the attempt to the task's history (done deletes it).
-- Each completed or archived task trims up to two tasks past their
-- retention or the archive's bounds, so trimming keeps pace with any
-- completion rate. When the partition was at its concurrency slots and now has
-- room while tasks wait, or was at a cap under its slots (ct, see slots.lua)
-- and now has free slots to give away, or was capped (a contended limit)
-- and is left with free slots and nothing to run, idle servers are woken
-- ("p" event; a Dequeue that meets free slots over a cap, or free slots
-- under a cap with nothing to start, rebalances), as they are
-- when a settled grouped task lets its group run again. A grouped task
-- leaving active gives its group's slot back; done and archive also free
-- an ordered group's place, which retry and defer keep. Done, completed and
-- archive tell the task's waiters (w_ended). A request run again answers
-- from the reply cache. Each settlement applied is recorded in the events
-- stream: done and completed 'd'; retry 'f' then 'r'; archive 'f' then 'a';
-- defer and requeue 'r'; a follow-up task stored 'e'. Done, completed and
-- archive are the task's end: a task someone follows (a workflow step, a
-- NotifyURL) gets its follow-up in the same step (fu_end in lib.lua).
local bad = layout_error(KEYS[11], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[12], ARGV[2], tonumber(ARGV[3]))
if cached then return cached end
local out = {}
local requeued, first_retry = 0, nil
local processed, failed, finished = 0, 0, 0
local before = earliest(KEYS[8], KEYS[4])
local lim = redis.call('HMGET', KEYS[15], 'c', 'ord', 'ct', 'gc', 'gr')
local share = tonumber(lim[1] or '-1')
local was_full = share >= 0 and redis.call('ZCARD', KEYS[2]) >= share
-- A partition capped under its slots (ct: other partitions want them) that
-- was at its cap: the slots its tasks free are to be given away.
local cap = tonumber(lim[3] or '')
local was_capped = cap and cap < share and redis.call('ZCARD', KEYS[2]) >= cap
local G = g_keys(16)
if redis.call('EXISTS', G.id) == 0 then
  G = nil
elseif not g_uncounted(G, lim[4], lim[5], lim[2]) then
  -- The groups' active counts are read with one command and written with
  -- one or two at the end (g_flush); so are the grouped IDs of done tasks
  -- deleted (forgot). Without group limits none are kept (groups.lua).
  g_cache(G)
  G.a['?'] = 0 -- not a group: the settlement's caller did not know it
  g_prefetch(G, ARGV, 21, 9)
  G.a['?'] = nil
end
local forgot = {}
local ordered = lim[2] == '1'
local woke, throttled = false, false
-- Progress and waiters are rare: one EXISTS tells when neither is here.
local W, progress = nil, false
if redis.call('EXISTS', KEYS[22], KEYS[23], KEYS[24]) > 0 then
  W = w_keys(23)
  progress = redis.call('EXISTS', KEYS[22]) == 1
end
local now = nil
if W then now = redis_now() end
local followed = false
local E = ev_new(KEYS[26], ARGV[11])
local F = {t = KEYS[1], p = KEYS[3], tag = ARGV[12]}
-- Tasks leaving active, and done tasks whose results and histories go, are
-- removed with one command each after the loop (call_many).
local left, gone = {}, {}
-- The records are read with one HMGET before the loop, and those of done
-- tasks deleted with one HDEL after it (dels). A settlement of an ID met
-- earlier in the call reads its record again, after the deletions so far,
-- as if each had been read and deleted in turn.
local want = {}
for i = 14, #ARGV, 9 do want[#want + 1] = ARGV[i] end
local got, seen, dels, k = hget_many(KEYS[1], want), {}, {}, 0
for i = 13, #ARGV, 9 do
  local op, id, tok, a, b, c = ARGV[i], ARGV[i+1], tonumber(ARGV[i+2]), ARGV[i+3], ARGV[i+4], ARGV[i+5]
  local started, server = tonumber(ARGV[i+6]), ARGV[i+7]
  k = k + 1
  local rec = got[k]
  if seen[id] then
    call_many('HDEL', KEYS[1], dels, 1)
    dels = {}
    rec = redis.call('HGET', KEYS[1], id)
  end
  seen[id] = true
  if rec_absent(rec) then
    out[#out + 1] = '3'
  elseif not (rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tok) then
    out[#out + 1] = '1'
  else
    if rec_canceled(rec) and (op == 'r' or op == 'q' or op == 'w' or op == 't' or op == 'p') then
      op, b = 'a', (b ~= '' and op ~= 'p') and b or string.format('%d', redis_now())
      c = 'tide: task cancelled' .. (c ~= '' and ('; last error: ' .. c) or '')
    end
    left[#left + 1] = id
    if not now and rec_followed(rec) then now = redis_now() end
    if E then
      local typ = rec_type(rec)
      if op == 'd' or op == 'c' then ev_add(E, 'd', id, typ)
      elseif op == 'r' or op == 'a' then ev_add(E, 'f', id, typ, c); ev_add(E, op, id, typ, c)
      else ev_add(E, 'r', id, typ, c) end
    end
    local g, seq = nil, nil
    if G and ARGV[i+8] ~= '' then
      g = ARGV[i+8]
      if op == 'q' or op == 'p' or g == '?' then g, seq = g_of(G, id) end -- seq: back to its place
    end
    if op ~= 'q' and op ~= 'w' and op ~= 't' and op ~= 'p' then processed = processed + 1 end
    if op == 'r' or op == 'a' then failed = failed + 1 end
    if op == 'd' then
      if fu_end(F, E, id, rec, 'c', tonumber(c), nil, now) then followed = true end
      release_uniq(rec, KEYS[9], id)
      dels[#dels + 1] = id
      gone[#gone + 1] = id -- its result, and history if retried or deferred
      gone[#gone + 1] = dur_field(id) -- and its durable records
      if progress then redis.call('HDEL', KEYS[22], id) end
      if g then forgot[#forgot + 1] = id end
      w_ended(W, id, 'd' .. string.format('%d', now or 0), now, ARGV[10])
    elseif op == 'c' then
      if fu_end(F, E, id, rec, 'c', tonumber(c), nil, now) then followed = true end
      release_uniq(rec, KEYS[9], id)
      if rec_internal(rec) then a = rec_mark_internal(a) end
      redis.call('HSET', KEYS[1], id, a)
      redis.call('ZADD', KEYS[6], tonumber(b), id)
      hist_add(KEYS[13], id, started, tonumber(c), 'd', server, '')
      w_ended(W, id, 'c' .. c, now, ARGV[10])
      finished = finished + 1
    elseif op == 'r' or op == 'w' or op == 't' then
      local at = time_arg(a)
      local retried = rec_retried(rec)
      if op == 'r' then retried = retried + 1 end
      redis.call('HSET', KEYS[1], id, rec_patch(rec, 4, nil, retried, at, tonumber(b), c))
      redis.call('ZADD', KEYS[4], at, id)
      hist_add(KEYS[13], id, started, tonumber(b), op == 't' and 'w' or op, server, c)
      if g and op == 't' then
        g_throttle(G, g, at)
        throttled = true
      end
      if not first_retry or at < first_retry then first_retry = at end
    elseif op == 'a' then
      if fu_end(F, E, id, rec, 'a', tonumber(b), c, now) then followed = true end
      release_uniq(rec, KEYS[9], id)
      redis.call('HSET', KEYS[1], id, rec_patch(rec, 5, nil, nil, nil, tonumber(b), c))
      redis.call('ZADD', KEYS[5], tonumber(b), id)
      hist_add(KEYS[13], id, started, tonumber(b), 'a', server, c)
      w_ended(W, id, 'a' .. b, now, ARGV[10])
      finished = finished + 1
    elseif op == 'p' then
      local at, t = time_arg(a), redis_now()
      local f = dur_field(id)
      local d = redis.call('HGET', KEYS[7], f) or ''
      redis.call('HSET', KEYS[7], f, dur_park(d, b, at))
      if at > t and not (string.sub(b, 1, 7) == 'signal:' and dur_find(d, 's', string.sub(b, 8))) then
        redis.call('HSET', KEYS[1], id, rec_patch(rec, 7, nil, nil, at, nil, nil))
        redis.call('ZADD', KEYS[4], at, id)
        if not first_retry or at < first_retry then first_retry = at end
      else
        op = 'q' -- its time came or its signal is here: it runs again now
      end
    end
    if op == 'q' then
      redis.call('HSET', KEYS[1], id, rec_patch(rec, 1, nil, nil, nil, nil, nil))
      if g then
        g_ready(G, g, seq, id)
        woke = true
      else
        redis.call('RPUSH', KEYS[3], id)
        requeued = requeued + 1
      end
    end
    if g and g_release(G, g, id, true, op == 'd' or op == 'c' or op == 'a', ordered) then woke = true end
    out[#out + 1] = '0'
  end
end
call_many('ZREM', KEYS[2], left, 1)
call_many('HDEL', KEYS[1], dels, 1)
if G then call_many('HDEL', G.id, forgot, 1) end
call_many('HDEL', KEYS[7], gone, 1)
call_many('HDEL', KEYS[13], gone, 1)
count_day(KEYS[10], ARGV[6], processed, failed)
count_minute(KEYS[14], ARGV[9], processed, failed)
if finished > 0 then
  trim(KEYS[6], KEYS[5], KEYS[1], KEYS[7], KEYS[13], redis_now(), tonumber(ARGV[7]), tonumber(ARGV[8]), 2 * finished, G, KEYS[22])
end
g_flush(G)
if woke or followed then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
if requeued > 0 and redis.call('LLEN', KEYS[3]) == requeued then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
if was_full and redis.call('ZCARD', KEYS[2]) < share and (redis.call('LLEN', KEYS[3]) > 0 or g_waiting(G, nil)) then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
if was_capped and redis.call('ZCARD', KEYS[2]) < share then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5]) -- servers look, and rebalance
elseif cap and #left > 0 and redis.call('ZCARD', KEYS[2]) < share and redis.call('LLEN', KEYS[3]) == 0 and not g_waiting(G, redis_now()) then
  -- Capped at its share of a contended limit, its slots now free with
  -- nothing to run: another partition held at its share does not ask
  -- for them, so servers look here, and the dequeue that finds free slots
  -- under the cap rebalances.
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
if throttled then
  -- The first time a held group may run again, announced once as the
  -- lease calls do (dequeue.lua's gw): servers look again then, not only
  -- the one whose maintainer makes the deferred task ready.
  announce_held(G, KEYS[15], ARGV[4], ARGV[5])
end
if first_retry and (not before or first_retry < before) then
  redis.call('PUBLISH', ARGV[4], 's' .. ARGV[5] .. ':' .. string.format('%d', first_retry))
end
ev_flush(E)
local reply = table.concat(out)
req_put(KEYS[12], ARGV[2], reply, tonumber(ARGV[3]))
return reply
