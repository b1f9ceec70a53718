-- drop.lua: delete an empty queue partition's keys.
-- KEYS: 1 records hash  2 pending list  3 scheduled zset  4 retry zset
--   5 archived zset  6 completed zset  7 results hash  8 active zset
--   9 unique locks hash  10 moving zset  11 reserved set  12 layout meta
--   13 stats hash  14 token sequence  15 owner  16 paused flag
--   17 attempt histories hash  18 minute counters hash  19..24 group keys
--   25 progress hash  26..28 waiter keys  29 events stream
-- ARGV[1] layout  ARGV[2] '1' to keep what the queue's limits use: the
-- layout meta (the partition count stays) and the groups' held times, state
-- and rate windows (KEYS 21, 22, 24: throttles, group rate starts)
-- ARGV[3] '1' to keep the layout meta (a repartitioned queue keeps its
-- layout: see admin.go, DeleteQueue)
-- Returns the number of tasks the partition holds; 0 means it was empty and
-- its keys are gone (a later call on it registers the queue again).
local bad = layout_error(KEYS[12], ARGV[1])
if bad then return bad end
local n = redis.call('HLEN', KEYS[1]) + redis.call('ZCARD', KEYS[10])
if n > 0 then return n end
local keep = {}
if ARGV[2] == '1' then keep = {[12] = true, [21] = true, [22] = true, [24] = true} end
if ARGV[3] == '1' then keep[12] = true end
for k = 2, #KEYS do
  if not keep[k] then redis.call('DEL', KEYS[k]) end
end
return 0
