-- Add items to a pool: KEYS[1] the items not yet given, KEYS[2] user -> item given. An item
-- already given is not added again. ARGV[1]: the expiry (`expire` in expiry.lua); then the items.
-- Reply: how many items were added.
local given = {}
for _, item in ipairs(redis.call('HVALS', KEYS[2])) do given[item] = true end
local added = 0
for i = 2, #ARGV do
  if not given[ARGV[i]] then added = added + redis.call('SADD', KEYS[1], ARGV[i]) end
end
expire(KEYS[1], ARGV[1])
return added
