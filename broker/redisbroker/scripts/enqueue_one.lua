-- enqueue_one.lua: store one new plain pending task in one partition, the
-- commonest call (a single Enqueue) of enqueue_plain.lua, with fewer keys and
-- arguments: Redis turns each key and argument into a Lua string on every
-- call, and runs the helpers' definitions on every call, so the stored task
-- is reached with no helper defined (they are linked after the marker line
-- below, for the rarer paths).
-- Its reply cache is a string of one byte a request (reply slots) rather
-- than a hash keyed by request ID: the request is named by the key and its
-- slot, which the broker hands out once each, and claiming a slot with
-- SETBIT costs the same whatever the other slots hold, where claiming a
-- hash entry scans the cache. Bits of a slot's byte, from the highest:
-- 0 claimed by a task with the caller's ID, 1 claimed by a task with an ID
-- the broker chose, 6 the reply was '3', 7 the reply was '1'; a claimed
-- slot with neither replied '0'.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] layout meta
-- KEYS[4] reply slots
-- ARGV[1] layout
-- ARGV[2] the bit that claims the request's slot: 8 × slot, plus 1 when
--   the broker chose the ID (kind 'P')
-- ARGV[3] reply slots' expiry (ms), negated when the caller saw it set
--   (every request of a key sets the same expiry, so once is enough)
-- ARGV[4] 'p<partition> <event channel>': what to publish, and where
-- ARGV[5] id  ARGV[6] record
-- Returns enqueue_plain.lua's reply for one task: '0' stored, '1' ID
-- conflict, '3' a broker-chosen ID met another task (the broker draws
-- again); a broker-chosen ID found holding this very record (same body) is
-- this request's own earlier run: '0'. Publishes "p<partition>" on the
-- event channel when the pending list was empty. A request run again
-- answers from its slot.
local call = redis.call
local got = call('GET', KEYS[3])
if got ~= ARGV[1] then return redis.error_reply('TIDELAYOUT ' .. (got or 'none')) end
-- Arguments go to Redis as the strings they came as: a Lua number is
-- turned back into a string with snprintf on every call.
local again = call('SETBIT', KEYS[4], ARGV[2], '1') == 1
if not again then
  if string.byte(ARGV[3], 1) ~= 45 then call('PEXPIREAT', KEYS[4], ARGV[3]) end -- not '-'
  if call('HSETNX', KEYS[1], ARGV[5], ARGV[6]) == 1 then
    if call('LPUSH', KEYS[2], ARGV[5]) == 1 then
      local sp = string.find(ARGV[4], ' ', 1, true) -- the list was empty
      call('PUBLISH', string.sub(ARGV[4], sp + 1), string.sub(ARGV[4], 1, sp - 1))
    end
    return '0'
  end
end
--@helpers
local bit = tonumber(ARGV[2])
local slot = (bit - bit % 8) / 8
if again then
  -- A write that WAIT counts (see req_get), with the same expiry.
  call('PEXPIREAT', KEYS[4], math.abs(tonumber(ARGV[3])))
  local b = string.byte(call('GETRANGE', KEYS[4], slot, slot))
  if b % 2 == 1 then return '1' end
  if b % 4 >= 2 then return '3' end
  return '0'
end
local code = '1'
if bit % 8 == 1 then -- the broker chose the ID
  code = own_conflict(call('HGET', KEYS[1], ARGV[5]), ARGV[6])
end
if code == '1' then
  call('SETBIT', KEYS[4], 8 * slot + 7, '1')
elseif code == '3' then
  call('SETBIT', KEYS[4], 8 * slot + 6, '1')
end
return code
