-- enqueue.lua: store new tasks in one partition.
-- KEYS[1] records hash   KEYS[2] pending list   KEYS[3] scheduled zset
-- KEYS[4] retry zset
-- ARGV[1] event channel  ARGV[2] partition      ARGV[3] unique-lock key prefix
-- then 6 per task: id, record, kind ('p' pending | 's' scheduled), due ms,
--   unique key ('' for none), unique TTL ms
-- Returns one code per task: 0 stored, 1 ID conflict, 2 unique lock held.
-- Publishes "p<partition>" when the pending list was empty, and
-- "s<partition>:<ms>" when a new task is due before every other waiting one.
-- A pending task without a unique key costs two commands (HSETNX, LPUSH).
local out = {}
local was_empty, first_due, before = false, nil, nil
local looked = false
for i = 4, #ARGV, 6 do
  local id, rec, kind, u = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+4]
  local code = 0
  if redis.call('HSETNX', KEYS[1], id, rec) == 0 then
    code = 1
  elseif u ~= '' and not redis.call('SET', ARGV[3] .. u, id, 'NX', 'PX', ARGV[i+5]) then
    redis.call('HDEL', KEYS[1], id)
    code = 2
  elseif kind == 'p' then
    if redis.call('LPUSH', KEYS[2], id) == 1 then was_empty = true end
  else
    if not looked then
      before, looked = earliest(KEYS[3], KEYS[4]), true
    end
    local due = tonumber(ARGV[i+3])
    redis.call('ZADD', KEYS[3], due, id)
    if not first_due or due < first_due then first_due = due end
  end
  out[#out + 1] = code
end
if was_empty then
  redis.call('PUBLISH', ARGV[1], 'p' .. ARGV[2])
end
if first_due and (not before or first_due < before) then
  redis.call('PUBLISH', ARGV[1], 's' .. ARGV[2] .. ':' .. string.format('%d', first_due))
end
return out
