-- Hit: add ARGV[1] to the counter KEYS[1], whose window takes hits until ARGV[2] (window end +
-- retention, Unix ms) and whose key is stored with expiry ARGV[3] (ARGV[2] spread by the key's
-- hash, as the stream stores it), and return the new value. KEYS[2], if given, is the idempotency key of this hit: a hash of the
-- counter key it was used for (`k`) and the value recorded (`v`). A retried hit finds it and
-- returns the value recorded instead of adding again; the same id used for another counter key
-- (other dimension values, another window) is refused. Values arrive as ARGV.
-- Reply: {1, value} added; {0, value} a duplicate (nothing added); {-1} the window has expired;
-- {-2} the counter holds something that is not an integer; {-3} the sum would leave the signed
-- 64-bit range (nothing added); {-4} the id was used for another counter key (nothing added);
-- {-5} the sum would pass ARGV[4] (when given) in magnitude (nothing added).
-- `value` is the counter as Redis stores it, a bulk string: a Lua number is a double, so an
-- integer reply above 2^53 would be rounded on its way in and truncated on its way out. The
-- value is read back with GET and passed on (and recorded) as that string, never as a number.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(ARGV[2]) <= now then return {-1} end
if KEYS[2] then
  local seen = redis.pcall('HMGET', KEYS[2], 'k', 'v')
  if seen.err then
    -- Recorded by an earlier version as a plain value (it expires with its window).
    local old = redis.call('GET', KEYS[2])
    if old then return {0, old} end
  elseif seen[2] then
    if seen[1] ~= KEYS[1] then return {-4} end
    return {0, seen[2]}
  end
end
if ARGV[4] then
  -- As doubles: exact for a bound up to 2^53 - 1 (a sum up to 2^53 is exact; a larger one
  -- rounds to at least 2^53, past the bound either way).
  local cur = redis.pcall('GET', KEYS[1])
  local sum = (tonumber(type(cur) == 'string' and cur or '0') or 0) + tonumber(ARGV[1])
  if math.abs(sum) > tonumber(ARGV[4]) then return {-5} end
end
local v = redis.pcall('INCRBY', KEYS[1], ARGV[1])
if type(v) == 'table' and v.err then
  if string.sub(v.err, 1, 3) == 'OOM' then return redis.error_reply(v.err) end
  if string.find(v.err, 'would overflow', 1, true) then return {-3} end
  return {-2}
end
-- A new key has no expiry yet, and one made or PERSISTed outside tally is repaired: both get it.
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIREAT', KEYS[1], ARGV[3])
end
local exact = redis.call('GET', KEYS[1])
if KEYS[2] then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'k', KEYS[1], 'v', exact)
  redis.call('PEXPIREAT', KEYS[2], ARGV[3])
end
return {1, exact}
