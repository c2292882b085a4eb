-- Applies several partitions' units of one shard in one call, their deltas merged. Reply
-- contract and arguments: see script.rs (APPLY_MERGED_LUA).
-- KEYS: marker, m fences, then the counter keys. ARGV: m, check, earliest expiry, per fence
-- (partition, start, end), then per counter key (delta, expiry), then optionally one watermark
-- per fence.
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
local now = now_ms()
local ncount = #KEYS - m - 1
local abase = 4 + 3 * m
local err = apply_counts(m + 2, abase, ncount, ARGV[3], now, ARGV[2] == '1')
if err then return err end
-- Record every partition's applied offset and its copy in the state marker.
for j = 1, m do
  redis.call('SET', KEYS[j + 1], ARGV[3 * j + 3])
  redis.call('HSET', KEYS[1], ARGV[3 * j + 1], ARGV[3 * j + 3])
  note_watermark(KEYS[1], ARGV[3 * j + 1], ARGV[abase + 2 * ncount + j - 1], now)
end
return applied_reply()
