-- settle.lua: apply the outcomes of leased tasks of one partition.
-- KEYS[1] records hash  KEYS[2] active zset  KEYS[3] pending list
-- KEYS[4] retry zset    KEYS[5] archived zset KEYS[6] completed zset
-- KEYS[7] results hash  KEYS[8] scheduled zset
-- ARGV[1] event channel ARGV[2] partition  ARGV[3] unique-lock key prefix
-- ARGV[4] today (UTC, YYYY-MM-DD) for the processed/failed day counters
-- then 6 per outcome: op, id, token, a, b, c where op is
--   'd' done:      a, b, c unused                      -> deleted
--   'c' completed: a = new record, b = expire-at ms    -> kept until b
--   'r' retry:     a = retry-at ms, b = failed-at ms, c = error
--   'a' archive:   b = failed-at ms, c = error
--   'q' requeue:   back to the front of pending, attempt not counted
-- Returns one code per outcome: 0 applied, 1 lease lost (nothing changed).
-- The unique lock is released by done, completed and archive. Done, retry and
-- archive count as processed today; retry and archive as failed.
local out = {}
local requeued, first_retry = 0, nil
local processed, failed = 0, 0
local before = earliest(KEYS[8], KEYS[4])
for i = 5, #ARGV, 6 do
  local op, id, tok, a, b, c = ARGV[i], ARGV[i+1], tonumber(ARGV[i+2]), ARGV[i+3], ARGV[i+4], ARGV[i+5]
  local rec = redis.call('HGET', KEYS[1], id)
  if not (rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tok) then
    out[#out + 1] = 1
  else
    redis.call('ZREM', KEYS[2], id)
    if op ~= 'q' then processed = processed + 1 end
    if op == 'r' or op == 'a' then failed = failed + 1 end
    if op == 'd' then
      release_uniq(rec, ARGV[3], id)
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[7], id)
    elseif op == 'c' then
      release_uniq(rec, ARGV[3], id)
      redis.call('HSET', KEYS[1], id, a)
      redis.call('ZADD', KEYS[6], tonumber(b), id)
    elseif op == 'r' then
      local at = tonumber(a)
      redis.call('HSET', KEYS[1], id, rec_patch(rec, 4, nil, rec_retried(rec) + 1, at, tonumber(b), c))
      redis.call('ZADD', KEYS[4], at, id)
      if not first_retry or at < first_retry then first_retry = at end
    elseif op == 'a' then
      release_uniq(rec, ARGV[3], id)
      redis.call('HSET', KEYS[1], id, rec_patch(rec, 5, nil, nil, nil, tonumber(b), c))
      redis.call('ZADD', KEYS[5], tonumber(b), id)
    else -- 'q'
      redis.call('HSET', KEYS[1], id, rec_patch(rec, 1, nil, nil, nil, nil, nil))
      redis.call('RPUSH', KEYS[3], id)
      requeued = requeued + 1
    end
    out[#out + 1] = 0
  end
end
count_day(KEYS[1], ARGV[4], processed, failed)
if requeued > 0 and redis.call('LLEN', KEYS[3]) == requeued then
  redis.call('PUBLISH', ARGV[1], 'p' .. ARGV[2])
end
if first_retry and (not before or first_retry < before) then
  redis.call('PUBLISH', ARGV[1], 's' .. ARGV[2] .. ':' .. string.format('%d', first_retry))
end
return out
