-- The grant after a report (rlqs_report.lua names the keys and the reservation's format).
-- ARGV: holder, desired, gap, limit, now (ms), expiry of the reservation (ms),
--       demand (requests per 1000 s), report period (ms).
-- The invariant: used + every live reservation <= limit. What is left once `used` and the other
-- Envoys' live reservations are counted goes first to the gap (what the Envoy may still admit
-- from its previous assignment), then to as much of `desired` as fits (assign.rs `cap`, whose
-- tests specify this). Returns {grant, reserved, used}.
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[5])
local expires = tonumber(ARGV[6])
local others = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local reserved, expiry = string.match(value, '^(%d+) (%d+) %d+ %d+$')
  if not expiry or tonumber(expiry) <= now then
    redis.call('HDEL', KEYS[2], field)
  elseif field ~= ARGV[1] then
    others = others + tonumber(reserved)
    if tonumber(expiry) > expires then expires = tonumber(expiry) end
  end
end
local left = tonumber(ARGV[4]) - used - others
if left < 0 then left = 0 end
local gap = math.min(tonumber(ARGV[3]), left)
local grant = math.min(tonumber(ARGV[2]), left - gap)
redis.call('HSET', KEYS[2], ARGV[1],
  string.format('%d %d %s %s', grant + gap, tonumber(ARGV[6]), ARGV[7], ARGV[8]))
redis.call('PEXPIREAT', KEYS[2], expires)
return {grant, grant + gap, used}
