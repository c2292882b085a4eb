//! The Lua scripts tally runs in Redis and the commands that call them; their replies are
//! parsed into the types of `reply.rs` (re-exported here).
//!
//! One call of [`APPLY_LUA`] applies one [`FlushUnit`]: it checks the partition's applied offset for
//! the unit's shard (compare-and-set), adds every delta, sets each new key's absolute expiry, and
//! records the new applied offset — atomically, because Redis runs a script without interleaving
//! other commands.
//!
//! Beside the applied offsets (*fences*) each shard has a *state marker*: a hash that never
//! expires, `<state_prefix>state:<group>:<topic>:<shard>`, with one field per partition holding a
//! copy of its applied offset. It lets tally tell apart "Redis lost everything" (no marker, no
//! fences: rebuild from Kafka) from "one fence is gone but the rest of the state is here" (the
//! marker still names the partition: replaying blindly would count twice, so the partition stops).
//!
//! Every script that reads a fence is `lua/prelude.lua` followed by a short script of its own
//! that only calls the prelude's functions: `fence_status` (the fence check and its codes, read
//! in Rust by [`FenceCode::from_pair`]), `now_ms`, `refused` (how a refused write is counted),
//! `apply_counts`, `apply_kinds`, `note_watermark`, and `apply_unit` (one unit: fence, writes,
//! commit; what [`APPLY_LUA`] and [`APPLY_KINDS_LUA`] both call). No variable crosses from one
//! file to another: every value is passed as an argument.

use redis::Cmd;

pub use super::reply::{ApplyReply, FenceCode, FenceState, MergedReply};
pub use crate::model::state_keys::StateKeys;
use crate::stream::aggregate::{FlushUnit, Keys};

/// Applies a unit. KEYS: fence, marker, then the counter keys. ARGV: start, end, check (`1`: look
/// for existing keys without expiry), partition, the earliest expire-at of the counter keys, then
/// per counter key: delta, expire-at; last, optionally, the partition's watermark (highest event
/// time, `-` for none), recorded in the marker with the applied offset (`note_watermark`).
/// The reply is parsed by [`ApplyReply::parse`]:
/// * `{1, late, overflow, rejected}`: applied; `late` keys skipped because their expiry had
///   passed, `overflow` keys whose INCRBY would overflow, `rejected` keys holding something that
///   is not an integer (both left untouched).
/// * `{0, applied}`: already applied (a retry or replay); nothing written.
/// * `{-1, applied}`: Redis has applied a different range: the caller's view is stale.
/// * `{-2, copy}`: the fence is missing but the marker names the partition (`copy`: the marker's
///   copy of the applied offset, `-1` if unreadable): part of tally's state was lost.
/// * `{-3}`: the fence or the marker holds something that is not an offset.
/// * `{-4}`: neither fence nor marker entry: Redis lost this shard's state (or never had it).
///
/// Counter values are written with INCRBY. A key created by this increment (INCRBY returned the
/// delta) gets PEXPIREAT its stored expiry at once (window end + retention, spread by the key's
/// hash: `model::stored_expire_at`, computed in Rust and passed per key). An existing key already has its expiry
/// (tally set it when it created the key), so it costs one call; when `check` is set the script
/// also repairs existing keys that have none (made outside tally, or PERSISTed). The expiry is
/// passed through as the caller's text, so Redis never formats a Lua number.
///
/// Every write script starts with `lua/prelude.lua`: the fence check (`fence_status`, also used
/// by [`INIT_LUA`]), Redis' clock and the classification of refused writes. An OOM error can only
/// come from the first write (Redis lets a script that has written finish), so returning it
/// leaves nothing half-applied.
pub const APPLY_LUA: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/apply.lua")
);

