-- setresult.lua: store the result of a leased task.
-- KEYS[1] records hash  KEYS[2] results hash
-- ARGV[1] id  ARGV[2] token  ARGV[3] data
-- Returns 0 stored, 1 lease lost.
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not (rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tonumber(ARGV[2])) then
  return 1
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 0
