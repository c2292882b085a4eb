-- The expiry argument of quota and pool scripts: `<ms>`, an absolute Unix time (the end of a
-- sale), or `+<ms>`, a time to live counted by Redis' own clock from this call, so a host
-- whose clock is off cannot make the state expire at once (or live on).
local function expire(key, spec)
  if string.sub(spec, 1, 1) == '+' then
    return redis.call('PEXPIRE', key, string.sub(spec, 2))
  end
  return redis.call('PEXPIREAT', key, spec)
end
