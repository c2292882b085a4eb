-- The fenced-write protocol, shared by every script that reads a fence (script.rs joins this
-- in front of them). Values arrive as ARGV, never in the text.

-- Keys skipped (expiry passed) or refused (overflow, not an integer) by a write, for the reply.
local late, overflow, rejected = 0, 0, 0

-- The state of one fence as `code, value` (codes as in script.rs's reply contracts):
-- `1, applied`: the fence is at `start` (or exists, without a range); `0, applied`: the range up
-- to `stop` is applied already; `-1, applied`: another range was applied; `-2, copy`: the fence
-- is gone but the marker names `partition` (`copy`: its offset, -1 if unreadable); `-3, 0`: the
-- fence or the marker holds something that is not an offset; `-4, 0`: no fence, no copy.
-- With code 1 a third value is the fence's text (copied as is: Redis never formats a Lua
-- number). `mtype` is the marker's TYPE (read once per call).
local function fence_status(mtype, marker, fence, partition, start, stop)
  if mtype ~= 'none' and mtype ~= 'hash' then return -3, 0 end
  local raw = redis.pcall('GET', fence)
  if type(raw) == 'table' then return -3, 0 end
  if not raw then
    local copy = mtype == 'hash' and redis.call('HGET', marker, partition)
    if not copy then return -4, 0 end
    return -2, tonumber(copy) or -1
  end
  local applied = tonumber(raw)
  if applied == nil then return -3, 0 end
  if stop == nil then return 1, applied, raw end
  if applied >= stop then return 0, applied end
  if applied ~= start then return -1, applied end
  return 1, applied, raw
end

-- Redis' clock in milliseconds: what key expiries are compared with.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Counts a write Redis refused; true for OOM, which the caller returns as the script's error.
-- OOM can only come from a script's first write (Redis lets a script that has written finish),
-- so returning it leaves nothing half-applied.
local function refused(err)
  if string.sub(err, 1, 3) == 'OOM' then return true end
  if string.find(err, 'overflow', 1, true) then
    overflow = overflow + 1
  else
    rejected = rejected + 1
  end
  return false
end

-- Window results (counters with an output): where the caller's optional watermark argument is
-- (kinds.lua sets it; the others find it after their pairs), and the recording of it. The
-- marker keeps, per partition, `wm:<partition>`, the highest event time applied (only ever
-- raised), and `seen:<partition>`, Redis' time of the last applied range (idle detection);
-- written in the same call as the fence, so they move with the partition. `wm` nil: the
-- caller sent none (no output configured); '-': a range without events.
local watermark_at = nil
local function note_watermark(marker, partition, wm, now)
  if wm == nil then return end
  if wm ~= '-' then
    local field = 'wm:' .. partition
    local have = tonumber(redis.call('HGET', marker, field))
    if have == nil or tonumber(wm) > have then redis.call('HSET', marker, field, wm) end
  end
  redis.call('HSET', marker, 'seen:' .. partition, now)
end
