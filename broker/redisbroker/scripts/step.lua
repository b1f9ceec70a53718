-- step.lua: the durable records of a leased task (broker.Durable).
-- KEYS[1] records hash  KEYS[2] results hash (durable records: dur_field)
-- KEYS[3] layout meta
-- ARGV[1] layout  ARGV[2] id  ARGV[3] token
-- ARGV[4] op: 'load' | 'save' | 'resolve'
-- ARGV[5] kind  ARGV[6] name ('save', 'resolve')
-- ARGV[7] the record to store ('save') or the wait's deadline ms ('resolve')
-- ARGV[8] max records  ARGV[9] max bytes
-- Returns {code, data}: code 0 done, 1 lease lost (nothing stored), 2 the
-- wait goes on ('resolve'), 3 no such task here (gone, or it may be in the
-- old span of a repartition), 4 over the bounds (nothing stored). With 0,
-- data is: for 'load' the task's records; for 'save' the stored record of
-- its kind and name (the first: a save run again, or a record stored
-- earlier, keeps what is there); for 'resolve' the signal's record ('s'
-- named name) when stored, else the time-out's ('t'), recorded now when
-- the deadline has come on the Redis clock. 'resolve' first stores the
-- wait's deadline record ('d' named name, finished at the deadline) when
-- none is, so that a wait's first reach costs one call; with 2, data is
-- that record (the first stored). Records are fenced: only the task's
-- current lease reads or writes them.
local bad = layout_error(KEYS[3], ARGV[1])
if bad then return bad end
local id = ARGV[2]
local rec = redis.call('HGET', KEYS[1], id)
if rec_absent(rec) then return {3, ''} end
if not (rec_ok(rec) and rec_state(rec) == 2 and rec_token(rec) == tonumber(ARGV[3])) then
  return {1, ''}
end
local f = dur_field(id)
local d = redis.call('HGET', KEYS[2], f) or ''
local op = ARGV[4]
if op == 'load' then return {0, d} end
local k, name = ARGV[5], ARGV[6]
if op == 'resolve' then
  local s, e = dur_find(d, 's', name)
  if not s then s, e = dur_find(d, 't', name) end
  if s then return {0, string.sub(d, s, e)} end
  local now = redis_now()
  local ws, we = dur_find(d, 'd', name)
  local w
  if ws then
    w = string.sub(d, ws, we)
  else
    w = dur_rec('d', name, now, tonumber(ARGV[7]), '')
    if dur_count(d) >= tonumber(ARGV[8]) or #d + #w > tonumber(ARGV[9]) then return {4, ''} end
    d = d .. w
    redis.call('HSET', KEYS[2], f, d)
  end
  if now < tonumber(ARGV[7]) then return {2, w} end
  local r = dur_rec('t', name, now, now, '')
  if dur_count(d) >= tonumber(ARGV[8]) then return {4, ''} end
  redis.call('HSET', KEYS[2], f, d .. r)
  return {0, r}
end
-- 'save'
local s, e = dur_find(d, k, name)
if s then return {0, string.sub(d, s, e)} end
local r = ARGV[7]
if dur_count(d) >= tonumber(ARGV[8]) or #d + #r > tonumber(ARGV[9]) then return {4, ''} end
redis.call('HSET', KEYS[2], f, d .. r)
return {0, r}
