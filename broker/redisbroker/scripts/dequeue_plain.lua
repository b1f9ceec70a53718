-- dequeue_plain.lua: dequeue.lua for a partition without limits or groups
-- whose queue records no events (the caller knows that): the commonest
-- lease, with 14 keys and 7 arguments rather than 20 and 10, and no helper
-- defined unless a request runs again (they are linked after the marker
-- line below): Redis turns each key and argument into a Lua string and runs
-- the helpers' definitions on every call.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] active zset (lease expiry)
-- KEYS[4] paused flag   KEYS[5] scheduled zset KEYS[6] retry zset
-- KEYS[7] token sequence KEYS[8] layout meta KEYS[9] reply cache
-- KEYS[10] limits hash  KEYS[11] starts zset (token -> start ms)
-- KEYS[12] grouped task IDs (gid of groups.lua)  KEYS[13] archived zset
-- KEYS[14] results hash
-- ARGV[1] layout  ARGV[2] request ID
-- ARGV[3] reply cache expiry (ms), negated when the caller saw it set
--   (every request of a cache sets the same expiry, so once is enough)
-- ARGV[4] n  ARGV[5] lease ms
-- ARGV[6] how long starts are kept, ms (broker.MaxRatePer)
-- ARGV[7] how many starts are kept at most (broker.MaxQueueRate)
-- Returns what dequeue.lua returns (id, record, durable records, ...),
-- having done what it does, when the partition holds neither concurrency
-- slots nor a rate (fields c and r of its limits hash) nor grouped tasks;
-- then dequeue.lua would only pop
-- pending tasks (and due scheduled and retry ones), lease them, log their
-- starts and keep its reply, as this does, with the same commands. Else it
-- changes nothing and returns '*': the caller runs dequeue.lua instead (with
-- the same request ID, so a re-sent call of either answers from the one
-- reply cache). A request run again answers as dequeue.lua's does.
-- The record header is read and patched here in line (see rec_ok and
-- rec_patch in lib.lua, and TestPlainScriptsMatchLib).
local got = redis.call('GET', KEYS[8])
if got ~= ARGV[1] then return redis.error_reply('TIDELAYOUT ' .. (got or 'none')) end
local exp_at = tonumber(ARGV[3])
local set_exp = exp_at > 0
if not set_exp then exp_at = -exp_at end
local cached = redis.call('HGET', KEYS[9], ARGV[2])
if not cached then
  if redis.call('EXISTS', KEYS[4]) == 1 then return {} end
  local lim = redis.call('HMGET', KEYS[10], 'c', 'r')
  if lim[1] or lim[2] or redis.call('EXISTS', KEYS[12]) == 1 then return '*' end
  local n = tonumber(ARGV[4])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ids = redis.call('RPOP', KEYS[2], n) or {}
  if #ids < n then
    for _, z in ipairs({KEYS[5], KEYS[6]}) do
      local more = n - #ids
      if more <= 0 then break end
      local due = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, more)
      if #due > 0 then
        redis.call('ZREM', z, unpack(due))
        for _, id in ipairs(due) do ids[#ids + 1] = id end
      end
    end
  end
  if #ids == 0 then return {} end
  local exp = now + tonumber(ARGV[5])
  local exps, nows = string.format('%d', exp), string.format('%d', now)
  -- Fencing tokens, as next_tokens: one per task taken, above the last
  -- handed out and at least the Redis time in microseconds.
  local tok = math.max(tonumber(redis.call('GET', KEYS[7]) or '0') + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('SET', KEYS[7], string.format('%d', tok + #ids - 1))
  local first_tok = tok
  local out, recs, act, starts = {}, {}, {}, {}
  -- The records are read with one HMGET (n is at most maxPlain), as
  -- hget_many in lib.lua.
  local rs = redis.call('HMGET', KEYS[1], unpack(ids))
  for k, id in ipairs(ids) do
    local rec = rs[k]
    if rec and #rec >= 24 and string.byte(rec, 1) == 2 then
      -- Active, with the token; the cancel and moving flags cleared.
      local b = string.byte(rec, 2)
      rec = string.sub(rec, 1, 1) .. string.char(2 + b % 64 - b % 8) .. struct.pack('>I8', tok) .. string.sub(rec, 11)
      recs[#recs + 1] = id
      recs[#recs + 1] = rec
      act[#act + 1] = exps
      act[#act + 1] = id
      out[#out + 1] = id
      out[#out + 1] = rec
      starts[#starts + 1] = nows
      starts[#starts + 1] = string.format('%d', tok)
      tok = tok + 1
    elseif rec then
      -- Unreadable: archived with its bytes kept as the result (rec_corrupt).
      redis.call('HSET', KEYS[14], id, rec)
      local err = 'tide: undecodable task record (' .. #rec .. ' bytes, bad header); original bytes kept as the result'
      redis.call('HSET', KEYS[1], id, string.char(2, 5) .. struct.pack('>I8>I2>I2>I6>I3B', 0, 0, 0, now, 0, 0) .. struct.pack('>I6', now) .. err)
      redis.call('ZADD', KEYS[13], now, id)
    end
  end
  if #recs > 0 then
    redis.call('HSET', KEYS[1], unpack(recs))
    redis.call('ZADD', KEYS[3], unpack(act))
    redis.call('ZADD', KEYS[11], unpack(starts))
    local keep = tonumber(ARGV[6])
    redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now - keep)
    local over = redis.call('ZCARD', KEYS[11]) - tonumber(ARGV[7])
    if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[11], 0, over - 1) end
    redis.call('PEXPIRE', KEYS[11], keep)
  end
  redis.call('HSET', KEYS[9], ARGV[2], string.format('%d:%d:%d', exp, first_tok, #recs / 2))
  if set_exp then redis.call('PEXPIREAT', KEYS[9], exp_at) end
  if #out == 0 then return out end
  -- Each task's durable records after its record, as dur_with in lib.lua
  -- (n is at most maxPlain, so one HMGET).
  local fs = {}
  for i = 1, #out, 2 do fs[#fs + 1] = '\0' .. out[i] end
  local ds = redis.call('HMGET', KEYS[14], unpack(fs))
  local with = {}
  for j = 1, #fs do
    with[#with + 1] = out[2 * j - 1]
    with[#with + 1] = out[2 * j]
    with[#with + 1] = ds[j] or ''
  end
  return with
end
--@helpers
-- A request run again: as dequeue.lua's (see there), the tasks its first
-- run leased that are still leased to it.
redis.call('PEXPIREAT', KEYS[9], exp_at)
return dur_with(KEYS[14], leased_again(KEYS[3], KEYS[1], cached))
