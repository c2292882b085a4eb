//! The Lua scripts tally runs in Redis, the commands that call them, and their replies as types.
//!
//! One call of [`APPLY_LUA`] applies one [`Unit`]: it checks the partition's applied offset for
//! the unit's shard (compare-and-set), adds every delta, sets each new key's absolute expiry, and
//! records the new applied offset — atomically, because Redis runs a script without interleaving
//! other commands.
//!
//! Beside the applied offsets (*fences*) each shard has a *state marker*: a hash that never
//! expires, `<state_prefix>state:<group>:<topic>:<shard>`, with one field per partition holding a
//! copy of its applied offset. It lets tally tell apart "Redis lost everything" (no marker, no
//! fences: rebuild from Kafka) from "one fence is gone but the rest of the state is here" (the
//! marker still names the partition: replaying blindly would count twice, so the partition stops).

use redis::{Cmd, Value};
use tally_counters::script::int_array;

use crate::aggregate::Unit;
pub use crate::model::state_keys::StateKeys;

/// Applies a unit. KEYS: fence, marker, then the counter keys. ARGV: start, end, check (`1`: look
/// for existing keys without expiry), partition, the earliest expire-at of the counter keys, then
/// per counter key: delta, expire-at.
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
/// delta) gets PEXPIREAT window end + retention at once. An existing key already has its expiry
/// (tally set it when it created the key), so it costs one call; when `check` is set the script
/// also repairs existing keys that have none (made outside tally, or PERSISTed). The expiry is
/// passed through as the caller's text, so Redis never formats a Lua number.
///
/// An OOM error can only come from the first write (Redis lets a script that has written
/// finish), so returning it leaves nothing half-applied.
pub const APPLY_LUA: &str = concat!(
    include_str!("lua/fence.lua"),
    include_str!("lua/count_only.lua"),
    include_str!("lua/counts.lua"),
    include_str!("lua/commit.lua"),
);

/// Applies a unit that also holds other kinds (hash fields, distinct members, leaderboard
/// scores): the same fence, counts and reply as [`APPLY_LUA`]. KEYS: fence, marker, the counter
/// keys, then the other kinds' keys. ARGV: start, end, check, partition, the counter keys'
/// earliest expire-at, their (delta, expire-at) pairs, then per other key: op (`h` HINCRBY, `p` PFADD, `s` SADD, `z`
/// ZINCRBY), expire-at, n and n arguments (`h`: field, delta; `p`/`s`: members; `z`: member,
/// score pairs); last, the number of counter keys. Late, overflowing and refused keys are
/// counted as in [`APPLY_LUA`].
pub const APPLY_KINDS_LUA: &str = concat!(
    include_str!("lua/fence.lua"),
    include_str!("lua/kinds_head.lua"),
    include_str!("lua/counts.lua"),
    include_str!("lua/kinds.lua"),
    include_str!("lua/commit.lua"),
);

/// Applies a merged call ([`super::merge::Merged`]): the units of several partitions of one shard,
/// their deltas added up per key. KEYS: marker, one fence per partition, then the counter keys.
/// ARGV: m (the number of fences), check, the earliest expire-at of the counter keys, per fence
/// (partition, start, end), then per counter key (delta, expire-at).
///
/// Every fence is checked before anything is written; the call applies all of its ranges or
/// none. Replies, parsed by [`MergedReply::parse`]:
/// * `{1, late, overflow, rejected}`: applied, as [`APPLY_LUA`];
/// * `{0}`: every range was applied already (a retry);
/// * `{-9, code, value, ...}`: nothing written; per fence a code of [`APPLY_LUA`] (`1`: this
///   fence was as expected, `0`: already applied, `-1` … `-4`) and its value.
pub const APPLY_MERGED_LUA: &str = concat!(
    include_str!("lua/merged.lua"),
    include_str!("lua/counts.lua"),
    include_str!("lua/merged_commit.lua"),
);

/// What Redis answered to one [`APPLY_MERGED_LUA`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedReply {
    /// Applied (every range), or already applied (every range).
    All(ApplyReply),
    /// Nothing written: each fence's state, in the order of the call's ranges.
    Refused(Vec<ApplyReply>),
}

