-- limits.lua: record a queue's limits and give them a new version.
-- KEYS[1] the limits hash (queue -> "<version>:<limits>")
-- KEYS[2] the queue's bank (slots.lua), in the limits hash's slot
-- ARGV[1] queue  ARGV[2] "<concurrency>:<rate>:<per ms>:<group concurrency>:
--         <group rate>:<group per ms>:<ordered 0|1>" (0: none)
-- Returns {version, concurrency era, rate era} ('' era: no such limit).
-- Each partition keeps the version its settings were computed from
-- (share.lua), so that settings from older limits never replace ones from
-- newer limits. The bank takes the change of each limit in the same step:
-- a raised limit adds its slots to the bank, a lowered one leaves the bank
-- in debt (the rebalance takes the slots back from the partitions); a limit
-- switched on starts a new era (this version) that holds the whole limit in
-- the bank, and a limit switched off ends its era.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local v = 0
local was = {0, 0}
if cur then
  v = tonumber(string.match(cur, '^(%d+):')) or 0
  local f = {}
  for x in string.gmatch(cur, '[^:]+') do f[#f + 1] = tonumber(x) or 0 end
  was = {f[2] or 0, f[3] or 0}
end
v = v + 1
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', v) .. ':' .. ARGV[2])
local now = {}
for x in string.gmatch(ARGV[2], '[^:]+') do now[#now + 1] = tonumber(x) or 0 end
local eras = {}
for i, f in ipairs({{'c', 'ce'}, {'r', 're'}}) do
  local old, new = was[i], now[i]
  if new == 0 then
    redis.call('HDEL', KEYS[2], f[1], f[2])
    eras[i] = ''
  elseif old == 0 then
    redis.call('HSET', KEYS[2], f[1], new, f[2], v)
    eras[i] = tostring(v)
  else
    -- Slots recorded before the bank existed hold the old limit in the
    -- partitions, in era '0'.
    redis.call('HINCRBY', KEYS[2], f[1], new - old)
    eras[i] = redis.call('HGET', KEYS[2], f[2]) or '0'
  end
end
return {v, eras[1], eras[2]}
