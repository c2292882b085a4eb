-- Applies one unit with other kinds; the last ARGV says how many keys are counter keys.
-- Reply contract and arguments: see script.rs (APPLY_KINDS_LUA).
return apply_unit(tonumber(ARGV[#ARGV]), true)
