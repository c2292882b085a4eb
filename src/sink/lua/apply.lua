-- Reply contract and arguments: see src/sink/script.rs. Values arrive as ARGV, never in the text.
local mtype = redis.call('TYPE', KEYS[2]).ok
local function missing()
  local copy = mtype == 'hash' and redis.call('HGET', KEYS[2], ARGV[4])
  if not copy then return {-4} end
  return {-2, tonumber(copy) or -1}
end
local start, stop = tonumber(ARGV[1]), tonumber(ARGV[2])
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' or (mtype ~= 'none' and mtype ~= 'hash') then return {-3} end
if not raw then return missing() end
local applied = tonumber(raw)
if applied == nil then return {-3} end
if applied >= stop then return {0, applied} end
if applied ~= start then return {-1, applied} end
local check = ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local late, overflow, rejected = 0, 0, 0
for i = 3, #KEYS do
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
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[2])
return {1, late, overflow, rejected}
