-- Counter keys KEYS[3 .. ncount + 2]: INCRBY ARGV[2i], expiry ARGV[2i + 1]. ARGV[5] is the
-- earliest of those expiries: when it is still ahead, no key is late and the per-key lateness
-- check is skipped (the common case; it costs a tonumber per key).
local late, overflow, rejected = 0, 0, 0
local any_late = ncount > 0 and tonumber(ARGV[5]) <= now
for i = 3, ncount + 2 do
  local at = ARGV[2 * i + 1]
  if any_late and tonumber(at) <= now then
    late = late + 1
  else
    local d = ARGV[2 * i]
    local r = redis.pcall('INCRBY', KEYS[i], d)
    if r == tonumber(d) then
      -- This increment created the key.
      redis.call('PEXPIREAT', KEYS[i], at)
    elseif type(r) == 'table' and r.err then
      if string.sub(r.err, 1, 3) == 'OOM' then return redis.error_reply(r.err) end
      if string.find(r.err, 'overflow', 1, true) then
        overflow = overflow + 1
      else
        rejected = rejected + 1
      end
    elseif check and redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], at)
    end
  end
end
