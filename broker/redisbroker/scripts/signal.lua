-- signal.lua: deliver a signal to a task (broker.Durable.Signal).
-- KEYS[1] records hash  KEYS[2] results hash (durable records: dur_field)
-- KEYS[3] retry zset    KEYS[4] pending list  KEYS[5] layout meta
-- KEYS[6] reply cache   KEYS[7..12] group keys (groups.lua)
-- KEYS[13] events stream
-- ARGV[1] layout  ARGV[2] request ID  ARGV[3] reply cache expiry (ms)
-- ARGV[4] id  ARGV[5] name  ARGV[6] the signal's record (dur_rec 's')
-- ARGV[7] event channel  ARGV[8] partition
-- ARGV[9] max records  ARGV[10] max bytes
-- ARGV[11] events stream MAXLEN ('' or '0': no events)
-- Returns '0' stored, '1' stored and the task woken, '2' no such task or
-- it finished (completed, archived), '3' not here (it may be in the old
-- span of a repartition), '4' the name was signalled already, '5' the
-- task's wait for it timed out, '6' over the bounds. One script decides a
-- signal against its wait's time-out, on the Redis clock: a signal whose
-- wait's deadline (its 'd' record) has come records the time-out and is
-- refused; a time-out recorded first ('t', step.lua's resolve) refuses it
-- too; otherwise the signal is stored and a resolve returns it. A task
-- parked waiting for the name (state 7, its 'p' record) is made pending:
-- a grouped one joins its group's ready tasks; idle servers are woken
-- ("p<partition>"), and the events stream gets 'r'. A request run again
-- answers from the reply cache.
local bad = layout_error(KEYS[5], ARGV[1])
if bad then return bad end
local cached = req_get(KEYS[6], ARGV[2], tonumber(ARGV[3]))
if cached then return cached end
local function answer(code)
  req_put(KEYS[6], ARGV[2], code, tonumber(ARGV[3]))
  return code
end
local id, name = ARGV[4], ARGV[5]
local rec = redis.call('HGET', KEYS[1], id)
if rec_absent(rec) then return '3' end
if not rec_ok(rec) then return answer('2') end
local st = rec_state(rec)
if st == 5 or st == 6 then return answer('2') end
local f = dur_field(id)
local d = redis.call('HGET', KEYS[2], f) or ''
if dur_find(d, 's', name) then return answer('4') end
if dur_find(d, 't', name) then return answer('5') end
local now = redis_now()
local ds = dur_find(d, 'd', name)
if ds and dur_finished(d, ds) <= now then
  redis.call('HSET', KEYS[2], f, d .. dur_rec('t', name, now, now, ''))
  return answer('5')
end
local r = ARGV[6]
if dur_count(d) >= tonumber(ARGV[9]) or #d + #r > tonumber(ARGV[10]) then return answer('6') end
d = d .. r
redis.call('HSET', KEYS[2], f, d)
if st ~= 7 then return answer('0') end
local p = nil
local pos = 1
while pos + 18 <= #d do
  local nl = struct.unpack('>I2', d, pos + 1)
  local stop = pos + 18 + nl + struct.unpack('>I4', d, pos + 15 + nl)
  if string.sub(d, pos, pos) == 'p' then p = dur_name(d, pos) end
  pos = stop + 1
end
if p ~= 'signal:' .. name then return answer('0') end
redis.call('ZREM', KEYS[3], id)
redis.call('HSET', KEYS[1], id, rec_patch(rec, 1, nil, nil, now, nil, nil))
local G = g_keys(7)
local g, seq = g_of(G, id)
if g then
  g_ready(G, g, seq, id)
  redis.call('PUBLISH', ARGV[7], 'p' .. ARGV[8])
else
  redis.call('LPUSH', KEYS[4], id)
  if redis.call('LLEN', KEYS[4]) == 1 then redis.call('PUBLISH', ARGV[7], 'p' .. ARGV[8]) end
end
local E = ev_new(KEYS[13], ARGV[11])
if E then
  ev_add(E, 'r', id, rec_type(rec), 'tide: signal ' .. name)
  ev_flush(E)
end
return answer('1')
