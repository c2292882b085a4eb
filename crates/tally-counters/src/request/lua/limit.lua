-- Rate limits: decide a request of cost ARGV[1] against every policy in one atomic step, on
-- Redis server time. A policy is recorded only if the whole request is admitted, so a denied
-- request costs nothing and limit+1 requests never pass (each policy counts before it adds).
-- KEYS[i]: the state of policy i. ARGV: cost, request id (unique: members of sliding logs),
-- mode ('apply' or 'peek'), then per policy 5 values: algorithm (1 fixed window, 2 sliding log,
-- 3 sliding window counter, 4 GCRA), limit, window ms, burst (GCRA), shadow (1: never denies).
-- Reply: {admitted, now_ms, then per policy: allowed, remaining, reset_ms, retry_after_ms}
-- (retry_after_ms -1: this cost can never pass this policy).
local cost = tonumber(ARGV[1])
local id = ARGV[2]
local peek = ARGV[3] == 'peek'
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local n = #KEYS
local verdicts, writes = {}, {}
local admitted = 1

local function fixed(key, limit, window)
  local cur = math.floor(now / window)
  local reset = (cur + 1) * window
  local h = redis.call('HMGET', key, 'w', 'n')
  local used, same = 0, tonumber(h[1]) == cur
  if same then used = tonumber(h[2]) or 0 end
  if used + cost <= limit then
    return {1, limit - used - cost, reset - now, 0}, function()
      if same then
        redis.call('HINCRBY', key, 'n', cost)
      else
        -- A new window: its first write sets the expiry (the hash never outlives its window).
        redis.call('HSET', key, 'w', cur, 'n', cost)
        redis.call('PEXPIREAT', key, reset)
      end
    end
  end
  local retry = cost > limit and -1 or reset - now
  return {0, limit - used, reset - now, retry}
end

local function sliding_log(key, limit, window)
  local from = now - window
  local used = redis.call('ZCOUNT', key, '(' .. from, '+inf')
  if used + cost <= limit then
    return {1, limit - used - cost, window, 0}, function()
      redis.call('ZREMRANGEBYSCORE', key, '-inf', from)
      for j = 1, cost do redis.call('ZADD', key, now, id .. ':' .. j) end
      redis.call('PEXPIRE', key, window)
    end
  end
  if cost > limit then return {0, limit - used, window, -1} end
  -- The request fits once the (used + cost - limit) oldest live entries have left the window.
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. from, '+inf', 'WITHSCORES', 'LIMIT', used + cost - limit - 1, 1)
  local retry = tonumber(live[2]) + window - now
  return {0, limit - used, retry, retry}
end

local function sliding_counter(key, limit, window)
  local cur = math.floor(now / window)
  local elapsed = now - cur * window
  local h = redis.call('HMGET', key, tostring(cur), tostring(cur - 1))
  local curr, prev = tonumber(h[1]) or 0, tonumber(h[2]) or 0
  local estimate = prev * (window - elapsed) / window + curr
  local reset = (cur + 1) * window - now
  if estimate + cost <= limit then
    return {1, math.floor(limit - estimate - cost), reset, 0}, function()
      if redis.call('HINCRBY', key, tostring(cur), cost) == cost then
        -- The window's first write: drop the one before the previous, move the expiry.
        redis.call('HDEL', key, tostring(cur - 2))
        redis.call('PEXPIREAT', key, (cur + 2) * window)
      end
    end
  end
  local retry
  if cost > limit then
    retry = -1
  elseif prev > 0 and curr + cost <= limit then
    retry = math.ceil(window - (limit - curr - cost) * window / prev) - elapsed
  else
    retry = reset
  end
  return {0, math.max(0, math.floor(limit - estimate)), reset, math.max(retry, 1)}
end

local function gcra(key, limit, window, burst)
  local interval = math.floor(window * 1000 / limit)
  local tolerance = interval * burst
  local tat = math.max(tonumber(redis.call('GET', key)) or now_us, now_us)
  local new_tat = tat + interval * cost
  local diff = now_us - (new_tat - tolerance)
  if diff >= 0 then
    local remaining = math.floor(diff / interval)
    return {1, remaining, math.ceil((new_tat - now_us) / 1000), 0}, function()
      redis.call('SET', key, string.format('%d', new_tat), 'PX', math.ceil((new_tat - now_us) / 1000) + 1)
    end
  end
  local retry = cost > burst and -1 or math.ceil(-diff / 1000)
  return {0, 0, math.ceil((tat - now_us) / 1000), retry}
end

local algorithms = {fixed, sliding_log, sliding_counter, gcra}
for i = 1, n do
  local base = 3 + (i - 1) * 5
  local algo = algorithms[tonumber(ARGV[base + 1])]
  local verdict, write = algo(KEYS[i], tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]))
  verdicts[i] = verdict
  writes[i] = write
  if verdict[1] == 0 and ARGV[base + 5] ~= '1' then admitted = 0 end
end
local reply = {admitted, now}
for i = 1, n do
  if admitted == 1 and not peek and writes[i] then writes[i]() end
  for j = 1, 4 do reply[#reply + 1] = verdicts[i][j] end
end
return reply
