-- Give back one admission of a quota. KEYS as in quota.lua; ARGV[1]: the user ('' when the quota
-- has no once-per-user: then one admission is returned if any was taken).
-- Reply: {1, taken} released; {0, taken} nothing to release (unknown user, or none taken).
local user = ARGV[1]
local taken = tonumber(redis.call('GET', KEYS[1])) or 0
if user ~= '' and redis.call('SREM', KEYS[2], user) == 0 then return {0, taken} end
if taken <= 0 then return {0, 0} end
return {1, redis.call('DECR', KEYS[1])}
