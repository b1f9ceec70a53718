-- settle_plain.lua: settle.lua for the commonest settlement, plain tasks
-- done and deleted ('d'; no retention, no group, no unique key, nobody
-- following their end), in a queue that records no events (the caller knows
-- all that), with 12 keys and 2 arguments a task rather than 26 and 9, and
-- no helper defined unless a request runs again (they are linked after the
-- marker line below): Redis turns each key and argument into a Lua string
-- and runs the helpers' definitions on every call.
-- KEYS[1] records hash  KEYS[2] active zset  KEYS[3] results hash
-- KEYS[4] attempt histories hash  KEYS[5] stats hash  KEYS[6] layout meta
-- KEYS[7] reply cache  KEYS[8] minute counters hash  KEYS[9] limits hash
-- KEYS[10] progress hash  KEYS[11] waiters hash  KEYS[12] outcomes hash
-- ARGV[1] layout  ARGV[2] request ID
-- ARGV[3] reply cache expiry (ms), negated when the caller saw it set
--   (every request of a cache sets the same expiry, so once is enough)
-- ARGV[4] today (UTC, YYYY-MM-DD)  ARGV[5] this minute (Unix minutes)
-- then 2 per settlement: id, token.
-- Returns settle.lua's reply for as many 'd' settlements, having done what
-- it does, when every task whose lease holds is neither followed (a
-- workflow step, a NotifyURL) nor holds a unique key, and the partition
-- holds no concurrency slots (field c of its limits hash) and nobody waits
-- for its tasks (waiters or outcomes kept): then settle.lua would delete
-- each such task with its result, durable records, history and progress,
-- count it processed today and this minute, and publish nothing, as this
-- does. Else it changes nothing and returns '*': the caller runs settle.lua
-- instead (with the same request ID, so a re-sent call of either answers
-- from the one reply cache). The records are all read before anything is
-- written, so an ID settled twice in one call is settled once ('3' the
-- second time, as in settle.lua). The reply cache entry is claimed with the
-- reply expected once the records are read; a request run again answers
-- from it. The record header is read in line (see rec_ok, rec_state,
-- rec_token, rec_followed and rec_uniq in lib.lua, and
-- TestPlainScriptsMatchLib).
local got = redis.call('GET', KEYS[6])
if got ~= ARGV[1] then return redis.error_reply('TIDELAYOUT ' .. (got or 'none')) end
local exp_at = tonumber(ARGV[3])
local set_exp = exp_at > 0
if not set_exp then exp_at = -exp_at end
local out, ids, gone, seen = {}, {}, {}, {}
local full = false
-- The records are read with one HMGET (a call settles at most maxPlain
-- tasks), as hget_many in lib.lua.
local want = {}
for i = 6, #ARGV, 2 do want[#want + 1] = ARGV[i] end
local rs = #want > 0 and redis.call('HMGET', KEYS[1], unpack(want)) or {}
for i = 6, #ARGV, 2 do
  local id = ARGV[i]
  local rec = rs[(i - 4) / 2]
  if not rec or rec == '\0mv' or seen[id] then
    out[#out + 1] = '3'
  elseif not (#rec >= 24 and string.byte(rec, 1) == 2 and string.byte(rec, 2) % 8 == 2 and struct.unpack('>I8', rec, 3) == tonumber(ARGV[i + 1])) then
    out[#out + 1] = '1'
  else
    if string.byte(rec, 2) % 16 >= 8 or string.byte(rec, 24) > 0 then
      full = true -- followed, or holding a unique key
      break
    end
    seen[id] = true
    out[#out + 1] = '0'
    ids[#ids + 1] = id
    gone[#gone + 1] = id
    gone[#gone + 1] = '\0' .. id -- its durable records
  end
end
-- Slots (settle.lua may wake servers) and waiters are rare: one command
-- each tells when neither is here.
local progress = false
if not full then full = redis.call('HGET', KEYS[9], 'c') ~= false end
if not full and #ids > 0 and redis.call('EXISTS', KEYS[10], KEYS[11], KEYS[12]) > 0 then
  progress = true
  full = redis.call('EXISTS', KEYS[11], KEYS[12]) > 0
end
local reply = table.concat(out)
local want = reply
if #want > 3 and not string.find(want, '[^0]') then want = '#' .. #want end
if not full and redis.call('HSETNX', KEYS[7], ARGV[2], want) == 1 then
  if set_exp then redis.call('PEXPIREAT', KEYS[7], exp_at) end
  if #ids > 0 then
    redis.call('HDEL', KEYS[1], unpack(ids))
    redis.call('ZREM', KEYS[2], unpack(ids))
    redis.call('HDEL', KEYS[3], unpack(gone))
    redis.call('HDEL', KEYS[4], unpack(gone))
    if progress then redis.call('HDEL', KEYS[10], unpack(ids)) end
    redis.call('HINCRBY', KEYS[5], 'p:' .. ARGV[4], #ids)
    redis.call('HINCRBY', KEYS[8], 'p:' .. ARGV[5], #ids)
  end
  return reply
end
--@helpers
-- Run again (the entry is there), or a settlement only settle.lua applies.
local cached = req_get(KEYS[7], ARGV[2], exp_at)
if cached then return cached end
return '*'
