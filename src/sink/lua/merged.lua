-- Applies several partitions' units of one shard in one call, their deltas merged. Reply
-- contract and arguments: see src/sink/script.rs.
-- KEYS: marker, m fences, then the counter keys. ARGV: m, check, earliest expiry, per fence
-- (partition, start, end), then per counter key (delta, expiry).
local m = tonumber(ARGV[1])
local mtype = redis.call('TYPE', KEYS[1]).ok
-- Every fence first: the call applies all of its ranges or none.
local status, ready, done = {-9}, 0, 0
for j = 1, m do
  local code, value = fence_status(mtype, KEYS[1], KEYS[j + 1], ARGV[3 * j + 1],
    tonumber(ARGV[3 * j + 2]), tonumber(ARGV[3 * j + 3]))
  if code == 1 then ready = ready + 1 elseif code == 0 then done = done + 1 end
  status[#status + 1] = code
  status[#status + 1] = value
end
if done == m then return {0} end
if ready < m then return status end
local check = ARGV[2] == '1'
local now = now_ms()
local ncount = #KEYS - m - 1
local kbase, abase, earliest = m + 2, 4 + 3 * m, ARGV[3]
