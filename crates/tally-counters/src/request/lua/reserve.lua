-- Reservations of fixed-window policies (reserve → settle), used by limit.lua's `decide` (this
-- text comes before it). A reserving policy (kind '6': decided against settled usage plus live
-- reservations, and recorded as a reservation when it names a request id; kind '7': settles one)
-- is followed by its index entry (algorithm 5). The index's key is a sorted set of request ids
-- scored by when their record expires; its 6 ARGV values are: 5, expiry ms, most units a settle
-- may charge above its reservation, the request id ('' = none), kind, 0.
-- Besides the fixed window's {w, n}, the policy's hash holds t (units held by live
-- reservations), r:<id> (one live reservation's units) and s:<id> (that request was settled, so
-- a retried settle changes nothing). An admission counts n + t + its own cost against the limit.
local rcall, rfloor = redis.call, math.floor
-- Most expired records released by one call (the rest by the next: until then they still
-- count, which errs on the side of the limit).
local RELEASE_MOST = 64

-- Release expired records, then answer the units still reserved, and whether `id` (a new
-- reservation's request id; '' = none) is already live or settled (a reused id is denied: it
-- could otherwise pass unreserved).
local function held(key, idx, now, id)
  local gone = rcall('ZRANGEBYSCORE', idx, '-inf', now, 'LIMIT', 0, RELEASE_MOST)
  for _, g in ipairs(gone) do
    local units = rcall('HGET', key, 'r:' .. g)
    if units then rcall('HINCRBY', key, 't', -tonumber(units)) end
    rcall('HDEL', key, 'r:' .. g, 's:' .. g)
  end
  if #gone > 0 then rcall('ZREM', idx, unpack(gone)) end
  local taken = id ~= '' and rcall('ZSCORE', idx, id) ~= false
  return tonumber(rcall('HGET', key, 't')) or 0, taken
end

-- Add `units` to the current window's settled count.
local function charge(key, now, window, units)
  local cur = rfloor(now / window)
  if tonumber(rcall('HGET', key, 'w')) == cur then
    rcall('HINCRBY', key, 'n', units)
  else
    rcall('HSET', key, 'w', cur, 'n', units)
  end
end

-- Both keys live until the window ends (spread by `off`) or their last record expires
-- (`until_ms`), whichever is later; an expiry is only ever moved later.
local function keep(key, idx, now, window, off, until_ms)
  local at = math.max((rfloor(now / window) + 1) * window + off, until_ms)
  for _, k in ipairs({key, idx}) do
    local ttl = rcall('PTTL', k)
    if ttl == -1 or (ttl >= 0 and now + ttl < at) then rcall('PEXPIREAT', k, at) end
  end
end

-- Record an admitted reservation of `units` for `id` (or, without an id, charge them at once).
local function reserve(key, idx, now, window, off, id, units, expiry)
  if id == '' then
    charge(key, now, window, units)
    keep(key, idx, now, window, off, 0)
    return
  end
  rcall('HINCRBY', key, 't', units)
  rcall('HSET', key, 'r:' .. id, units)
  rcall('ZADD', idx, now + expiry, id)
  keep(key, idx, now, window, off, now + expiry)
end

-- Settle `id` with its true `cost`: its reservation is released and the cost charged, at most
-- `extra` above what was reserved; an id already settled changes nothing; one never reserved
-- (or whose reservation expired) is charged its cost. Answers {result (1 settled, 2 already
-- settled, 3 unreserved), units charged, units released, 0}.
local function settle(key, idx, now, window, off, id, cost, expiry, extra)
  if rcall('HEXISTS', key, 's:' .. id) == 1 then return 2, 0, 0 end
  local units = tonumber(rcall('HGET', key, 'r:' .. id))
  local result, charged, released = 3, cost, 0
  if units then
    result, charged, released = 1, math.min(cost, units + extra), units
    rcall('HDEL', key, 'r:' .. id)
    rcall('HINCRBY', key, 't', -units)
  elseif cost == 0 then
    return 3, 0, 0
  end
  if charged > 0 then charge(key, now, window, charged) end
  rcall('HSET', key, 's:' .. id, 1)
  rcall('ZADD', idx, now + expiry, id)
  keep(key, idx, now, window, off, now + expiry)
  return result, charged, released
end
