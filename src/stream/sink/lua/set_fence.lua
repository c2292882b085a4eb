-- Reply contract and arguments: see src/stream/sink/script.rs. Values arrive as ARGV, never in the text.
local mtype = redis.call('TYPE', KEYS[2]).ok
if mtype ~= 'none' and mtype ~= 'hash' then redis.call('DEL', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSETNX', KEYS[2], 'created_ms', ARGV[3])
return 1
