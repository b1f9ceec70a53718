-- registry.lua: change a queue's recorded layout if it is still the one the
-- caller read (a compare-and-set on <prefix>:partitions).
-- KEYS[1] the partitions hash
-- ARGV[1] queue  ARGV[2] the layout read  ARGV[3] the new layout
-- Returns 1 changed, 0 the recorded layout is no longer ARGV[2].
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