impl MergedReply {
    /// Parse a reply of [`APPLY_MERGED_LUA`].
    pub fn parse(value: &Value) -> Result<MergedReply, String> {
        let ints = int_array(value)?;
        if ints.first() != Some(&-9) {
            return ApplyReply::parse(value).map(MergedReply::All);
        }
        ints[1..]
            .chunks(2)
            .map(|pair| match *pair {
                [1, _] => Ok(ApplyReply::NotApplied),
                [0, _] => Ok(ApplyReply::AlreadyApplied),
                [-1, applied] => Ok(ApplyReply::Conflict { applied }),
                [-2, copy] => Ok(ApplyReply::FenceMissing {
                    marker_copy: Some(copy).filter(|n| *n >= 0),
                }),
                [-3, _] => Ok(ApplyReply::Corrupt),
                [-4, _] => Ok(ApplyReply::StateLost),
                _ => Err(format!("unknown merged apply status: {value:?}")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(MergedReply::Refused)
    }
}

/// The [`APPLY_MERGED_LUA`] call for `merged`: `marker` is its shard's, `fences` its ranges'.
pub fn apply_merged_cmd(
    sha: &str,
    marker: &str,
    fences: &[String],
    merged: &super::merge::Merged,
    check_ttl: bool,
) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(1 + fences.len() + merged.keys.len())
        .arg(marker);
    for f in fences {
        cmd.arg(f);
    }
    for (key, _) in &merged.keys {
        cmd.arg(&key[..]);
    }
    let earliest = merged
        .keys
        .iter()
        .map(|(_, d)| d.expire_at_ms)
        .min()
        .unwrap_or(0);
    cmd.arg(fences.len())
        .arg(if check_ttl { "1" } else { "0" })
        .arg(earliest);
    for r in &merged.ranges {
        cmd.arg(r.partition).arg(r.start).arg(r.end);
    }
    for (_, d) in &merged.keys {
        cmd.arg(d.delta).arg(d.expire_at_ms);
    }
    cmd
}

/// What Redis answered to one [`APPLY_LUA`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyReply {
    /// The unit was applied.
    Applied {
        /// Keys skipped because their expiry passed before the script ran.
        late: u64,
        /// Keys whose INCRBY would overflow a 64-bit integer (left unchanged).
        overflow: u64,
        /// Keys holding a value that is not an integer, or another type (left unchanged).
        rejected: u64,
    },
    /// Redis had already applied the unit's whole range (a retry or a replay).
    AlreadyApplied,
    /// Redis applied a different range: the caller's view is stale (zombie, or lost writes).
    Conflict {
        /// The offset Redis has applied up to.
        applied: i64,
    },
    /// The fence is gone but the marker still names the partition: part of the state was lost.
    FenceMissing {
        /// The marker's copy of the applied offset, if readable.
        marker_copy: Option<i64>,
    },
    /// The fence or marker holds something that is not an offset.
    Corrupt,
    /// No fence and no marker entry: Redis lost this shard's state.
    StateLost,
    /// Not applied because another partition of the same merged call was refused: nothing of
    /// the call was written.
    NotApplied,
}

impl ApplyReply {
    /// Parse a reply of [`APPLY_LUA`].
    pub fn parse(value: &Value) -> Result<ApplyReply, String> {
        let ints = int_array(value)?;
        let at = |i: usize| ints.get(i).copied().ok_or_else(|| format!("{value:?}"));
        let count = |i: usize| at(i).map(|n| n.max(0) as u64);
        Ok(match at(0)? {
            1 => ApplyReply::Applied {
                late: count(1)?,
                overflow: count(2)?,
                rejected: count(3)?,
            },
            0 => ApplyReply::AlreadyApplied,
            -1 => ApplyReply::Conflict { applied: at(1)? },
            -2 => ApplyReply::FenceMissing {
                marker_copy: Some(at(1)?).filter(|n| *n >= 0),
            },
            -3 => ApplyReply::Corrupt,
            -4 => ApplyReply::StateLost,
            _ => return Err(format!("unknown apply status: {value:?}")),
        })
    }
}

/// Reads (and where allowed creates) the fences of some partitions of one shard.
/// KEYS: marker, then one fence per partition. ARGV: now (ms), then per partition: its number and
/// where to start it if Redis has no state for it (`-1`: do not create). Returns per partition
/// `{code, value}`, parsed by [`FenceState::parse`]:
/// * `{1, applied}`: the fence exists (the marker's copy is refreshed);
/// * `{2, start}`: created at `start`: the partition is new to this state;
/// * `{-2, copy}`: the fence is missing but the marker names the partition (`copy`, or -1);
/// * `{-3, 0}`: the fence or marker holds something that is not an offset;
/// * `{-4, 0}`: no state and told not to create it.
pub const INIT_LUA: &str = include_str!("lua/init.lua");

/// What [`INIT_LUA`] found for one (partition, shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceState {
    /// The fence exists: Redis has applied up to here.
    Existing(i64),
    /// The state had nothing for the partition; its fence was created here.
    Created(i64),
    /// The fence is gone but the marker names the partition.
    Missing {
        /// The marker's copy of the applied offset, if readable.
        marker_copy: Option<i64>,
    },
    /// The fence or marker holds something that is not an offset.
    Corrupt,
    /// No state, and the caller asked not to create it.
    Absent,
}

