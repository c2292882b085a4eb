-- Counter keys KEYS[kbase .. kbase + ncount - 1]: INCRBY ARGV[abase + 2j], expiry
-- ARGV[abase + 2j + 1] (j from 0). `earliest` is the earliest of those expiries: while it is
-- still ahead, no key is late and the per-key lateness check is skipped (the common case; it
-- costs a tonumber per key).
local any_late = ncount > 0 and tonumber(earliest) <= now
for j = 0, ncount - 1 do
  local key, at = KEYS[kbase + j], ARGV[abase + 2 * j + 1]
  if any_late and tonumber(at) <= now then
    late = late + 1
  else
    local d = ARGV[abase + 2 * j]
    local r = redis.pcall('INCRBY', key, d)
    if r == tonumber(d) then
      -- This increment created the key.
      redis.call('PEXPIREAT', key, at)
    elseif type(r) == 'table' and r.err then
      if refused(r.err) then return redis.error_reply(r.err) end
    elseif check and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, at)
    end
  end
end
