-- progress.lua: record the progress a leased task reports.
-- KEYS[1] records hash  KEYS[2] progress hash (task ID -> "<percent>:<ms>:<note>")
-- KEYS[3] layout meta
-- ARGV[1] layout  ARGV[2] task ID  ARGV[3] token  ARGV[4] progress
-- Returns 0 recorded, 1 lease lost (not active, or another token), 3 no such
-- task here. The progress stays with the task until its record is deleted.
-- Running it twice writes the same value twice.
local bad = layout_error(KEYS[3], ARGV[1])
if bad then return bad end
local rec = redis.call('HGET', KEYS[1], ARGV[2])
if rec_absent(rec) then return 3 end
if not (rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tonumber(ARGV[3])) then return 1 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
return 0
