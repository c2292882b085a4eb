-- Quota (first N win): admit one taker while fewer than ARGV[1] have been admitted. KEYS[1]: how
-- many were admitted; KEYS[2]: who (with once-per-user, ARGV[2] is the user: a user already
-- admitted is told so before anything is counted). ARGV[3]: the expiry (`expire` in expiry.lua).
-- Reply: {1, taken} admitted; {0, taken} sold out; {2, taken} this user was already admitted.
-- `taken` is the count as Redis stores it, a bulk string: a Lua number is a double, exact only
-- up to 2^53. The size is at most 2^53 (checked by the caller), so comparing the rounded count
-- with it still decides exactly.
local size, user, at = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local raw = redis.call('GET', KEYS[1]) or '0'
local taken = tonumber(raw) or 0
if user ~= '' and redis.call('SISMEMBER', KEYS[2], user) == 1 then return {2, raw} end
if taken >= size then return {0, raw} end
redis.call('INCR', KEYS[1])
if user ~= '' then redis.call('SADD', KEYS[2], user) end
expire(KEYS[1], at)
if user ~= '' then expire(KEYS[2], at) end
return {1, redis.call('GET', KEYS[1])}
