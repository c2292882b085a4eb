-- Applies one unit of counter keys. Reply contract and arguments: see script.rs (APPLY_LUA).
return apply_unit(#KEYS - 2, false)
