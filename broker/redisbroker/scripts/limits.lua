-- limits.lua: record a queue's limits and give them a new version.
-- KEYS[1] the limits hash (queue -> "<version>:<limits>")
-- ARGV[1] queue  ARGV[2] "<concurrency>:<rate>:<per ms>:<group concurrency>:
--         <group rate>:<group per ms>:<ordered 0|1>" (0: none)
-- Returns the new version. Each partition keeps the version its shares were
-- computed from (share.lua), so that shares computed from older limits never
-- replace ones computed from newer limits.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local v = 0
if cur then v = tonumber(string.match(cur, '^(%d+):')) or 0 end
v = v + 1
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', v) .. ':' .. ARGV[2])
return v
