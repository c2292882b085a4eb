-- The other kinds, KEYS[ncount + 3 ..]: per key in ARGV from 6 + 2 * ncount: op ('h' HINCRBY,
-- 'p' PFADD, 's' SADD, 'z' ZINCRBY), expiry, n, then n arguments (h: field, delta; p/s: members;
-- z: member, score pairs). A key without expiry (new) gets it.
local cursor = 6 + 2 * ncount
for i = ncount + 3, #KEYS do
  local op, at, n = ARGV[cursor], ARGV[cursor + 1], tonumber(ARGV[cursor + 2])
  local first = cursor + 3
  local last = first + n - 1
  cursor = first + n
  if tonumber(at) <= now then
    late = late + 1
  else
    local key, r = KEYS[i], nil
    if op == 'h' then
      r = redis.pcall('HINCRBY', key, ARGV[first], ARGV[first + 1])
    elseif op == 'p' or op == 's' then
      local cmd = op == 'p' and 'PFADD' or 'SADD'
      for j = first, last, 512 do
        r = redis.pcall(cmd, key, unpack(ARGV, j, math.min(j + 511, last)))
        if type(r) == 'table' and r.err then break end
      end
    else
      for j = first, last, 2 do
        r = redis.pcall('ZINCRBY', key, ARGV[j + 1], ARGV[j])
        if type(r) == 'table' and r.err then break end
      end
    end
    if type(r) == 'table' and r.err then
      if refused(r.err) then return redis.error_reply(r.err) end
    elseif redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, at)
    end
  end
end
-- An optional watermark argument sits between the last key's arguments and the count.
if cursor < #ARGV then watermark_at = cursor else watermark_at = #ARGV + 1 end
