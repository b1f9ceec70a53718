-- lib.lua: helpers prepended to every script. They read and patch the fixed
-- 20-byte record header described in internal/codec (1-based offsets here):
--   1 version | 2 state | 3-6 token | 7-8 retried | 9-10 max retry
--   11-16 process-at ms | 17-19 body len | 20 uniq len
--   21.. body | unique key | failure (empty, or failed-at ms (6) .. last error)
-- States: 1 pending, 2 active, 3 scheduled, 4 retry, 5 archived, 6 completed.

local function rec_ok(rec)
  return rec and #rec >= 20 and string.byte(rec, 1) == 1
end

local function rec_state(rec) return string.byte(rec, 2) end
local function rec_token(rec) return struct.unpack('>I4', rec, 3) end
local function rec_retried(rec) return struct.unpack('>I2', rec, 7) end
local function rec_maxretry(rec) return struct.unpack('>I2', rec, 9) end
-- rec_end is the offset of the last byte before the failure section.
local function rec_end(rec)
  return 20 + struct.unpack('>I3', rec, 17) + string.byte(rec, 20)
end

local function rec_uniq(rec)
  local ul = string.byte(rec, 20)
  if ul == 0 then return nil end
  local e = rec_end(rec)
  return string.sub(rec, e - ul + 1, e)
end

-- rec_patch returns rec with the given fields replaced; nil keeps a field.
-- failed and err replace the failure section together (either may be nil to
-- keep its part).
local function rec_patch(rec, state, token, retried, due, failed, err)
  local st = state and string.char(state) or string.sub(rec, 2, 2)
  local tk = token and struct.pack('>I4', token) or string.sub(rec, 3, 6)
  local rt = retried and struct.pack('>I2', math.min(retried, 65535)) or string.sub(rec, 7, 8)
  local du = due and struct.pack('>I6', due) or string.sub(rec, 11, 16)
  local e = rec_end(rec)
  local tail = string.sub(rec, e + 1)
  if failed or err then
    local old_at, old_err = struct.pack('>I6', 0), ''
    if #tail >= 6 then old_at, old_err = string.sub(tail, 1, 6), string.sub(tail, 7) end
    tail = (failed and struct.pack('>I6', failed) or old_at) .. (err or old_err)
  end
  return string.sub(rec, 1, 1) .. st .. tk .. rt .. string.sub(rec, 9, 10) .. du .. string.sub(rec, 17, e) .. tail
end

-- rec_corrupt builds a valid archived record with an empty body for bytes that
-- could not be parsed; the bytes themselves are kept as the task's result.
local function rec_corrupt(now, err)
  return string.char(1, 5) .. struct.pack('>I4>I2>I2>I6>I3B', 0, 0, 0, now, 0, 0) .. struct.pack('>I6', now) .. err
end

local function release_uniq(rec, uprefix, id)
  local u = rec_uniq(rec)
  if u then
    local k = uprefix .. u
    if redis.call('GET', k) == id then redis.call('DEL', k) end
  end
end

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- earliest returns the lowest score of the scheduled and retry sets, or nil.
local function earliest(sched, retry)
  local best
  for _, z in ipairs({sched, retry}) do
    local r = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    if r[2] then
      local s = tonumber(r[2])
      if not best or s < best then best = s end
    end
  end
  return best
end

-- count_day adds to the partition's day counters <base>stat:p:<day> and
-- <base>stat:f:<day>, which expire after 90 days. tkey is the records key,
-- "<base>t", from which the base is taken.
local function count_day(tkey, day, processed, failed)
  local base = string.sub(tkey, 1, -2)
  for name, n in pairs({p = processed, f = failed}) do
    if n > 0 then
      local k = base .. 'stat:' .. name .. ':' .. day
      redis.call('INCRBY', k, n)
      redis.call('EXPIRE', k, 7776000)
    end
  end
end

-- zset_of names the sorted set holding tasks in state st (nil for pending
-- and active, which live elsewhere); keys are the admin scripts' KEYS.
local function zset_of(st, keys)
  if st == 3 then return keys[3] elseif st == 4 then return keys[4]
  elseif st == 5 then return keys[5] elseif st == 6 then return keys[6] end
  return nil
end
