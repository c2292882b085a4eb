//! The Lua flush script and the commands that call it.
//!
//! One call applies one [`Unit`]: it checks the partition's applied offset for the unit's shard
//! (compare-and-set), adds every delta, sets each new key's absolute expiry, and records the new
//! applied offset — atomically, because Redis runs a script without interleaving other commands.

use redis::Cmd;

use crate::aggregate::Unit;

/// Applies a unit. Returns `{status, a, b}`:
/// * `{1, late, rejected}`: applied; `late` keys skipped because their expiry had passed,
///   `rejected` keys whose value was not an integer (left untouched, counted).
/// * `{0, applied, 0}`: already applied (a retry or replay); nothing written.
/// * `{-1, applied, 0}`: Redis has applied a different range: the caller's view is stale.
/// * `{-2, -1, 0}`: no applied offset recorded for this (partition, shard).
///
/// ARGV: start, end, check (`1`: look for keys without expiry), then per key: delta, expire-at.
///
/// Counter values are written with INCRBY. A key created by this increment (INCRBY returned the
/// delta) gets PEXPIREAT window end + retention at once. An existing key already has its expiry
/// (tally set it when it created the key), so it costs one call; when `check` is set the script
/// also repairs existing keys that have none (made outside tally, or PERSISTed). The expiry is
/// passed through as the caller's text, so Redis never formats a Lua number.
///
/// An OOM error can only come from the first write (Redis lets a script that has written
/// finish), so returning it leaves nothing half-applied.
pub const APPLY_LUA: &str = r#"
local applied = tonumber(redis.call('GET', KEYS[1]))
local start, stop = tonumber(ARGV[1]), tonumber(ARGV[2])
if applied == nil then return {-2, -1, 0} end
if applied >= stop then return {0, applied, 0} end
if applied ~= start then return {-1, applied, 0} end
local check = ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local late, rejected = 0, 0
for i = 2, #KEYS do
  local at = ARGV[2 * i + 1]
  if tonumber(at) <= now then
    late = late + 1
  else
    local d = ARGV[2 * i]
    local r = redis.pcall('INCRBY', KEYS[i], d)
    if type(r) == 'table' and r.err then
      if string.sub(r.err, 1, 3) == 'OOM' then return redis.error_reply(r.err) end
      rejected = rejected + 1
    elseif r == tonumber(d) then
      redis.call('PEXPIREAT', KEYS[i], at)
    elseif check and redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], at)
    end
  end
end
redis.call('SET', KEYS[1], ARGV[2])
return {1, late, rejected}
"#;

/// Sets the applied offset of a (partition, shard) if it has none, and returns the current one.
pub const INIT_LUA: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return tonumber(redis.call('GET', KEYS[1]))
"#;

/// The EVALSHA command applying `unit`, whose applied offset lives at `fence_key`, checking
/// every existing key for a missing expiry.
pub fn apply_cmd(sha: &str, fence_key: &str, unit: &Unit) -> Cmd {
    apply_cmd_with(sha, fence_key, unit, true)
}

/// Like [`apply_cmd`]; `check_ttl` says whether existing keys are checked for a missing expiry.
pub fn apply_cmd_with(sha: &str, fence_key: &str, unit: &Unit, check_ttl: bool) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(unit.keys.len() + 1).arg(fence_key);
    for (key, _) in &unit.keys {
        cmd.arg(&key[..]);
    }
    cmd.arg(unit.start)
        .arg(unit.end)
        .arg(if check_ttl { "1" } else { "0" });
    for (_, d) in &unit.keys {
        cmd.arg(d.delta).arg(d.expire_at_ms);
    }
    cmd
}

/// Where the applied offset of (partition, shard) lives (`tag`: the shard's cluster hash tag). Group and topic are escaped like
/// dimension values so that no two (group, topic, partition, shard) share a key.
pub fn fence_key(
    prefix: &str,
    group: &str,
    topic: &str,
    partition: i32,
    shard: u32,
    tag: Option<&str>,
) -> String {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(b"applied:");
    crate::key::escape_into(&mut buf, group);
    buf.push(b':');
    crate::key::escape_into(&mut buf, topic);
    buf.extend_from_slice(format!(":{partition}:{shard}").as_bytes());
    if let Some(tag) = tag {
        // Same slot as the shard's counter keys, so one script can update both.
        buf.extend_from_slice(format!(":{{{tag}}}").as_bytes());
    }
    String::from_utf8(buf).expect("escaped text stays UTF-8")
}
