-- lib.lua: helpers prepended to every script (only those a script uses; see
-- scripts.go). They read and patch the fixed 24-byte record header described
-- in internal/codec (1-based offsets here):
--   1 version (2) | 2 state (low 3 bits) + followed (bit 3), internal
--   (bit 4), flow (bit 5), moving (bit 6) and cancel (bit 7) flags | 3-10 token
--   11-12 retried | 13-14 max retry | 15-20 process-at ms | 21-23 body len
--   24 uniq len | 25.. body | unique key | failure (empty, or failed-at ms (6) .. last error)
-- States: 1 pending, 2 active, 3 scheduled, 4 retry, 5 archived, 6 completed,
-- 7 waiting (a parked durable handler; it lies in the retry zset, due when
-- it wakes, so that forwarding, admin actions and removal treat it as a
-- retry task).
--
-- A task's durable records (broker.Durable) live in the results hash under
-- the field "\0<id>", which no task ID can be (IDs have no control
-- characters), so that they go wherever the task's result goes: every
-- script that deletes a result deletes them (dur_field) too. They are
-- records one after another, as broker.EncodeSteps writes them: kind (1),
-- name length (2) and name, started ms (6), finished ms (6), data length (4)
-- and data.
--
-- Every key a script touches is one of its KEYS, all in one partition's hash
-- slot, so that Redis Cluster refuses the whole call (TRYAGAIN, ASK) while
-- the slot migrates instead of failing halfway through it.

local function rec_ok(rec)
  return rec and #rec >= 24 and string.byte(rec, 1) == 2
end

-- rec_absent reports that no task is here: no record, or only the
-- placeholder a repartition writes where a task is about to move in.
local function rec_absent(rec) return not rec or rec == '\0mv' end

local function rec_state(rec) return string.byte(rec, 2) % 8 end
local function rec_canceled(rec) return string.byte(rec, 2) >= 128 end
-- rec_flow: bit 5, a step of a workflow or batch (broker.FlowHeader).
local function rec_flow(rec) return string.byte(rec, 2) % 64 >= 32 end
-- rec_internal: bit 4, a task the broker stored itself with a settlement
-- (settle.lua: a workflow follow-up or a notification). Only settle.lua sets
-- it; records that Go encodes never have it, so no enqueue can forge it.
local function rec_internal(rec) return string.byte(rec, 2) % 32 >= 16 end
-- rec_mark_internal returns rec with the internal flag set.
local function rec_mark_internal(rec)
  if rec_internal(rec) then return rec end
  return string.sub(rec, 1, 1) .. string.char(string.byte(rec, 2) + 16) .. string.sub(rec, 3)
end
-- rec_followed: bit 3, someone follows the task's end: its workflow or
-- batch, or a NotifyURL (their headers are in the body; fu_end below).
local function rec_followed(rec) return string.byte(rec, 2) % 16 >= 8 end
-- rec_moving: bit 6, set while a repartition moves the task out.
local function rec_moving(rec) return string.byte(rec, 2) % 128 >= 64 end
local function rec_token(rec) return struct.unpack('>I8', rec, 3) end
local function rec_retried(rec) return struct.unpack('>I2', rec, 11) end
local function rec_maxretry(rec) return struct.unpack('>I2', rec, 13) end
-- rec_end is the offset of the last byte before the failure section.
local function rec_end(rec)
  return 24 + struct.unpack('>I3', rec, 21) + string.byte(rec, 24)
end

-- own_conflict is the code of a broker-chosen ID whose HSETNX found record
-- cur: '0' when cur is rec itself (same body; the header may have moved on),
-- stored by an earlier run of this request, else '3' (another task: the
-- broker draws again).
local function own_conflict(cur, rec)
  if rec_ok(cur) and string.sub(cur, 25, rec_end(cur)) == string.sub(rec, 25, rec_end(rec)) then return '0' end
  return '3'
end

local function rec_uniq(rec)
  local ul = string.byte(rec, 24)
  if ul == 0 then return nil end
  local e = rec_end(rec)
  return string.sub(rec, e - ul + 1, e)
end

