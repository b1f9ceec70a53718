-- ids.lua: the index of grouped tasks whose IDs do not carry their group,
-- on a queue of several partitions (see "Free IDs on several partitions" in
-- docs/design.md). Run in the ID's partition I (claim, confirm, release,
-- due) or in the group's partition G (fence, look).
-- KEYS[1] records hash  KEYS[2] pointers zset (ID -> next look, ms)
-- KEYS[3] fences zset (nonce -> expiry, ms)  KEYS[4] waiters hash
-- KEYS[5] outcomes hash  KEYS[6] layout meta  KEYS[7] grouped task IDs
-- (groups.lua's G.id: ID -> group, "\0", enqueue sequence)
-- ARGV[1] layout  ARGV[2] op  ARGV[3] ID (due: how many)  ARGV[4..] per op:
--   claim   4 nonce  5 group  6 first look (ms from now)  7 nonce of a
--           confirmed pointer of the same group to take over ('' none)
--   confirm 4 nonce  5 next look (ms from now)
--   release 4 nonce  5 'k' to release a confirmed pointer only ('' any)
--   fence   4 nonce  5 expiry (ms)  6 '' or none for a move's claim,
--           else the claim's group: a record here is then answered with
--           its group ('o'), not taken for the store
--   look    4 'r' a record only counts, 'a' also a waiter or a kept outcome
--   due     (none)
--   move    4 nonce  5 group  6 first look (ms from now)  7 nonce of the
--           confirmed pointer to move  8 its group: Replace into a group
--           of another partition (see relocate.lua) claims the ID for the
--           new group while the task leaves the old one
--   moved   4 nonce  5 next look: a move's claim becomes the confirmed
--           pointer of the new group (the task moved)
--   stay    4 nonce  5 next look: a move's claim becomes the confirmed
--           pointer of the old group again (the task stayed)
--   back    4 nonce  5 group  6 next look: an enqueue's claim that took a
--           confirmed pointer's place (Replace into a group of the same
--           partition) whose store was refused becomes a confirmed pointer
--           of the task that is still there (group 5)
--   put     4 nonce  5 group: a repartition writes the confirmed pointer
--           of a task it moves (in its new I), unless a pointer is there
--           (kept: another step's for the same task, or, for a step that
--           acts on what it read before a Replace moved the task ahead,
--           what the new span made of the ID since)
--   drop    4 group: a repartition drops the pointer of a task it moved
--           (in its old I)
-- A pointer is the record hash's field ID holding "\0g", its state ('c'
-- claimed, 'k' confirmed, 'v' a move's claim), its nonce (16 characters),
-- the claim's time (ms, I's clock), "\0" and the group (of a move: the new
-- group, "\0" and the old one, '' for a move out of I itself whose task
-- was deleted in I: remove.lua writes that claim in the record's place).
-- Returns: claim 'c<time>' claimed (or claimed before by this nonce), '1'
-- a task record or a repartition's placeholder holds the ID, 'p<pointer>'
-- another nonce's pointer; confirm and release '1' done, '0' the pointer
-- is not this nonce's (or not in that state); fence 's' G holds a record
-- for the ID, or a move's store with this nonce was made here (marked in
-- the fences zset by enqueue.lua, kept an hour past the move's deadline:
-- the task stored may have run and be gone), 'f' fenced: a store with this
-- nonce is refused from now on; 'o' and a group (with 6): fenced, and G
-- holds the ID's task in that group (the claim's store, or the task a
-- Replace's claim would have replaced);
-- look '1' or '0'; move like claim, or '0' the pointer is not the one to
-- move (any more), 'd' this nonce's move is settled; moved, stay and back
-- '1' done, '0' not this nonce's (move's) claim; put '1' written or a
-- pointer kept, '0' a task record or placeholder holds the ID; drop '1' dropped, '0' no pointer of that group; due a flat list of ID, pointer of the pointers whose
-- look is due, each put off by its age (10 s to an hour).
local bad = layout_error(KEYS[6], ARGV[1])
if bad then return bad end
local op, id = ARGV[2], ARGV[3]

local function ptr_parse(v)
  if not v or string.sub(v, 1, 2) ~= '\0g' then return nil end
  local z = string.find(v, '\0', 4, true)
  if not z then return nil end
  return string.sub(v, 3, 3), string.sub(v, 4, 19), tonumber(string.sub(v, 20, z - 1)), string.sub(v, z + 1)
end

if op == 'claim' then
  local cur = redis.call('HGET', KEYS[1], id)
  local now = redis_now()
  local function claim()
    redis.call('HSET', KEYS[1], id, '\0gc' .. ARGV[4] .. string.format('%d', now) .. '\0' .. ARGV[5])
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), id)
    return 'c' .. string.format('%d', now)
  end
  if not cur then return claim() end
  local st, nonce, at = ptr_parse(cur)
  if not st then return '1' end
  if nonce == ARGV[4] then return 'c' .. string.format('%d', at) end
  if st == 'k' and nonce == ARGV[7] then return claim() end
  return 'p' .. cur
