-- Give back one admission of a quota. KEYS as in quota.lua; ARGV[1]: the user ('' when the quota
-- has no once-per-user: then one admission is returned if any was taken).
-- Reply: {1, taken} released; {0, taken} nothing to release (unknown user, or none taken).
-- `taken` as in quota.lua: the stored count as a bulk string, never a Lua number.
local user = ARGV[1]
local raw = redis.call('GET', KEYS[1]) or '0'
if user ~= '' and redis.call('SREM', KEYS[2], user) == 0 then return {0, raw} end
if (tonumber(raw) or 0) <= 0 then return {0, raw} end
redis.call('DECR', KEYS[1])
return {1, redis.call('GET', KEYS[1])}
