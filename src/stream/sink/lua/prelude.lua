-- The fenced-write protocol as functions, shared by every script that reads a fence (script.rs
-- puts this in front of each; a script's own text only calls these functions, with every value
-- passed as an argument). Values arrive as ARGV, never in the text.

-- Keys skipped (expiry passed) or refused (overflow, not an integer) by a write: counted by
-- `apply_counts`, `apply_kinds` and `refused`, returned by `applied_reply`.
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

-- Window results (counters with an output): the marker keeps, per partition, `wm:<partition>`,
-- the highest event time applied (only ever raised), and `seen:<partition>`, Redis' time of the
-- last applied range (idle detection); written in the same call as the fence, so they move with
-- the partition. `wm` nil: the caller sent none (no output configured); '-': a range without
-- events.
local function note_watermark(marker, partition, wm, now)
  if wm == nil then return end
  if wm ~= '-' then
    local field = 'wm:' .. partition
    local have = tonumber(redis.call('HGET', marker, field))
    if have == nil or tonumber(wm) > have then redis.call('HSET', marker, field, wm) end
  end
  redis.call('HSET', marker, 'seen:' .. partition, now)
end

-- Counter keys KEYS[kbase .. kbase + ncount - 1]: INCRBY ARGV[abase + 2j], expiry
-- ARGV[abase + 2j + 1] (j from 0). `earliest` is the earliest of those expiries: while it is
-- still ahead, no key is late and the per-key lateness check is skipped (the common case; it
-- costs a tonumber per key). `check`: also give existing keys without expiry theirs. Returns
-- an error reply to return as is (OOM), or nil.
local function apply_counts(kbase, abase, ncount, earliest, now, check)
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
  return nil
end

-- The other kinds, KEYS[first_key ..]: per key in ARGV from `cursor`: op ('h' HINCRBY, 'p'
-- PFADD, 's' SADD, 'z' ZINCRBY), expiry, n, then n arguments (h: field, delta; p/s: members;
-- z: member, score pairs). A key without expiry (new) gets it. Returns an error reply (OOM) or
-- nil, and the ARGV index after the last key's arguments.
local function apply_kinds(first_key, cursor, now)
  for i = first_key, #KEYS do
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
        if refused(r.err) then return redis.error_reply(r.err), cursor end
      elseif redis.call('PTTL', key) == -1 then
        redis.call('PEXPIREAT', key, at)
      end
    end
  end
  return nil, cursor
end

-- The reply of a write that applied: `{1, late, overflow, rejected}`.
local function applied_reply()
  return {1, late, overflow, rejected}
end

-- One unit (APPLY_LUA, and APPLY_KINDS_LUA with `with_kinds`): KEYS fence, marker, the
-- `ncount` counter keys, then (with kinds) the other kinds' keys. ARGV and replies: script.rs.
local function apply_unit(ncount, with_kinds)
  local mtype = redis.call('TYPE', KEYS[2]).ok
  local code, value = fence_status(mtype, KEYS[2], KEYS[1], ARGV[4], tonumber(ARGV[1]),
    tonumber(ARGV[2]))
  if code == -3 or code == -4 then return {code} end
  if code ~= 1 then return {code, value} end
  local now = now_ms()
  local err = apply_counts(3, 6, ncount, ARGV[5], now, ARGV[3] == '1')
  if err then return err end
  -- The optional watermark follows the last key's arguments.
  local watermark_at = 6 + 2 * ncount
  if with_kinds then
    local cursor
    err, cursor = apply_kinds(ncount + 3, 6 + 2 * ncount, now)
    if err then return err end
    -- With kinds the last ARGV is the count of counter keys, not a watermark.
    if cursor < #ARGV then watermark_at = cursor else watermark_at = #ARGV + 1 end
  end
  -- Record the applied offset and its copy in the state marker.
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[4], ARGV[2])
  note_watermark(KEYS[2], ARGV[4], ARGV[watermark_at], now)
  return applied_reply()
end
