-- Record the applied offset and its copy in the state marker.
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[2])
note_watermark(KEYS[2], ARGV[4], ARGV[watermark_at or (abase + 2 * ncount)], now)
return {1, late, overflow, rejected}
