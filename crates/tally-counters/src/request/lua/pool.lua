-- Pool: hand user ARGV[1] one item of KEYS[1] (a set of items not yet given), at most one per
-- user: KEYS[2] maps user -> item. ARGV[2]: the expiry of both (`expire` in expiry.lua).
-- Reply: {1, item} given now; {2, item} given earlier to this user; {0} the pool is empty.
local mine = redis.call('HGET', KEYS[2], ARGV[1])
if mine then return {2, mine} end
local item = redis.call('SPOP', KEYS[1])
if not item then return {0} end
redis.call('HSET', KEYS[2], ARGV[1], item)
expire(KEYS[2], ARGV[2])
return {1, item}