/// Applies a unit that also holds other kinds (hash fields, distinct members, leaderboard
/// scores): the same fence, counts and reply as [`APPLY_LUA`]. KEYS: fence, marker, the counter
/// keys, then the other kinds' keys. ARGV: start, end, check, partition, the counter keys'
/// earliest expire-at, their (delta, expire-at) pairs, then per other key: op (`h` HINCRBY, `p` PFADD, `s` SADD, `z`
/// ZINCRBY), expire-at, n and n arguments (`h`: field, delta; `p`/`s`: members; `z`: member,
/// score pairs); then optionally the watermark (as [`APPLY_LUA`]); last, the number of counter
/// keys. Late, overflowing and refused keys are
/// counted as in [`APPLY_LUA`].
pub const APPLY_KINDS_LUA: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/apply_kinds.lua")
);

/// Applies a merged call ([`super::merge::Merged`]): the units of several partitions of one shard,
/// their deltas added up per key. KEYS: marker, one fence per partition, then the counter keys.
/// ARGV: m (the number of fences), check, the earliest expire-at of the counter keys, per fence
/// (partition, start, end), then per counter key (delta, expire-at), then optionally one
/// watermark per fence (as [`APPLY_LUA`]).
///
/// Every fence is checked before anything is written; the call applies all of its ranges or
/// none. Replies, parsed by [`MergedReply::parse`]:
/// * `{1, late, overflow, rejected}`: applied, as [`APPLY_LUA`];
/// * `{0}`: every range was applied already (a retry);
/// * `{-9, code, value, ...}`: nothing written; per fence a code of [`APPLY_LUA`] (`1`: this
///   fence was as expected, `0`: already applied, `-1` … `-4`) and its value (`0` where
///   [`APPLY_LUA`] sends none).
pub const APPLY_MERGED_LUA: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/apply_merged.lua")
);

/// Reads (and where allowed creates) the fences of some partitions of one shard.
/// KEYS: marker, then one fence per partition. ARGV: now (ms), then per partition: its number and
/// where to start it if Redis has no state for it (`-1`: do not create). Returns per partition
/// `{code, value}`, parsed by [`FenceState::parse`]:
/// * `{1, applied}`: the fence exists (the marker's copy is refreshed);
/// * `{2, start}`: created at `start`: the partition is new to this state;
/// * `{-2, copy}`: the fence is missing but the marker names the partition (`copy`, or -1);
/// * `{-3, 0}`: the fence or marker holds something that is not an offset;
/// * `{-4, 0}`: no state and told not to create it.
pub const INIT_LUA: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/init.lua")
);

/// Sets the fence of one (partition, shard) and its copy in the marker (operator repair); a
/// marker of another type (it then holds no copies) is replaced.
/// KEYS: fence, marker. ARGV: partition, offset, now (ms).
pub const SET_FENCE_LUA: &str = include_str!("lua/set_fence.lua");

/// The EVALSHA command applying `unit` with [`APPLY_LUA`] (`sha`); `check_ttl` says whether
/// existing keys are checked for a missing expiry.
pub fn apply_cmd(sha: &str, keys: &StateKeys, unit: &FlushUnit, check_ttl: bool) -> Cmd {
    let mut cmd = evalsha(
        sha,
        unit.keys.len() + 2,
        [&*keys.fence, &*keys.marker],
        &unit.keys,
    );
    push_unit_args(&mut cmd, unit, check_ttl);
    push_watermark(&mut cmd, unit.max_event_ms);
    cmd
}

/// The EVALSHA command applying `unit` with [`APPLY_KINDS_LUA`] (`sha`): for units holding
/// other kinds than counts.
pub fn apply_kinds_cmd(sha: &str, keys: &StateKeys, unit: &FlushUnit, check_ttl: bool) -> Cmd {
    use crate::stream::aggregate::Op;
    let numkeys = unit.keys.len() + unit.other.len() + 2;
    let mut cmd = evalsha(sha, numkeys, [&*keys.fence, &*keys.marker], &unit.keys);
    for (key, other) in &unit.other {
        match other.op {
            Op::HashAdd { split, .. } => cmd.arg(&key[..split as usize]),
            _ => cmd.arg(&key[..]),
        };
    }
    push_unit_args(&mut cmd, unit, check_ttl);
    for (key, other) in &unit.other {
        match &other.op {
            Op::HashAdd { split, delta } => {
                cmd.arg("h").arg(other.expire_at_ms).arg(2);
                cmd.arg(&key[*split as usize..]).arg(*delta);
            }
            Op::Distinct { exact, members } => {
                cmd.arg(if *exact { "s" } else { "p" })
                    .arg(other.expire_at_ms)
                    .arg(members.len());
                for m in members {
                    cmd.arg(&**m);
                }
            }
            Op::Scores(scores) => {
                cmd.arg("z").arg(other.expire_at_ms).arg(2 * scores.len());
                for (m, score) in scores {
                    cmd.arg(&**m).arg(*score);
                }
            }
        }
    }
    push_watermark(&mut cmd, unit.max_event_ms);
    cmd.arg(unit.keys.len());
    cmd
}

