-- delete.lua: delete a task that is not active.
-- KEYS[1] records hash  KEYS[2] pending list  KEYS[3] scheduled zset
-- KEYS[4] retry zset    KEYS[5] archived zset KEYS[6] completed zset
-- KEYS[7] results hash  KEYS[8] active zset
-- ARGV[1] id  ARGV[2] unique-lock key prefix
-- Returns 1 deleted, 0 not found, 2 active (refused).
local id = ARGV[1]
local rec = redis.call('HGET', KEYS[1], id)
if not rec then return 0 end
if rec_ok(rec) then
  local st = rec_state(rec)
  if st == 2 then return 2 end
  if st == 1 then redis.call('LREM', KEYS[2], 1, id)
  elseif st == 3 then redis.call('ZREM', KEYS[3], id)
  elseif st == 4 then redis.call('ZREM', KEYS[4], id)
  elseif st == 5 then redis.call('ZREM', KEYS[5], id)
  elseif st == 6 then redis.call('ZREM', KEYS[6], id)
  end
  release_uniq(rec, ARGV[2], id)
else
  -- Unreadable record: remove every trace.
  if redis.call('ZSCORE', KEYS[8], id) then return 2 end
  redis.call('LREM', KEYS[2], 0, id)
  for k = 3, 6 do redis.call('ZREM', KEYS[k], id) end
end
redis.call('HDEL', KEYS[1], id)
redis.call('HDEL', KEYS[7], id)
return 1
