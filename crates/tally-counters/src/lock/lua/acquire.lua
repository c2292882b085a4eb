-- Acquire: SET KEYS[1] ARGV[1] NX PX ARGV[2] and, in the same step, advance the fencing counter
-- KEYS[2] (same hash tag) and move its expiry to ARGV[3] ms from now (longer than any lease:
-- a lock name used once does not leave a key forever). The counter advances to Redis's clock in
-- microseconds, or by one when it is already there: a replica promoted after losing the last
-- increments (or a server restarted empty) still hands out a token larger than every token
-- handed out before, as long as its clock is not behind the old primary's by more than the time
-- the failover took. Reply: {1, token} acquired with fencing token `token`, a bulk string read
-- back with GET (a Lua number is a double and would lose a token's low bits above 2^53); {0,
-- pttl} held by someone else for `pttl` more ms (-1: no expiry, which tally never sets).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cur = redis.call('GET', KEYS[2])
  if (not cur) or tonumber(cur) < now_us then
    redis.call('SET', KEYS[2], string.format('%d', now_us))
  else
    redis.call('INCR', KEYS[2])
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1, redis.call('GET', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
