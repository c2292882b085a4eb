-- Reply contract and arguments: see src/sink/script.rs. Values arrive as ARGV, never in the text.
local mtype = redis.call('TYPE', KEYS[1]).ok
local out = {}
for i = 2, #KEYS do
  local p, fresh = ARGV[2 * i - 2], tonumber(ARGV[2 * i - 1])
  local raw = redis.pcall('GET', KEYS[i])
  local applied = type(raw) == 'string' and tonumber(raw) or nil
  if mtype ~= 'none' and mtype ~= 'hash' then
    out[#out + 1] = {-3, 0}
  elseif type(raw) == 'table' or (raw and applied == nil) then
    out[#out + 1] = {-3, 0}
  elseif raw then
    redis.call('HSET', KEYS[1], p, raw)
    out[#out + 1] = {1, applied}
  else
    local copy = mtype == 'hash' and redis.call('HGET', KEYS[1], p)
    if copy then
      out[#out + 1] = {-2, tonumber(copy) or -1}
    elseif fresh < 0 then
      out[#out + 1] = {-4, 0}
    else
      redis.call('SET', KEYS[i], ARGV[2 * i - 1])
      redis.call('HSET', KEYS[1], p, ARGV[2 * i - 1])
      out[#out + 1] = {2, fresh}
    end
  end
end
if (mtype == 'hash' or mtype == 'none') and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSETNX', KEYS[1], 'created_ms', ARGV[1])
end
return out
