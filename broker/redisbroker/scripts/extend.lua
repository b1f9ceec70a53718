-- extend.lua: renew leases of one partition.
-- KEYS[1] records hash  KEYS[2] active zset  KEYS[3] layout meta
-- ARGV[1] layout  ARGV[2] lease ms, then pairs: id, token
-- Returns a string of one code per lease: '0' renewed, '1' lease lost (token
-- stale), '2' renewed but the task was cancelled (the worker stops its
-- handler), '3' no such task here (gone, or it may be in the old span of a
-- repartition). Running it twice renews twice: the same answer.
local bad = layout_error(KEYS[3], ARGV[1])
if bad then return bad end
local exp = redis_now() + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local id, tok = ARGV[i], tonumber(ARGV[i+1])
  local rec = redis.call('HGET', KEYS[1], id)
  if rec_absent(rec) then
    out[#out + 1] = '3'
  elseif rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tok and redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], 'XX', exp, id)
    out[#out + 1] = rec_canceled(rec) and '2' or '0'
  else
    out[#out + 1] = '1'
  end
end
return table.concat(out)