-- rec_patch returns rec with the given fields replaced; nil keeps a field.
-- A new state clears the cancel flag and keeps the followed, internal and
-- flow flags. failed and err replace the failure
-- section together (either may be nil to keep its part).
local function rec_patch(rec, state, token, retried, due, failed, err)
  local st = state and string.char(state + string.byte(rec, 2) % 64 - string.byte(rec, 2) % 8) or string.sub(rec, 2, 2)
  local tk = token and struct.pack('>I8', token) or string.sub(rec, 3, 10)
  local rt = retried and struct.pack('>I2', math.min(retried, 65535)) or string.sub(rec, 11, 12)
  local du = due and struct.pack('>I6', due) or string.sub(rec, 15, 20)
  local e = rec_end(rec)
  local tail = string.sub(rec, e + 1)
  if failed or err then
    local old_at, old_err = struct.pack('>I6', 0), ''
    if #tail >= 6 then old_at, old_err = string.sub(tail, 1, 6), string.sub(tail, 7) end
    tail = (failed and struct.pack('>I6', failed) or old_at) .. (err or old_err)
  end
  return string.sub(rec, 1, 1) .. st .. tk .. rt .. string.sub(rec, 13, 14) .. du .. string.sub(rec, 21, e) .. tail
end

-- rec_mark_canceled returns rec with the cancel flag set.
local function rec_mark_canceled(rec)
  return string.sub(rec, 1, 1) .. string.char(string.byte(rec, 2) % 128 + 128) .. string.sub(rec, 3)
end

-- rec_corrupt builds a valid archived record with an empty body for bytes that
-- could not be parsed; the bytes themselves are kept as the task's result.
local function rec_corrupt(now, err)
  return string.char(2, 5) .. struct.pack('>I8>I2>I2>I6>I3B', 0, 0, 0, now, 0, 0) .. struct.pack('>I6', now) .. err
end

