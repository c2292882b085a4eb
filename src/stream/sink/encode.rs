//! Encoding a flush: its units planned into script calls (merged where they can be), grouped by
//! shard (one slot on a cluster), and encoded into pipelines one bounded chunk at a time. Free
//! functions over a [`Plan`]: the sink sends a flush with them, and the kept flushes
//! (`reapply.rs`) are sent again with them.
//!
//! A flush keeps its planned calls (compact: the aggregator's key arena) until it lands, so that
//! a retry can send them again, and encodes only the chunk being sent. Encoding a whole flush of
//! 100,000 keys at once held it three times more (the commands, the packed pipeline and the
//! connection's write buffer: about 30 MB, 350 MB for a million keys on revoke or shutdown).

use super::link::Scripts;
use super::reply::{ReplyError, UnitMeta};
use super::{conn, merge, script, AttemptError, FenceScope};
use crate::stream::aggregate::FlushUnit;

/// Keys encoded into one pipeline (at least one call): large enough that the round trips
/// between chunks cost little (ten per 100,000-key flush), small enough that a chunk's
/// encoding stays around a megabyte.
pub const CHUNK_KEYS: usize = 10_000;

/// A flush, planned: the calls of each shard in the order they must be sent.
pub(super) struct Plan {
    pub(super) groups: Vec<Vec<merge::Call>>,
    /// Existing keys are checked for a missing expiry (every `ttl_check_every`-th flush).
    pub(super) check_ttl: bool,
}

impl Plan {
    /// Plan `units` into script calls grouped by shard (merging up to `max_merged_keys` keys
    /// into one call). Units of one (partition, shard) stay in order inside their group.
    pub(super) fn new(units: Vec<FlushUnit>, max_merged_keys: usize, check_ttl: bool) -> Plan {
        let mut groups: Vec<Vec<merge::Call>> = Vec::new();
        let mut group_of_shard: std::collections::HashMap<u32, usize> =
            std::collections::HashMap::new();
        for call in merge::plan(units, max_merged_keys) {
            let g = *group_of_shard.entry(call.shard()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(call);
        }
        Plan { groups, check_ttl }
    }
}

/// Send one shard's `calls` in order, one chunk of about [`CHUNK_KEYS`] keys per pipeline, each
/// encoded just before it is sent; stops at the first failed chunk.
pub(super) async fn send_calls(
    mut conn: conn::Conn,
    calls: Vec<&merge::Call>,
    check_ttl: bool,
    scripts: &Scripts,
    scope: &FenceScope,
) -> Result<Vec<(UnitMeta, redis::Value)>, AttemptError> {
    let mut replies = Vec::with_capacity(calls.len());
    let mut next = 0;
    while next < calls.len() {
        let (pipe, metas) = encode_chunk(&calls[next..], check_ttl, scripts, scope);
        next += metas.len();
        let values = conn.pipe(&pipe).await?;
        if values.len() != metas.len() {
            return Err(AttemptError::Reply(ReplyError::Count {
                got: values.len(),
                sent: metas.len(),
            }));
        }
        replies.extend(metas.into_iter().zip(values));
    }
    Ok(replies)
}

/// Encode `calls` (the next calls of one group) into one pipeline of about [`CHUNK_KEYS`] keys;
/// returns it and what is needed to read its replies (one per call it took).
fn encode_chunk(
    calls: &[&merge::Call],
    check_ttl: bool,
    scripts: &Scripts,
    scope: &FenceScope,
) -> (redis::Pipeline, Vec<UnitMeta>) {
    let mut pipe = redis::pipe();
    let mut metas = Vec::new();
    let mut keys = 0;
    for &call in calls {
        if !metas.is_empty() && keys + call_keys(call) > CHUNK_KEYS {
            break;
        }
        keys += call_keys(call);
        let (cmd, meta) = encode_call(call, check_ttl, scripts, scope);
        pipe.add_command(cmd);
        metas.push(meta);
    }
    (pipe, metas)
}

/// One call's EVALSHA command, and what reading its reply needs.
fn encode_call(
    call: &merge::Call,
    check_ttl: bool,
    scripts: &Scripts,
    scope: &FenceScope,
) -> (redis::Cmd, UnitMeta) {
    let shard = call.shard();
    match call {
        merge::Call::FlushUnit(unit) => {
            let keys = scope.keys(unit.partition, unit.shard);
            let cmd = if unit.other.is_empty() {
                script::apply_cmd(scripts.apply.sha(), &keys, unit, check_ttl)
            } else {
                script::apply_kinds_cmd(scripts.apply_kinds.sha(), &keys, unit, check_ttl)
            };
            let meta = UnitMeta {
                partitions: smallvec::smallvec![unit.partition],
                merged: false,
                shard,
                keys: (unit.keys.len() + unit.other.len()) as u64,
            };
            (cmd, meta)
        }
        merge::Call::Merged(m) => {
            let fences: Vec<String> = m
                .ranges
                .iter()
                .map(|r| scope.key(r.partition, shard))
                .collect();
            let cmd = script::apply_merged_cmd(
                scripts.apply_merged.sha(),
                &scope.marker(shard),
                &fences,
                m,
                check_ttl,
            );
            let meta = UnitMeta {
                partitions: m.ranges.iter().map(|r| r.partition).collect(),
                merged: true,
                shard,
                keys: m.keys.len() as u64,
            };
            (cmd, meta)
        }
    }
}

/// Keys (and other entries) a call writes, for sizing chunks.
pub(super) fn call_keys(call: &merge::Call) -> usize {
    match call {
        merge::Call::FlushUnit(u) => u.items(),
        merge::Call::Merged(m) => m.keys.len(),
    }
}
