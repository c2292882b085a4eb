-- Counter keys KEYS[3 .. ncount + 2]: INCRBY ARGV[2i - 1], expiry ARGV[2i].
local late, overflow, rejected = 0, 0, 0
for i = 3, ncount + 2 do
  local at = ARGV[2 * i]
  if tonumber(at) <= now then
    late = late + 1
  else
    local d = ARGV[2 * i - 1]
    local r = redis.pcall('INCRBY', KEYS[i], d)
    if type(r) == 'table' and r.err then
      if string.sub(r.err, 1, 3) == 'OOM' then return redis.error_reply(r.err) end
      if string.find(r.err, 'overflow', 1, true) then
        overflow = overflow + 1
      else
        rejected = rejected + 1
      end
    elseif r == tonumber(d) then
      redis.call('PEXPIREAT', KEYS[i], at)
    elseif check and redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], at)
    end
  end
end
