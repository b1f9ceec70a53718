-- extend.lua: renew leases of one partition.
-- KEYS[1] records hash  KEYS[2] active zset
-- ARGV[1] lease ms, then pairs: id, token
-- Returns one code per lease: 0 renewed, 1 lease lost (token stale or task gone).
local exp = redis_now() + tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local id, tok = ARGV[i], tonumber(ARGV[i+1])
  local rec = redis.call('HGET', KEYS[1], id)
  if rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tok and redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], 'XX', exp, id)
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
end
return out
