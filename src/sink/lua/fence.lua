-- The fence check shared by apply and apply-kinds (script.rs joins the parts). Reply contract
-- and arguments: see src/sink/script.rs. Values arrive as ARGV, never in the text.
local mtype = redis.call('TYPE', KEYS[2]).ok
local function missing()
  local copy = mtype == 'hash' and redis.call('HGET', KEYS[2], ARGV[4])
  if not copy then return {-4} end
  return {-2, tonumber(copy) or -1}
end
local start, stop = tonumber(ARGV[1]), tonumber(ARGV[2])
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' or (mtype ~= 'none' and mtype ~= 'hash') then return {-3} end
if not raw then return missing() end
local applied = tonumber(raw)
if applied == nil then return {-3} end
if applied >= stop then return {0, applied} end
if applied ~= start then return {-1, applied} end
local check = ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Where counts.lua finds the counter keys (KEYS) and their (delta, expiry) pairs (ARGV), and
-- the earliest of those expiries.
local kbase, abase, earliest = 3, 6, ARGV[5]
