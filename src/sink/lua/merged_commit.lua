-- Record every partition's applied offset and its copy in the state marker.
for j = 1, m do
  redis.call('SET', KEYS[j + 1], ARGV[3 * j + 3])
  redis.call('HSET', KEYS[1], ARGV[3 * j + 1], ARGV[3 * j + 3])
  -- Optional: one watermark per fence after the counter keys' pairs.
  note_watermark(KEYS[1], ARGV[3 * j + 1], ARGV[abase + 2 * ncount + j - 1], now)
end
return {1, late, overflow, rejected}
