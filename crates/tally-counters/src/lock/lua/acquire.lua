-- Acquire: SET KEYS[1] ARGV[1] NX PX ARGV[2] and, in the same step, INCR the fencing counter
-- KEYS[2] (same hash tag) and move its expiry to ARGV[3] ms from now (longer than any lease:
-- a lock name used once does not leave a key forever). Reply: {1, token} acquired with fencing
-- token `token`, a bulk string read back with GET (INCR's integer reply would become a Lua
-- number, a double, and lose the token's low bits above 2^53); {0, pttl} held by someone else
-- for `pttl` more ms (-1: no expiry, which tally never sets).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1, redis.call('GET', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