/// The [`APPLY_MERGED_LUA`] call for `merged`: `marker` is its shard's, `fences` its ranges'.
pub fn apply_merged_cmd(
    sha: &str,
    marker: &str,
    fences: &[String],
    merged: &super::merge::Merged,
    check_ttl: bool,
) -> Cmd {
    let state = std::iter::once(marker).chain(fences.iter().map(String::as_str));
    let mut cmd = evalsha(
        sha,
        1 + fences.len() + merged.keys.len(),
        state,
        &merged.keys,
    );
    cmd.arg(fences.len())
        .arg(check_arg(check_ttl))
        .arg(earliest_expiry(&merged.keys));
    for r in &merged.ranges {
        cmd.arg(r.partition).arg(r.start).arg(r.end);
    }
    push_deltas(&mut cmd, &merged.keys);
    if merged.ranges.iter().any(|r| r.max_event_ms.is_some()) {
        for r in &merged.ranges {
            push_watermark(&mut cmd, Some(r.max_event_ms.unwrap_or(i64::MIN)));
        }
    }
    cmd
}

/// The optional last argument of a unit (before the count of counter keys in
/// [`APPLY_KINDS_LUA`]): the partition's highest event time, `-` for a range without events,
/// nothing at all when no counter has an output (see `note_watermark` in `lua/prelude.lua`).
fn push_watermark(cmd: &mut Cmd, max_event_ms: Option<i64>) {
    match max_event_ms {
        None => {}
        Some(i64::MIN) => {
            cmd.arg("-");
        }
        Some(t) => {
            cmd.arg(t);
        }
    }
}

/// `EVALSHA sha numkeys`, tally's own keys (`state`: fences, marker), then the counter keys.
fn evalsha<'a>(
    sha: &str,
    numkeys: usize,
    state: impl IntoIterator<Item = &'a str>,
    counters: &Keys,
) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(numkeys);
    for key in state {
        cmd.arg(key);
    }
    for (key, _) in counters {
        cmd.arg(key);
    }
    cmd
}

/// A unit's ARGV for [`APPLY_LUA`] and [`APPLY_KINDS_LUA`]: its range, the check flag, its
/// partition, the earliest expiry, then its counter keys' (delta, expire-at) pairs.
fn push_unit_args(cmd: &mut Cmd, unit: &FlushUnit, check_ttl: bool) {
    cmd.arg(unit.start)
        .arg(unit.end)
        .arg(check_arg(check_ttl))
        .arg(unit.partition)
        .arg(earliest_expiry(&unit.keys));
    push_deltas(cmd, &unit.keys);
}

/// Every counter key's (delta, expire-at), in the order of its KEYS.
fn push_deltas(cmd: &mut Cmd, counters: &Keys) {
    for d in counters.deltas() {
        cmd.arg(d.delta).arg(d.expire_at_ms);
    }
}

/// `1`: the script also repairs existing keys that have no expiry.
fn check_arg(check_ttl: bool) -> &'static str {
    if check_ttl {
        "1"
    } else {
        "0"
    }
}

/// The earliest expiry among the counter keys (0 without any): while it is ahead, the script
/// skips the per-key lateness check.
fn earliest_expiry(counters: &Keys) -> i64 {
    counters.deltas().map(|d| d.expire_at_ms).min().unwrap_or(0)
}
