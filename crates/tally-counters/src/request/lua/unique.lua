-- Unique items in a sliding window: record item ARGV[2] as seen now (server time) in KEYS[1], a
-- sorted set item -> last seen (ms), drop items not seen within ARGV[1] ms and, beyond ARGV[3]
-- items, the least recently seen ones; return how many distinct items were seen within it (at
-- most ARGV[3]). ARGV[2] empty: only count (peek).
-- Reply: {count, now_ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
if ARGV[2] == '' then
  return {redis.call('ZCOUNT', KEYS[1], '(' .. (now - window), '+inf'), now}
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local n = redis.call('ZCARD', KEYS[1])
local max = tonumber(ARGV[3])
if n > max then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - max - 1)
  n = max
end
redis.call('PEXPIRE', KEYS[1], window)
return {n, now}
