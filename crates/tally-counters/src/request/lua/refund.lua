-- Refunds (kind '8': Envoy's `is_negative_hits`, and the compensation of a call spread over
-- several slots), used by limit.lua's `decide` (this text comes before it): `cost` units given
-- back to the policy's current state, never below empty, applied whatever the call's other
-- policies decide. Fixed window and sliding window counter: the current window's count goes
-- down (a window that has ended keeps its count); sliding log: its newest live entries leave;
-- GCRA: the theoretical arrival time moves back, never before now. Answers what is left under
-- the limit after it.
local function refund(key, algo, limit, window, burst, cost, now, now_us)
  local call, floor = redis.call, math.floor
  if algo == 1 or algo == 3 then
    local cur = floor(now / window)
    local field = 'n'
    if algo == 1 then
      if tonumber(call('HGET', key, 'w')) ~= cur then return limit end
    else
      field = tostring(cur)
    end
    local used = tonumber(call('HGET', key, field))
    if not used then return limit end
    local left = math.max(0, used - cost)
    call('HSET', key, field, left)
    return math.max(0, limit - left)
  elseif algo == 2 then
    local live = call('ZCOUNT', key, '(' .. (now - window), '+inf')
    local drop = math.min(cost, live)
    if drop > 0 then call('ZREMRANGEBYRANK', key, -drop, -1) end
    return math.max(0, limit - (live - drop))
  end
  local tat = tonumber(call('GET', key))
  if not tat or tat <= now_us then return limit end
  local interval = floor(window * 1000 / limit)
  local back = math.max(now_us, tat - interval * cost)
  if back <= now_us then
    call('DEL', key)
  else
    call('SET', key, string.format('%d', back), 'PX', math.ceil((back - now_us) / 1000) + 1)
  end
  return math.max(0, floor((now_us - (back - interval * burst)) / interval))
end
