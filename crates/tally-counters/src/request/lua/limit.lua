-- Rate limits: decide a request against every policy in one atomic step, on Redis server time.
-- A policy is recorded only if the whole request is admitted, so a denied request costs nothing
-- and limit+1 requests never pass (each policy counts before it adds).
-- KEYS[i]: the state of policy i. ARGV: request id (unique: members of sliding logs), mode
-- ('apply' or 'peek'), then per policy 6 values: algorithm (1 fixed window, 2 sliding log,
-- 3 sliding window counter, 4 GCRA), limit, window ms, burst (GCRA), kind ('0' enforces, '1'
-- shadow: never denies, '2' usage: a cost above 0 is a charge for what was used, always
-- recorded, never denied; '3' quota, '4' quota and usage, '5' quota in shadow: see below;
-- '6' reserve and '7' settle: see reserve.lua, whose index entry, algorithm 5, follows such a
-- policy; '8' refund: see refund.lua), cost (units; 0 = check only: decided as a cost of 1,
-- recorded never).
-- Quotas (envoyproxy/ratelimit's quota_mode): a quota that cannot take its cost does not deny
-- by itself; the call is denied when it has quotas and none of them can take its cost (a quota
-- in shadow always can). An admitted call charges the quotas that could take their cost and
-- never one that could not, so no quota is counted past its limit; a denied call charges none.
-- Last, per policy, the ms its state's expiry lies past the window boundary (a per-key spread,
-- so the keys of every subject do not all expire at the same boundary).
-- Reply: {admitted, now_ms, then per policy: allowed, remaining, reset_ms, retry_after_ms}
-- (retry_after_ms -1: this cost can never pass this policy; an index entry's four values are a
-- settle's answer, see `settle` in reserve.lua). `remaining` is what is left after
-- this request when it is applied; a peek, a check or a denied request changes nothing, so it
-- reports what is left now.
-- Written as one loop without per-call closures or tables per policy: the script runs on every
-- request, and Lua allocations are most of its cost.
-- The decision is the function `decide(kb, ab, n, now_us)`: its keys are KEYS[kb + 1 .. kb + n],
-- its ARGV starts at ARGV[ab + 1]. The single script ends `return decide(0, 0, #KEYS, clock())`;
-- the batch script (batch.lua) runs several callers' decisions, each with its own keys and ARGV,
-- in one call.
local tonumber, floor, call = tonumber, math.floor, redis.call
-- Redis server time, µs; read once per script call (a batch's decisions share one instant).
local function clock()
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function decide(kb, ab, n, now_us)
  local now = floor(now_us / 1000)
  local reply = {1, now}
  local wa = {}
  -- Per policy, what is left if this call is not charged (reported when another denies it).
  local free = {}
  local admitted = 1
  -- Quotas asked, and those that can take their cost.
  local quotas, open = 0, 0
  local peek = ARGV[ab + 2] == 'peek'
  for i = 1, n do
    local b = ab + 2 + (i - 1) * 6
    local algo, limit, window = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local kind, given = ARGV[b + 5], tonumber(ARGV[b + 6])
    -- A check (0) is decided as one unit; a usage charge is recorded whatever is left.
    local cost = given == 0 and 1 or given
    local force = ((kind == '2' or kind == '4') and given > 0) or kind == '7'
    local key = KEYS[kb + i]
    local allowed, remaining, reset, retry = 0, 0, 0, 0
    if kind == '8' then
      -- A refund: never denies; applied after the decision (see refund.lua).
      allowed, free[i] = 1, 0
    elseif algo == 1 then
      -- Fixed window: hash {w = window index, n = units}.
      local cur = floor(now / window)
      reset = (cur + 1) * window - now
      local h = call('HMGET', key, 'w', 'n')
      local used = 0
      local same = tonumber(h[1]) == cur
      if same then used = tonumber(h[2]) or 0 end
      local hold, taken = 0, false
      if kind == '6' or kind == '7' then
        hold, taken = held(key, KEYS[kb + i + 1], now, kind == '6' and given > 0 and ARGV[b + 10] or '')
      end
      used = used + hold
      free[i] = math.max(0, limit - used)
      if (used + cost <= limit and not taken) or force then
        allowed, remaining = 1, math.max(0, limit - used - cost)
        wa[i] = same and 1 or 0
      else
        remaining = limit - used
        retry = (cost > limit or taken) and -1 or reset
      end
    elseif algo == 5 then
      -- A reservation index: decided with its policy, just before.
      allowed, free[i] = 1, 0
    elseif algo == 2 then
      -- Sliding log: sorted set of admitted units scored by time.
      local from = now - window
      local used = call('ZCOUNT', key, '(' .. from, '+inf')
      free[i] = math.max(0, limit - used)
      reset = window
      if used + cost <= limit or force then
        allowed, remaining = 1, math.max(0, limit - used - cost)
        wa[i] = 1
      elseif cost > limit then
        remaining, retry = limit - used, -1
      else
        -- It fits once the (used + cost - limit) oldest live entries have left the window.
        local live = call('ZRANGEBYSCORE', key, '(' .. from, '+inf', 'WITHSCORES', 'LIMIT', used + cost - limit - 1, 1)
        remaining = limit - used
        retry = tonumber(live[2]) + window - now
        reset = retry
      end
    elseif algo == 3 then
      -- Sliding window counter: the previous window weighted by its overlap.
      local cur = floor(now / window)
      local elapsed = now - cur * window
      local h = call('HMGET', key, cur, cur - 1)
      local curr, prev = tonumber(h[1]) or 0, tonumber(h[2]) or 0
      local estimate = prev * (window - elapsed) / window + curr
      free[i] = math.max(0, floor(limit - estimate))
      reset = (cur + 1) * window - now
      if estimate + cost <= limit or force then
        allowed, remaining = 1, math.max(0, floor(limit - estimate - cost))
        wa[i] = 1
      else
        remaining = math.max(0, floor(limit - estimate))
        if cost > limit then
          retry = -1
        elseif prev > 0 and curr + cost <= limit then
          retry = math.max(1, math.ceil(window - (limit - curr - cost) * window / prev) - elapsed)
        else
          retry = reset
        end
      end
    else
      -- GCRA: the theoretical arrival time, µs.
      local interval = floor(window * 1000 / limit)
      local burst = tonumber(ARGV[b + 4])
      local tat = math.max(tonumber(call('GET', key)) or now_us, now_us)
      local new_tat = tat + interval * cost
      local diff = now_us - (new_tat - interval * burst)
      free[i] = math.max(0, floor((now_us - (tat - interval * burst)) / interval))
      if diff >= 0 or force then
        allowed, remaining = 1, math.max(0, floor(diff / interval))
        reset = math.ceil((new_tat - now_us) / 1000)
        wa[i] = new_tat
      else
        reset = math.ceil((tat - now_us) / 1000)
        retry = cost > burst and -1 or math.ceil(-diff / 1000)
      end
    end
    if kind == '3' or kind == '4' or kind == '5' then
      quotas = quotas + 1
      if allowed == 1 or kind == '5' then open = open + 1 end
    elseif allowed == 0 and kind ~= '1' then
      admitted = 0
    end
    if given == 0 then wa[i] = nil end
    if (peek or given == 0) and allowed == 1 then remaining = remaining + cost end
    local r = #reply
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = allowed, remaining, reset, retry
  end
  if quotas > 0 and open == 0 then admitted = 0 end
  reply[1] = admitted
  if admitted == 0 and not peek then
    -- Nothing is charged: every policy reports what it has left as it is.
    for i = 1, n do reply[2 + (i - 1) * 4 + 2] = free[i] end
  end
  if peek then return reply end
  -- A settle records what was used, a refund gives units back: applied whatever the other
  -- policies decide.
  for i = 1, n do
    local b = ab + 2 + (i - 1) * 6
    if ARGV[b + 5] == '8' and tonumber(ARGV[b + 6]) > 0 then
      reply[2 + (i - 1) * 4 + 2] = refund(KEYS[kb + i], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
        tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 6]), now, now_us)
    elseif ARGV[b + 5] == '7' and ARGV[b + 1] == '1' then
      local r, c, x = settle(KEYS[kb + i], KEYS[kb + i + 1], now, tonumber(ARGV[b + 3]),
        tonumber(ARGV[ab + 2 + 6 * n + i]) or 0, ARGV[b + 10], tonumber(ARGV[b + 6]),
        tonumber(ARGV[b + 8]), tonumber(ARGV[b + 9]))
      local at = 2 + i * 4
      reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = r, c, x, 0
    end
  end
  if admitted == 0 then return reply end
  for i = 1, n do
    local w = wa[i]
    if w then
      local b = ab + 2 + (i - 1) * 6
      local algo, window, cost = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 6])
      local key = KEYS[kb + i]
      local kind = ARGV[b + 5]
      if algo == 1 and (kind == '6' or kind == '7') then
        if kind == '6' then
          reserve(key, KEYS[kb + i + 1], now, window, tonumber(ARGV[ab + 2 + 6 * n + i]) or 0,
            ARGV[b + 10], cost, tonumber(ARGV[b + 8]))
        end
      elseif algo == 1 then
        if w == 1 then
          call('HINCRBY', key, 'n', cost)
        else
          -- A new window: its first write sets the expiry (the hash never outlives its window).
          local cur = floor(now / window)
          call('HSET', key, 'w', cur, 'n', cost)
          call('PEXPIREAT', key, (cur + 1) * window + (tonumber(ARGV[ab + 2 + 6 * n + i]) or 0))
        end
      elseif algo == 2 then
        call('ZREMRANGEBYSCORE', key, '-inf', now - window)
        for j = 1, cost do call('ZADD', key, now, ARGV[ab + 1] .. ':' .. i .. ':' .. j) end
        call('PEXPIRE', key, window)
      elseif algo == 3 then
        local cur = floor(now / window)
        if call('HINCRBY', key, cur, cost) == cost then
          -- The window's first write: drop the one before the previous, move the expiry.
          call('HDEL', key, cur - 2)
          call('PEXPIREAT', key, (cur + 2) * window + (tonumber(ARGV[ab + 2 + 6 * n + i]) or 0))
        end
      else
        call('SET', key, string.format('%d', w), 'PX', math.ceil((w - now_us) / 1000) + 1)
      end
    end
  end
  return reply
end
