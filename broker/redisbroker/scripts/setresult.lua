-- setresult.lua: store the result of a leased task.
-- KEYS[1] records hash  KEYS[2] results hash  KEYS[3] layout meta
-- ARGV[1] layout  ARGV[2] id  ARGV[3] token  ARGV[4] data
-- Returns 0 stored, 1 lease lost, 3 no such task here (gone, or it may be in
-- the old span of a repartition). Running it twice stores the same data.
local bad = layout_error(KEYS[3], ARGV[1])
if bad then return bad end
local rec = redis.call('HGET', KEYS[1], ARGV[2])
if rec_absent(rec) then return 3 end
if not (rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tonumber(ARGV[3])) then
  return 1
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
return 0
