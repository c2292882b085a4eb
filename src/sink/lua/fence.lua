-- The fence check of apply and apply-kinds (script.rs joins the parts). Reply contract and
-- arguments: see src/sink/script.rs.
local mtype = redis.call('TYPE', KEYS[2]).ok
local code, value = fence_status(mtype, KEYS[2], KEYS[1], ARGV[4], tonumber(ARGV[1]),
  tonumber(ARGV[2]))
if code == -3 or code == -4 then return {code} end
if code ~= 1 then return {code, value} end
local check = ARGV[3] == '1'
local now = now_ms()
-- Where counts.lua finds the counter keys (KEYS) and their (delta, expiry) pairs (ARGV), and
-- the earliest of those expiries.
local kbase, abase, earliest = 3, 6, ARGV[5]
