-- enqueue_one.lua: store one new plain pending task in one partition, the
-- commonest call (a single Enqueue) of enqueue_plain.lua, with fewer keys and
-- arguments: Redis turns each key and argument into a Lua string on every
-- call, and runs the helpers' definitions on every call, so the stored task
-- is reached with no helper defined (they are linked after the marker line
-- below, for the rarer paths).
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] layout meta
-- KEYS[4] reply cache
-- ARGV[1] layout  ARGV[2] request ID
-- ARGV[3] reply cache expiry (ms), negated when the caller saw it set (every
--   request of a cache sets the same expiry, so once is enough)
-- ARGV[4] event channel  ARGV[5] partition
-- ARGV[6] id  ARGV[7] record  ARGV[8] kind: 'p', or 'P' when the broker
--   chose the ID
-- Returns enqueue_plain.lua's reply for one task: '0' stored, '1' ID
-- conflict, '3' a broker-chosen ID met another task (the broker draws
-- again); a broker-chosen ID found holding this very record (same body) is
-- this request's own earlier run: '0'. Publishes "p<partition>" on the
-- event channel when the pending list was empty. The reply cache entry is
-- claimed first with '0' and written over only when the reply differs, as
-- in enqueue_plain.lua; a request run again answers from it.
local got = redis.call('GET', KEYS[3])
if got ~= ARGV[1] then return redis.error_reply('TIDELAYOUT ' .. (got or 'none')) end
local exp = tonumber(ARGV[3])
local set_exp = exp > 0
if not set_exp then exp = -exp end
local again = redis.call('HSETNX', KEYS[4], ARGV[2], '0') == 0
if not again then
  if set_exp then redis.call('PEXPIREAT', KEYS[4], exp) end
  if redis.call('HSETNX', KEYS[1], ARGV[6], ARGV[7]) == 1 then
    if redis.call('LPUSH', KEYS[2], ARGV[6]) == 1 then
      redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5]) -- the list was empty
    end
    return '0'
  end
end
--@helpers
if again then return req_get(KEYS[4], ARGV[2], exp) end
local code = '1'
if ARGV[8] == 'P' then code = own_conflict(redis.call('HGET', KEYS[1], ARGV[6]), ARGV[7]) end
if code ~= '0' then redis.call('HSET', KEYS[4], ARGV[2], code) end
return code