-- uvarint is n (a whole number below 2^53) as a varint, as Go's
-- binary.AppendUvarint writes it.
local function uvarint(n)
  local out = {}
  while n >= 128 do
    out[#out + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  out[#out + 1] = string.char(n)
  return table.concat(out)
end

-- rec_new returns the record of a new pending internal task of type typ
-- with payload and max retry mr, due and enqueued at now (ms), as
-- internal/codec encodes one (its tests compare the two).
local function rec_new(typ, payload, mr, now)
  local body = uvarint(#typ) .. typ .. uvarint(#payload) .. payload .. '\0' .. uvarint(2 * now)
  return string.char(2, 1 + 16) .. struct.pack('>I8>I2>I2>I6>I3B', 0, 0, mr, now, #body, 0) .. body
end

-- redis_now is the Redis server's clock in ms: the one clock due times,
-- leases and retention are decided with.
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- time_arg reads a time argument in ms: '+<d>' is d ms from now on the
-- Redis clock (a delay the caller measured; its own clock may be off),
-- anything else the time itself.
local function time_arg(a)
  if string.byte(a, 1) == 43 then return redis_now() + tonumber(string.sub(a, 2)) end
  return tonumber(a)
end

-- layout_error returns an error reply when the partition's recorded layout
-- (its meta key) is not the one the caller routed with, else nil: a process
-- configured with another partition count must not touch the partition.
local function layout_error(meta, want)
  local got = redis.call('GET', meta)
  if got ~= want then
    return redis.error_reply('TIDELAYOUT ' .. (got or 'none'))
  end
  return nil
end

-- req_pack returns the form in which a reply is kept in a reply cache: a
-- reply of more than three '0' codes (every task stored, every settlement
-- applied) as '#' and their count, so that entries stay short. A reply cache
-- holds the replies of at most fifty requests (the broker names a new one
-- after that), and Redis keeps a hash of that few short entries as one
-- compact list (hash-max-listpack-entries 128, hash-max-listpack-value 64 by
-- default), at about a third of the memory of a larger one.
local function req_pack(reply)
  if #reply > 3 and not string.find(reply, '[^0]') then
    return '#' .. #reply
  end
  return reply
end

-- req_unpack turns a kept reply back into the reply.
local function req_unpack(v)
  if string.byte(v, 1) == 35 then -- '#'
    return string.rep('0', tonumber(string.sub(v, 2)))
  end
  return v
end

-- req_get returns the reply an earlier run of request rid stored in the
-- reply cache (a hash that expires on its own), or nil. A re-sent request
-- answers with it and changes nothing but the cache's expiry, set again to
-- the same value: a write that WAIT counts, so that a re-sent request's WAIT
-- waits for the replicas to have what the first run wrote.
local function req_get(cache, rid, expire_at)
  if rid == '' then return nil end
  local r = redis.call('HGET', cache, rid)
  if not r then return nil end
  redis.call('PEXPIREAT', cache, expire_at)
  return req_unpack(r)
end

local function req_put(cache, rid, reply, expire_at)
  if rid == '' then return end
  redis.call('HSET', cache, rid, req_pack(reply))
  redis.call('PEXPIREAT', cache, expire_at)
end

-- call_many runs command cmd on key once for the arguments in list xs
-- (members, or pairs such as score and member when step is 2), in chunks of
-- a thousand members: one command for a whole batch costs a fraction of one
-- a member, and Lua's unpack takes a few thousand values at most. It returns
-- the last chunk's reply (nil for an empty xs).
local function call_many(cmd, key, xs, step)
  local n, r = 1000 * step, nil
  for i = 1, #xs, n do
    r = redis.call(cmd, key, unpack(xs, i, math.min(i + n - 1, #xs)))
  end
  return r
end

-- hget_many returns the values of fields xs of hash key, in order (false
-- for a field absent), read with one HMGET per thousand fields: a
-- redis.call costs Lua about as much again as the command, so a batch reads
-- its tasks' records with one call, not one each.
local function hget_many(key, xs)
  local out = {}
  for i = 1, #xs, 1000 do
    local vs = redis.call('HMGET', key, unpack(xs, i, math.min(i + 999, #xs)))
    for j = 1, #vs do out[i + j - 1] = vs[j] end
  end
  return out
end

-- next_tokens reserves n fencing tokens from the partition's sequence and
-- returns the first. Tokens grow with Redis time in microseconds, so they
-- never repeat, also not across the partitions of a new layout.
local function next_tokens(seq, n)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local first = math.max(tonumber(redis.call('GET', seq) or '0') + 1, now_us)
  redis.call('SET', seq, string.format('%d', first + n - 1))
  return first
end

-- uniq_take takes the unique lock u (field of the locks hash) for id until
-- expire_at (ms; held through that millisecond, so never released early
-- however the milliseconds fall) unless another live holder has it; it
-- reports success.
local function uniq_take(locks, u, id, now, expire_at)
  local cur = redis.call('HGET', locks, u)
  if cur then
    local sep = string.find(cur, ':', 1, true)
    if sep and tonumber(string.sub(cur, 1, sep - 1)) >= now and string.sub(cur, sep + 1) ~= id then
      return false
    end
  end
  redis.call('HSET', locks, u, string.format('%d', expire_at) .. ':' .. id)
  return true
end

-- release_uniq drops rec's unique lock if id still holds it.
local function release_uniq(rec, locks, id)
  local u = rec_uniq(rec)
  if u then
    local cur = redis.call('HGET', locks, u)
    if cur then
      local sep = string.find(cur, ':', 1, true)
      if sep and string.sub(cur, sep + 1) == id then redis.call('HDEL', locks, u) end
    end
  end
end

-- earliest returns the lowest score of the scheduled and retry sets, or nil.
local function earliest(sched, retry)
  local best
  for _, z in ipairs({sched, retry}) do
    local r = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    if r[2] then
      local s = tonumber(r[2])
      if not best or s < best then best = s end
    end
  end
  return best
end

-- count_day adds to the partition's day counters: fields p:<day> and f:<day>
-- of the stats hash (Maintain drops days older than 90).
local function count_day(stats, day, processed, failed)
  if processed > 0 then redis.call('HINCRBY', stats, 'p:' .. day, processed) end
  if failed > 0 then redis.call('HINCRBY', stats, 'f:' .. day, failed) end
end

-- dur_field is the results hash's field of task id's durable records.
local function dur_field(id) return '\0' .. id end

-- leased_again returns, for a lease request run again whose first run kept
-- cached ("<lease expiry>:<first token>:<count>"), the flat array id1,
-- record1, id2, ... of the tasks that run leased: those in the active zset
-- at exactly that expiry (no one else has their tokens to extend them) whose
-- token is in its range, in token order. Those since recovered or leased
-- again are not returned.
local function leased_again(active, records, cached)
  local exp, first, n = string.match(cached, '^(%d+):(%d+):(%d+)$')
  local found, out = {}, {}
  if exp then
    first, n = tonumber(first), tonumber(n)
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', active, exp, exp)) do
      local rec = redis.call('HGET', records, id)
      if rec_ok(rec) and rec_state(rec) == 2 then
        local tk = rec_token(rec)
        if tk >= first and tk < first + n then
          found[#found + 1] = {tk, id, rec}
        end
      end
    end
  end
  table.sort(found, function(a, b) return a[1] < b[1] end)
  for _, f in ipairs(found) do
    out[#out + 1] = f[2]
    out[#out + 1] = f[3]
  end
  return out
end

-- dur_with returns the flat array id1, record1, id2, record2, ... as id1,
-- record1, records1, id2, ...: each task's durable records ('' for none)
-- after its record, read with an HMGET of the results hash per thousand
-- tasks (a leased task's records go with its lease: broker.Delivery.Steps).
local function dur_with(results, pairs)
  local out = {}
  for from = 1, #pairs, 2000 do
    local to = math.min(from + 1999, #pairs)
    local fs = {}
    for i = from, to, 2 do fs[#fs + 1] = dur_field(pairs[i]) end
    local ds = redis.call('HMGET', results, unpack(fs))
    for j = 1, #fs do
      local i = from + 2 * (j - 1)
      out[#out + 1] = pairs[i]
      out[#out + 1] = pairs[i + 1]
      out[#out + 1] = ds[j] or ''
    end
  end
  return out
end

-- dur_find returns where the record of kind k named name starts and ends in
-- the durable records d, or nil.
local function dur_find(d, k, name)
  local pos = 1
  while pos + 18 <= #d do
    local nl = struct.unpack('>I2', d, pos + 1)
    local e = pos + 18 + nl + struct.unpack('>I4', d, pos + 15 + nl)
    if string.sub(d, pos, pos) == k and string.sub(d, pos + 3, pos + 2 + nl) == name then return pos, e end
    pos = e + 1
  end
  return nil
end

-- dur_count returns how many records the durable records d hold.
local function dur_count(d)
  local pos, n = 1, 0
  while pos + 18 <= #d do
    local nl = struct.unpack('>I2', d, pos + 1)
    pos = pos + 19 + nl + struct.unpack('>I4', d, pos + 15 + nl)
    n = n + 1
  end
  return n
end

-- dur_rec returns a record of kind k named name, started and finished at
-- the given ms, holding data.
local function dur_rec(k, name, started, finished, data)
  return k .. struct.pack('>I2', #name) .. name .. struct.pack('>I6>I6>I4', started, finished, #data) .. data
end

-- dur_finished returns the finished ms of the record at s of d.
local function dur_finished(d, s)
  return struct.unpack('>I6', d, s + 9 + struct.unpack('>I2', d, s + 1))
end

-- dur_name returns the name of the record at s of d.
local function dur_name(d, s)
  return string.sub(d, s + 3, s + 2 + struct.unpack('>I2', d, s + 1))
end

-- dur_set_finished returns d with the finished ms of the record at s set to ms.
local function dur_set_finished(d, s, ms)
  local off = s + 9 + struct.unpack('>I2', d, s + 1)
  return string.sub(d, 1, off - 1) .. struct.pack('>I6', ms) .. string.sub(d, off + 6)
end

-- dur_park returns d with its parked record ('p': what the task waits for,
-- and until when) replaced by one for wait, until at (ms).
local function dur_park(d, wait, at)
  local pos = 1
  while pos + 18 <= #d do
    local nl = struct.unpack('>I2', d, pos + 1)
    local stop = pos + 18 + nl + struct.unpack('>I4', d, pos + 15 + nl)
    if string.sub(d, pos, pos) == 'p' then
      d = string.sub(d, 1, pos - 1) .. string.sub(d, stop + 1)
      break
    end
    pos = stop + 1
  end
  return d .. dur_rec('p', wait, 0, at, '')
end

-- dur_wake_now ends the wait of a parked task now (an operator's run):
-- the deadline record of what it waits for (its 'p' record names it) is
-- set to now, so that a sleep replays as over and a signal wait as timed
-- out. results is the results hash.
local function dur_wake_now(results, id, now)
  local f = dur_field(id)
  local d = redis.call('HGET', results, f)
  if not d then return end
  local pos = 1
  while pos + 18 <= #d do
    local nl = struct.unpack('>I2', d, pos + 1)
    local stop = pos + 18 + nl + struct.unpack('>I4', d, pos + 15 + nl)
    if string.sub(d, pos, pos) == 'p' then
      local w = dur_name(d, pos)
      local k, name = 'z', string.sub(w, 7)
      if string.sub(w, 1, 7) == 'signal:' then k, name = 'd', string.sub(w, 8) end
      local s = dur_find(d, k, name)
      if s and dur_finished(d, s) > now then redis.call('HSET', results, f, dur_set_finished(d, s, now)) end
      return
    end
    pos = stop + 1
  end
end

-- drop deletes the tasks ids of sorted set z with their records, results,
-- attempt histories and progress (hash pg); G (groups.lua's keys, or nil
-- when the partition has no grouped task) loses what it keeps of them.
local function drop(z, ids, records, results, hist, G, pg)
  for _, id in ipairs(ids) do
    redis.call('ZREM', z, id)
    redis.call('HDEL', records, id)
    redis.call('HDEL', results, id, dur_field(id))
    redis.call('HDEL', hist, id)
    redis.call('HDEL', pg, id)
    if G then g_forget(G, id) end
  end
  return #ids
end

-- trim deletes up to limit completed tasks past their retention and archived
-- tasks past the archive's age or size; it returns how many it deleted and
-- whether it stopped at the limit. G and pg are as for drop.
local function trim(completed, archived, records, results, hist, now, max_archived, archive_ttl, limit, G, pg)
  local n = drop(completed, redis.call('ZRANGEBYSCORE', completed, '-inf', now, 'LIMIT', 0, limit), records, results, hist, G, pg)
  if n < limit then
    n = n + drop(archived, redis.call('ZRANGEBYSCORE', archived, '-inf', now - archive_ttl, 'LIMIT', 0, limit - n), records, results, hist, G, pg)
  end
  if n < limit then
    local excess = redis.call('ZCARD', archived) - max_archived
    if excess > 0 then
      n = n + drop(archived, redis.call('ZRANGE', archived, 0, math.min(excess, limit - n) - 1), records, results, hist, G, pg)
    end
  end
  return n, n >= limit
end

-- hist_add appends an attempt to task id's history (field id of the hash
-- hist), keeping the latest 10. An entry is: started ms (6 bytes), ended ms
-- (6), outcome (1: r retry, a archive, d done, l lease expired, w deferred), server
-- length (1) and server, error length (2) and error (at most 1 KiB).
local function hist_add(hist, id, started, ended, outcome, server, err)
  server = string.sub(server or '', 1, 255)
  err = string.sub(err or '', 1, 1024)
  local entry = struct.pack('>I6>I6', started, ended) .. outcome .. string.char(#server) .. server .. struct.pack('>I2', #err) .. err
  local cur = redis.call('HGET', hist, id) or ''
  local starts, pos = {}, 1
  while pos + 15 <= #cur do
    starts[#starts + 1] = pos
    local sl = string.byte(cur, pos + 13)
    local el = struct.unpack('>I2', cur, pos + 14 + sl)
    pos = pos + 16 + sl + el
  end
  if #starts >= 10 then cur = string.sub(cur, starts[#starts - 8]) end
  redis.call('HSET', hist, id, cur .. entry)
end

-- w_keys reads the block of three keys a script that ends tasks takes for
-- the tasks someone waits for (Broker.Wait, wait.lua): w the waiters hash
-- (task ID -> registration expiry ms), o the outcomes hash (task ID -> how
-- it ended), x when each outcome expires (zset, ms). W is nil when no task
-- of the partition is waited for and no outcome is kept.
local function w_keys(i)
  if redis.call('EXISTS', KEYS[i], KEYS[i + 1]) == 0 then return nil end
  return {w = KEYS[i], o = KEYS[i + 1], x = KEYS[i + 2]}
end

-- w_ended records how task id ended when someone waits for it and tells
-- the waiters ("f<id>" on channel): outcome is 'd<ms>' succeeded and
-- deleted, 'c<ms>' completed, 'a<ms>' archived, 'x' deleted or cancelled.
-- Outcomes are kept ten minutes (the oldest dropped as new ones come), for
-- a waiter that looks after the record is gone. A task nobody waits for
-- drops the outcome kept from an earlier task with its ID, which would
-- otherwise answer for this one once its record is gone.
local function w_ended(W, id, outcome, now, channel)
  if not W then return end
  if not redis.call('HGET', W.w, id) then
    redis.call('HDEL', W.o, id)
    return
  end
  redis.call('HDEL', W.w, id)
  redis.call('HSET', W.o, id, outcome)
  redis.call('ZADD', W.x, now + 600000, id)
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', W.x, '-inf', now, 'LIMIT', 0, 10)) do
    redis.call('HDEL', W.o, old)
    redis.call('ZREM', W.x, old)
  end
  redis.call('PUBLISH', channel, 'f' .. id)
end

-- count_minute adds to the partition's minute counters (field p:<minute>
-- and f:<minute> of the minute hash) for the live view.
local function count_minute(minutes, minute, processed, failed)
  if processed > 0 then redis.call('HINCRBY', minutes, 'p:' .. minute, processed) end
  if failed > 0 then redis.call('HINCRBY', minutes, 'f:' .. minute, failed) end
end

-- zset_of names the sorted set holding tasks in state st (nil for pending
-- and active, which live elsewhere; waiting tasks lie in the retry zset); keys are the admin scripts' KEYS.
local function zset_of(st, keys)
  if st == 3 then return keys[3] elseif st == 4 or st == 7 then return keys[4]
  elseif st == 5 then return keys[5] elseif st == 6 then return keys[6] end
  return nil
end

-- ev_new returns the event log of one script run for the partition's events
-- stream key (see events.go): nil when events are off (max '' or '0'),
-- else a table collecting events until ev_flush writes them, trimmed to
-- about max entries (MAXLEN ~).
local function ev_new(key, max)
  if max == '' or max == '0' then return nil end
  return {key = key, max = max, b = {}, n = 0}
end

-- ev_flush writes the collected events as one stream entry with ID
-- 0-<n>, n counting the stream's entries from 1 ('0-*': Redis 7), so that a
-- reader tells a trimmed entry from one that never was. Field 'e', value
-- '\1', the Redis time in ms (6 bytes), then per event a kind byte, the
-- lengths of ID, type and error (2 bytes each) and the three strings.
local function ev_flush(E)
  if not E or E.n == 0 then return end
  redis.call('XADD', E.key, 'MAXLEN', '~', E.max, '0-*', 'e', '\1' .. struct.pack('>I6', redis_now()) .. table.concat(E.b))
  E.b, E.n = {}, 0
end

-- ev_trim_age deletes the entries of events stream key recorded before
-- cutoff (ms): the entries' numbers are consecutive, so a binary search
-- over them finds the first one to keep in a few reads.
local function ev_trim_age(key, cutoff)
  local first = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
  if not first or struct.unpack('>I6', first[2][2], 2) >= cutoff then return end
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  local lo = tonumber(string.sub(first[1], 3)) -- an old one
  local hi = tonumber(string.sub(last[1], 3)) + 1 -- the first to keep is at most this
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    local e = redis.call('XRANGE', key, '0-' .. mid, '+', 'COUNT', 1)[1]
    if e and struct.unpack('>I6', e[2][2], 2) < cutoff then
      lo = tonumber(string.sub(e[1], 3))
    else
      hi = mid
    end
  end
  redis.call('XTRIM', key, 'MINID', '0-' .. hi)
end

-- ev_add records one event of task id (of type typ): kind is 'e' enqueued,
-- 's' started, 'd' succeeded, 'f' failed, 'r' retrying, 'a' archived,
-- 'x' deleted, 'c' cancelled; err (or nil) is cut to 256 bytes. An entry
-- holds at most 64 events; the script calls ev_flush at its end.
local function ev_add(E, kind, id, typ, err)
  if not E then return end
  err = err or ''
  if #err > 256 then err = string.sub(err, 1, 256) end
  if #typ > 1024 then typ = string.sub(typ, 1, 1024) end
  if #id > 65535 then id = string.sub(id, 1, 65535) end
  E.b[#E.b + 1] = kind .. struct.pack('>I2>I2>I2', #id, #typ, #err) .. id .. typ .. err
  E.n = E.n + 1
  if E.n >= 64 then ev_flush(E) end
end

-- rec_type returns the task type of record rec (the start of its body: a
-- uvarint length and the bytes), or '' when rec cannot be read.
local function rec_type(rec)
  if not rec_ok(rec) then return '' end
  local n, mul, pos = 0, 1, 25
  while true do
    local c = string.byte(rec, pos)
    if not c then return '' end
    n = n + (c % 128) * mul
    pos = pos + 1
    if c < 128 then break end
    mul = mul * 128
  end
  return string.sub(rec, pos, pos + n - 1)
end

-- rec_flowfu: a workflow follow-up (an internal tide:flow task): tide's
-- own bookkeeping, which operators cannot delete, cancel or archive.
local function rec_flowfu(rec) return rec_ok(rec) and rec_internal(rec) and rec_type(rec) == 'tide:flow' end

-- rec_follow reads, from the body of rec (internal/codec: type and payload
-- length-prefixed, a flags byte, enqueued-at, then with flag 1 the headers,
-- a count and length-prefixed names and values), the headers that name who
-- follows the task: its flow, its step and its NotifyURL ('' each when
-- absent, or when the body cannot be read).
local function rec_follow(rec)
  local pos, stop = 25, rec_end(rec)
  local function uv()
    local n, mul = 0, 1
    while pos <= stop do
      local c = string.byte(rec, pos)
      pos = pos + 1
      n = n + (c % 128) * mul
      if c < 128 then return n end
      mul = mul * 128
    end
    return nil
  end
  local out = {}
  local l = uv()
  if not l then return '', '', '' end
  pos = pos + l
  l = uv()
  if not l then return '', '', '' end
  pos = pos + l
  local flags = string.byte(rec, pos)
  pos = pos + 1
  if not flags or flags % 2 == 0 or not uv() then return '', '', '' end
  local n = uv() or 0
  for _ = 1, n do
    l = uv()
    if not l then break end
    local k = string.sub(rec, pos, pos + l - 1)
    pos = pos + l
    l = uv()
    if not l then break end
    out[k] = string.sub(rec, pos, pos + l - 1)
    pos = pos + l
  end
  return out['tide-flow'] or '', out['tide-step'] or '', out['tide-notify-url'] or ''
end

-- fu_end records that task id, whose record is rec, ended (outcome 'c'
-- completed or 'a' archived, at ms, with err) for whoever follows it
-- (broker/followup.go): when rec_followed, it stores the follow-up, an
-- internal pending task of type tide:flow (broker.FlowType, 50 retries)
-- for a workflow step or batch task, else tide:notify (broker.NotifyType,
-- 10 retries), whose payload is the broker.Ending. F names the keys: F.t
-- the records hash, F.p the pending list, and F.tag a hash tag whose
-- partition is this one: the follow-up's ID is "tide:f{<tag>}:<id>" (then
-- "#2", "#3", ... while an earlier follow-up of the ID is still there).
-- Only the step that ends the task calls it, so a task's end is recorded
-- once (a NotifyURL task run again notifies again). It returns true when
-- it stored a follow-up (the pending list grew).
local function fu_end(F, E, id, rec, outcome, at, err, now)
  if not rec_followed(rec) then return false end
  local flow, step, url = rec_follow(rec)
  if flow == '' and url == '' then return false end
  local typ, mr = 'tide:notify', 10
  if flow ~= '' then typ, mr = 'tide:flow', 50 end
  local payload = 'f1\n' .. flow .. '\n' .. step .. '\n' .. url .. '\n' .. id .. '\n' .. rec_type(rec) .. '\n' ..
    outcome .. '\n' .. string.format('%d', at) .. '\n' .. string.format('%d', rec_retried(rec)) .. '\n' .. (err or '')
  local frec = rec_new(typ, payload, mr, now)
  local fid, k = 'tide:f{' .. F.tag .. '}:' .. id, 1
  while redis.call('HSETNX', F.t, fid, frec) == 0 do
    k = k + 1
    fid = 'tide:f{' .. F.tag .. '}:' .. id .. '#' .. k
  end
  redis.call('LPUSH', F.p, fid)
  if E then ev_add(E, 'e', fid, typ) end
  return true
end
