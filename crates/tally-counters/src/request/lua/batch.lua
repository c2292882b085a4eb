-- Group commit: several callers' decisions in one script call, each run in order by the
-- `decide(kb, ab, n, now_us)` of the script this text is appended to, each with its own reply. A batch
-- is not a transaction across callers: a decision that raises an error (a key of the wrong type)
-- gets that error as its reply and the next decision runs as if it had been sent alone. The
-- decisions share one reading of the server clock (they run in one atomic step).
-- ARGV: the number of decisions D, then per decision its key count and its ARGV count, then each
-- decision's ARGV in order. KEYS: each decision's keys in order.
-- Reply: one element per decision, in order: that decision's reply (an array), or the error it
-- raised as a status string 'CODE message' (not a nested error reply: clients such as redis-rs
-- turn a nested error into an error of the whole call, which would fail every caller).
local count = tonumber(ARGV[1])
local out = {}
local kb, ab = 0, 1 + 2 * count
local now_us = clock()
for d = 1, count do
  local nk, na = tonumber(ARGV[2 * d]), tonumber(ARGV[2 * d + 1])
  local ok, r = pcall(decide, kb, ab, nk, now_us)
  if ok then
    out[d] = r
  elseif type(r) == 'table' and r.err then
    out[d] = redis.status_reply(r.err)
  else
    out[d] = redis.status_reply('ERR ' .. tostring(r))
  end
  kb, ab = kb + nk, ab + na
end
return out
