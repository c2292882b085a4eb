-- A usage report of one Envoy for one bucket of Envoy's rate limit quota service (RLQS).
-- KEYS[1]: the requests reported allowed in the bucket's current window (a counter).
-- KEYS[2]: the reservations, one field per Envoy (its stream's id):
--          "<reserved> <expires at ms> <demand, requests per 1000 s> <report period ms>".
-- ARGV: holder, allowed, now (ms), the counter's expiry (Unix ms).
-- Adds `allowed` to the window, drops reservations past their expiry (or unreadable), and
-- returns {used, then for every other Envoy holding a reservation: demand, period}.
local used = redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
local now = tonumber(ARGV[3])
local out = {used}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local _, expiry, rate, period = string.match(value, '^(%d+) (%d+) (%d+) (%d+)$')
  if not expiry or tonumber(expiry) <= now then
    redis.call('HDEL', KEYS[2], field)
  elseif field ~= ARGV[1] then
    out[#out + 1] = tonumber(rate)
    out[#out + 1] = tonumber(period)
  end
end
return out
