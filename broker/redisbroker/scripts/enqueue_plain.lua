-- enqueue_plain.lua: store new plain tasks in one partition, the common case
-- of enqueue.lua in four commands (asynq's enqueue takes four too): no
-- unique key, idempotency key, group, Replace or waiter, and no events
-- recorded for the queue.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] scheduled zset
-- KEYS[4] retry zset    KEYS[5] layout meta   KEYS[6] reply cache
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] event channel  ARGV[5] partition
-- ARGV[6] '1' to set the reply cache's expiry, '' when the caller saw it set
--   (every request of a cache sets the same expiry, so once is enough)
-- then 4 per task: id, record, kind, due ms. kind is 'p' (pending) or 's'
--   (scheduled), upper case when the broker chose the ID.
-- Returns a string of one code per task, as enqueue.lua: '0' stored, '1' ID
-- conflict, '3' a broker-chosen ID met another task (the broker draws
-- again). A broker-chosen ID found holding this very record (same body) is
-- this request's own earlier run: '0'. Publishes as enqueue.lua does.
-- The request claims its reply cache entry first, with the reply it expects
-- (every task stored), and writes the real reply over it only when that
-- differs: a request run again finds the entry and answers with it, changing
-- nothing but the cache's expiry (see req_get in lib.lua).
local bad = layout_error(KEYS[5], ARGV[1])
if bad then return bad end
local want = string.rep('0', (#ARGV - 6) / 4)
if redis.call('HSETNX', KEYS[6], ARGV[2], req_pack(want)) == 0 then
  return req_get(KEYS[6], ARGV[2], tonumber(ARGV[3]))
end
if ARGV[6] == '1' then redis.call('PEXPIREAT', KEYS[6], tonumber(ARGV[3])) end
local out = {}
local first_due = nil
-- The IDs to push and to schedule are written with one command each after
-- the loop (call_many).
local push, sched = {}, {}
for i = 7, #ARGV, 4 do
  local id, rec, kind = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local code = '0'
  if redis.call('HSETNX', KEYS[1], id, rec) == 0 then
    code = '1'
    if kind == 'P' or kind == 'S' then
      code = own_conflict(redis.call('HGET', KEYS[1], id), rec)
    end
  elseif kind == 'p' or kind == 'P' then
    push[#push + 1] = id
  else
    local due = tonumber(ARGV[i + 3])
    sched[#sched + 1] = due
    sched[#sched + 1] = id
    if not first_due or due < first_due then first_due = due end
  end
  out[#out + 1] = code
end
if call_many('LPUSH', KEYS[2], push, 1) == #push and #push > 0 then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5]) -- the list was empty
end
local before = nil
if first_due then before = earliest(KEYS[3], KEYS[4]) end
call_many('ZADD', KEYS[3], sched, 2)
if first_due and (not before or first_due < before) then
  redis.call('PUBLISH', ARGV[4], 's' .. ARGV[5] .. ':' .. string.format('%d', first_due))
end
local reply = table.concat(out)
if reply ~= want then redis.call('HSET', KEYS[6], ARGV[2], req_pack(reply)) end
return reply
