-- Reads (and where allowed creates) fences. Reply contract and arguments: see
-- src/stream/sink/script.rs.
local mtype = redis.call('TYPE', KEYS[1]).ok
local out = {}
for i = 2, #KEYS do
  local p, fresh = ARGV[2 * i - 2], tonumber(ARGV[2 * i - 1])
  local code, value, text = fence_status(mtype, KEYS[1], KEYS[i], p)
  if code == 1 then
    -- Refresh the marker's copy.
    redis.call('HSET', KEYS[1], p, text)
  elseif code == -4 and fresh >= 0 then
    redis.call('SET', KEYS[i], ARGV[2 * i - 1])
    redis.call('HSET', KEYS[1], p, ARGV[2 * i - 1])
    code, value = 2, fresh
  end
  out[#out + 1] = {code, value}
end
if (mtype == 'hash' or mtype == 'none') and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSETNX', KEYS[1], 'created_ms', ARGV[1])
end
return out
