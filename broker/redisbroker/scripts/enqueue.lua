-- enqueue.lua: store new tasks in one partition.
-- KEYS[1] records hash   KEYS[2] pending list   KEYS[3] scheduled zset
-- KEYS[4] retry zset
-- ARGV[1] event channel  ARGV[2] partition      ARGV[3] unique-lock key prefix
-- then 6 per task: id, record, kind ('p' pending | 's' scheduled), due ms,
--   unique key ('' for none), unique TTL ms
-- Returns one code per task: 0 stored, 1 ID conflict, 2 unique lock held.
-- Publishes "p<partition>" when the pending list was empty, and
-- "s<partition>:<ms>" when a new task is due before every other waiting one.
local out = {}
local pushed, first_due = 0, nil
local before = earliest(KEYS[3], KEYS[4])
for i = 4, #ARGV, 6 do
  local id, rec, kind, due, u, uttl = ARGV[i], ARGV[i+1], ARGV[i+2], tonumber(ARGV[i+3]), ARGV[i+4], ARGV[i+5]
  local code = 0
  if redis.call('HEXISTS', KEYS[1], id) == 1 then
    code = 1
  elseif u ~= '' and not redis.call('SET', ARGV[3] .. u, id, 'NX', 'PX', uttl) then
    code = 2
  else
    redis.call('HSET', KEYS[1], id, rec)
    if kind == 'p' then
      redis.call('LPUSH', KEYS[2], id)
      pushed = pushed + 1
    else
      redis.call('ZADD', KEYS[3], due, id)
      if not first_due or due < first_due then first_due = due end
    end
  end
  out[#out + 1] = code
end
if pushed > 0 and redis.call('LLEN', KEYS[2]) == pushed then
  redis.call('PUBLISH', ARGV[1], 'p' .. ARGV[2])
end
if first_due and (not before or first_due < before) then
  redis.call('PUBLISH', ARGV[1], 's' .. ARGV[2] .. ':' .. string.format('%d', first_due))
end
return out
