-- wait.lua: register a waiter for the end of a task, or tell that it ended.
-- KEYS[1] records hash  KEYS[2] waiters hash (task ID -> registration expiry ms)
-- KEYS[3] outcomes hash (task ID -> how a waited-for task ended)
-- KEYS[4] layout meta
-- ARGV[1] layout  ARGV[2] task ID  ARGV[3] how long the registration lasts (ms)
-- Returns {code, value}: 'e' and the record when the task is completed or
-- archived; 'o' and the outcome when it ended and its record is gone (see
-- w_ended in lib.lua); 'n' when there is no such task; 'w' when it has not
-- ended yet: the waiter is registered (until the expiry, renewed by every
-- call), so that the script that ends the task records the outcome and
-- announces it ("f<id>" on the queue's done channel).
local bad = layout_error(KEYS[4], ARGV[1])
if bad then return bad end
local id = ARGV[2]
local rec = redis.call('HGET', KEYS[1], id)
if rec_ok(rec) then
  local st = rec_state(rec)
  if st == 5 or st == 6 then return {'e', rec} end
elseif not rec then
  local o = redis.call('HGET', KEYS[3], id)
  if o then return {'o', o} end
  return {'n', ''}
end
local until_ = redis_now() + tonumber(ARGV[3])
local cur = tonumber(redis.call('HGET', KEYS[2], id) or '0')
if until_ > cur then redis.call('HSET', KEYS[2], id, string.format('%d', until_)) end
return {'w', ''}
