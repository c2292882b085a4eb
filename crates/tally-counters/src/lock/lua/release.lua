-- Release: delete KEYS[1] only if it still holds this holder's token ARGV[1].
-- Reply: 1 released; 0 not held by this token (expired, or taken over: nothing deleted).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