elseif op == 'move' then
  local st, nonce, at, g = ptr_parse(redis.call('HGET', KEYS[1], id))
  if st and nonce == ARGV[4] then
    if st == 'v' then return 'c' .. string.format('%d', at) end
    return 'd'
  end
  if st ~= 'k' or nonce ~= ARGV[7] or g ~= ARGV[8] then return '0' end
  local now = redis_now()
  redis.call('HSET', KEYS[1], id, '\0gv' .. ARGV[4] .. string.format('%d', now) .. '\0' .. ARGV[5] .. '\0' .. ARGV[8])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), id)
  return 'c' .. string.format('%d', now)
elseif op == 'moved' or op == 'stay' then
  local v = redis.call('HGET', KEYS[1], id)
  local st, nonce, at, g = ptr_parse(v)
  if st ~= 'v' or nonce ~= ARGV[4] then return '0' end
  local z = string.find(g, '\0', 1, true)
  local keep = string.sub(g, 1, z - 1)
  if op == 'stay' then keep = string.sub(g, z + 1) end
  redis.call('HSET', KEYS[1], id, '\0gk' .. string.sub(v, 4, 19) .. string.format('%d', at) .. '\0' .. keep)
  redis.call('ZADD', KEYS[2], redis_now() + tonumber(ARGV[5]), id)
  return '1'
elseif op == 'back' then
  local v = redis.call('HGET', KEYS[1], id)
  local st, nonce, at = ptr_parse(v)
  if st ~= 'c' or nonce ~= ARGV[4] then return '0' end
  redis.call('HSET', KEYS[1], id, '\0gk' .. nonce .. string.format('%d', at) .. '\0' .. ARGV[5])
  redis.call('ZADD', KEYS[2], redis_now() + tonumber(ARGV[6]), id)
  return '1'
elseif op == 'confirm' then
  local st, nonce = ptr_parse(redis.call('HGET', KEYS[1], id))
  if nonce ~= ARGV[4] then return '0' end
  if st == 'c' then
    local v = redis.call('HGET', KEYS[1], id)
    redis.call('HSET', KEYS[1], id, '\0gk' .. string.sub(v, 4))
  end
  redis.call('ZADD', KEYS[2], redis_now() + tonumber(ARGV[5]), id)
  return '1'
elseif op == 'release' then
  local st, nonce = ptr_parse(redis.call('HGET', KEYS[1], id))
  if nonce ~= ARGV[4] or (ARGV[5] ~= '' and st ~= ARGV[5]) then return '0' end
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  return '1'
elseif op == 'fence' then
  local function fence()
    redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[4])
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', redis_now())
  end
  if rec_ok(redis.call('HGET', KEYS[1], id)) then
    -- With the claim's group (a claim, not a move): the record may be the
    -- claim's store or the task whose pointer's place the claim took (a
    -- Replace), of any group of this partition, its store still to come.
    -- The claim is fenced either way, and the record's group answered:
    -- the pointer is to name it.
    local v = (ARGV[6] or '') ~= '' and redis.call('HGET', KEYS[7], id)
    local z = v and string.find(v, '\0', 1, true)
    if z then
      fence()
      return 'o' .. string.sub(v, 1, z - 1)
    end
    return 's'
  end
  if redis.call('ZSCORE', KEYS[3], 's' .. ARGV[4]) then return 's' end
  fence()
  return 'f'
elseif op == 'look' then
  if rec_ok(redis.call('HGET', KEYS[1], id)) then return '1' end
  if ARGV[4] == 'a' and (redis.call('HEXISTS', KEYS[4], id) == 1 or redis.call('HEXISTS', KEYS[5], id) == 1) then return '1' end
  return '0'
elseif op == 'put' then
  local cur = redis.call('HGET', KEYS[1], id)
  if cur and not ptr_parse(cur) then return '0' end
  if cur then return '1' end
  local now = redis_now()
  redis.call('HSET', KEYS[1], id, '\0gk' .. ARGV[4] .. string.format('%d', now) .. '\0' .. ARGV[5])
  redis.call('ZADD', KEYS[2], now + 10000, id)
  return '1'
elseif op == 'drop' then
  local st, _, _, g = ptr_parse(redis.call('HGET', KEYS[1], id))
  if not st or g ~= ARGV[4] then return '0' end
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  return '1'
elseif op == 'due' then
  local now = redis_now()
  local out = {}
  for _, pid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(id))) do
    local v = redis.call('HGET', KEYS[1], pid)
    local st, _, at = ptr_parse(v)
    if st then
      out[#out + 1] = pid
      out[#out + 1] = v
      redis.call('ZADD', KEYS[2], now + math.min(math.max(now - at, 10000), 3600000), pid)
    else
      redis.call('ZREM', KEYS[2], pid) -- no pointer any more
    end
  end
  return out
end
return redis.error_reply('ids.lua: unknown op ' .. tostring(op))
