-- The last ARGV says how many keys are counter keys; the other kinds follow them.
local ncount = tonumber(ARGV[#ARGV])
