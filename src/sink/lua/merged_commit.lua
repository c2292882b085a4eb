-- Record every partition's applied offset and its copy in the state marker.
for j = 1, m do
  redis.call('SET', KEYS[j + 1], ARGV[3 * j + 3])
  redis.call('HSET', KEYS[1], ARGV[3 * j + 1], ARGV[3 * j + 3])
end
return {1, late, overflow, rejected}
