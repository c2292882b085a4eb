-- Applies several partitions' units of one shard in one call, their deltas merged. Reply
-- contract and arguments: see src/sink/script.rs. Values arrive as ARGV, never in the text.
-- KEYS: marker, m fences, then the counter keys. ARGV: m, check, earliest expiry, per fence
-- (partition, start, end), then per counter key (delta, expiry).
local m = tonumber(ARGV[1])
local mtype = redis.call('TYPE', KEYS[1]).ok
local bad_marker = mtype ~= 'none' and mtype ~= 'hash'
-- Every fence first: the call applies all of its ranges or none.
local status, ready, done = {-9}, 0, 0
for j = 1, m do
  local p, start, stop = ARGV[3 * j + 1], tonumber(ARGV[3 * j + 2]), tonumber(ARGV[3 * j + 3])
  local raw = redis.pcall('GET', KEYS[j + 1])
  local code, value = 1, 0
  if type(raw) == 'table' or bad_marker then
    code = -3
  elseif not raw then
    local copy = mtype == 'hash' and redis.call('HGET', KEYS[1], p)
    if copy then code, value = -2, tonumber(copy) or -1 else code = -4 end
  else
    local applied = tonumber(raw)
    if applied == nil then
      code = -3
    elseif applied >= stop then
      code, value = 0, applied
    elseif applied ~= start then
      code, value = -1, applied
    else
      value = applied
    end
  end
  if code == 1 then ready = ready + 1 elseif code == 0 then done = done + 1 end
  status[#status + 1] = code
  status[#status + 1] = value
end
if done == m then return {0} end
if ready < m then return status end
local check = ARGV[2] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ncount = #KEYS - m - 1
local kbase, abase, earliest = m + 2, 4 + 3 * m, ARGV[3]
