-- Every key is a counter key.
local ncount = #KEYS - 2
