-- Extend: set KEYS[1]'s expiry to ARGV[2] ms only if it still holds the token ARGV[1], and move
-- the fencing counter KEYS[2]'s expiry to ARGV[3] ms (it outlives every lease it numbered).
-- Reply: 1 extended; 0 not held by this token (the lease was lost).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
