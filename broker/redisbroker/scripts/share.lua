-- share.lua: set one partition's shares of its queue's limits.
-- KEYS[1] limits hash of the partition (v: version, c: concurrency share,
--         r: rate share, per: rate period ms, w: last announced rate wake-up)
-- KEYS[2] pending list  KEYS[3] active zset  KEYS[4] layout meta
-- KEYS[5] starts zset (start ms of the tasks started in the last period)
-- ARGV[1] layout  ARGV[2] version of the queue's limits the shares come from
-- ARGV[3] concurrency share ('' for no limit)  ARGV[4] event channel
-- ARGV[5] partition  ARGV[6] rate share ('' for no limit)  ARGV[7] period ms
-- then pairs of member, start ms: starts made elsewhere (the old partitions
-- of a repartition) that count against this partition's rate share.
-- Returns 1 when the shares were written, 0 when the partition holds shares
-- of newer limits (left as they are) or a repartition has retired it.
-- Dequeue hands out a task only while the partition's active tasks are fewer
-- than its concurrency share and its starts in the last period fewer than
-- its rate share. When the shares leave room for tasks that wait, idle
-- servers are woken ("p" event).
if redis.call('GET', KEYS[4]) == 'retired' then return 0 end
local bad = layout_error(KEYS[4], ARGV[1])
if bad then return bad end
local v = tonumber(ARGV[2])
local cur = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if cur > v then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2])
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 'c')
else
  redis.call('HSET', KEYS[1], 'c', ARGV[3])
end
if ARGV[6] == '' then
  redis.call('HDEL', KEYS[1], 'r', 'per', 'w')
else
  redis.call('HSET', KEYS[1], 'r', ARGV[6], 'per', ARGV[7])
  redis.call('HDEL', KEYS[1], 'w')
end
if #ARGV > 7 then
  for i = 8, #ARGV, 2 do
    redis.call('ZADD', KEYS[5], ARGV[i + 1], ARGV[i])
  end
  redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[7]))
end
if redis.call('LLEN', KEYS[2]) > 0 and (ARGV[3] == '' or redis.call('ZCARD', KEYS[3]) < tonumber(ARGV[3])) then
  redis.call('PUBLISH', ARGV[4], 'p' .. ARGV[5])
end
return 1