impl FenceState {
    /// Parse one `{code, value}` item of an [`INIT_LUA`] reply.
    pub fn parse(value: &Value) -> Result<FenceState, String> {
        let ints = int_array(value)?;
        let (code, n) = match ints.as_slice() {
            [code, n] => (*code, *n),
            _ => return Err(format!("fence state: {value:?}")),
        };
        Ok(match code {
            1 => FenceState::Existing(n),
            2 => FenceState::Created(n),
            -2 => FenceState::Missing {
                marker_copy: Some(n).filter(|n| *n >= 0),
            },
            -3 => FenceState::Corrupt,
            -4 => FenceState::Absent,
            _ => return Err(format!("unknown fence state: {value:?}")),
        })
    }
}

/// Sets the fence of one (partition, shard) and its copy in the marker (operator repair); a
/// marker of another type (it then holds no copies) is replaced.
/// KEYS: fence, marker. ARGV: partition, offset, now (ms).
pub const SET_FENCE_LUA: &str = include_str!("lua/set_fence.lua");

/// The EVALSHA command applying `unit` with [`APPLY_KINDS_LUA`] (`sha`): for units holding
/// other kinds than counts.
pub fn apply_kinds_cmd(sha: &str, keys: &StateKeys, unit: &Unit, check_ttl: bool) -> Cmd {
    use crate::aggregate::Op;
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(unit.keys.len() + unit.other.len() + 2)
        .arg(&keys.fence)
        .arg(&keys.marker);
    for (key, _) in &unit.keys {
        cmd.arg(&key[..]);
    }
    for (key, other) in &unit.other {
        match other.op {
            Op::HashAdd { split, .. } => cmd.arg(&key[..split as usize]),
            _ => cmd.arg(&key[..]),
        };
    }
    cmd.arg(unit.start)
        .arg(unit.end)
        .arg(if check_ttl { "1" } else { "0" })
        .arg(unit.partition)
        .arg(earliest_expiry(unit));
    for (_, d) in &unit.keys {
        cmd.arg(d.delta).arg(d.expire_at_ms);
    }
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
    cmd.arg(unit.keys.len());
    cmd
}

/// The EVALSHA command applying `unit`; `check_ttl` says whether existing keys are checked for
/// a missing expiry.
/// The earliest expiry among a unit's counter keys (0 without any): while it is ahead, the
/// script skips the per-key lateness check.
fn earliest_expiry(unit: &Unit) -> i64 {
    unit.keys
        .iter()
        .map(|(_, d)| d.expire_at_ms)
        .min()
        .unwrap_or(0)
}

pub fn apply_cmd(sha: &str, keys: &StateKeys, unit: &Unit, check_ttl: bool) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(unit.keys.len() + 2)
        .arg(&keys.fence)
        .arg(&keys.marker);
    for (key, _) in &unit.keys {
        cmd.arg(&key[..]);
    }
    cmd.arg(unit.start)
        .arg(unit.end)
        .arg(if check_ttl { "1" } else { "0" })
        .arg(unit.partition)
        .arg(earliest_expiry(unit));
    for (_, d) in &unit.keys {
        cmd.arg(d.delta).arg(d.expire_at_ms);
    }
    cmd
}
