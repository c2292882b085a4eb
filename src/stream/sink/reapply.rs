//! Landed flushes kept in memory, to apply again what Redis takes back.
//!
//! Redis acknowledges a flush before its replicas have it: a failover to a replica that lagged,
//! or a restart from an older copy, loses the last flushes, counts and applied offsets together
//! (one script). tally would find out (a fence conflict on the next flush, or the fence check)
//! and replay those partitions from Kafka: exact, but it re-reads and re-counts every lost offset,
//! which after a Sentinel failover took most of a second on its own. The sink still holds those
//! flushes: it keeps the planned calls of the last landed flushes ([`Kept`], up to
//! `recovery.reapply_keys` entries), and on every new connection reads the fences of the
//! partitions they cover (with the fence check's reader, `fences.rs`, creating nothing). Where a
//! fence is behind what landed, it sends the calls again, oldest first, before anything else is
//! written. The fences make this exact: a call applies only where its partition's applied offset
//! is exactly its start, so what Redis still has is skipped, and a gap older than what is kept is
//! refused and left to the replay from Kafka as before. A call holds the same deltas for the
//! same offsets whoever writes them, so a range another process wrote since is either skipped or
//! written once.

use std::collections::{HashMap, VecDeque};

use super::encode::{self, call_keys, Plan};
use super::link::Scripts;
use super::script::FenceState;
use super::{conn, fences, merge, AttemptError, FenceScope, FlushOutcome};
use crate::ops::metrics::Metrics;

/// The planned calls of the last landed flushes, oldest first, up to `cap` entries.
#[derive(Default)]
pub(super) struct Kept {
    plans: VecDeque<(Plan, usize)>,
    /// Entries held (keys, hash fields, members, scores).
    entries: usize,
    /// `recovery.reapply_keys` (0: keep nothing).
    cap: usize,
}

impl Kept {
    pub(super) fn new(cap: usize) -> Kept {
        Kept {
            cap,
            ..Kept::default()
        }
    }

    /// Keep a landed flush, forgetting the oldest beyond the cap. A flush larger than the cap
    /// forgets everything: what is kept must run up to the last landed flush to be of use.
    pub(super) fn keep(&mut self, plan: Plan) {
        if self.cap == 0 {
            return;
        }
        let entries: usize = plan.groups.iter().flatten().map(call_keys).sum();
        if entries > self.cap {
            self.forget();
            return;
        }
        self.entries += entries;
        self.plans.push_back((plan, entries));
        while self.entries > self.cap {
            let (_, n) = self.plans.pop_front().expect("entries held");
            self.entries -= n;
        }
    }

    /// Keep nothing of what was kept.
    pub(super) fn forget(&mut self) {
        self.plans.clear();
        self.entries = 0;
    }

    /// Each (partition, shard) the kept calls cover, and where the last of them ends.
    fn last_ends(&self) -> HashMap<(i32, u32), i64> {
        let mut ends = HashMap::new();
        for call in self
            .plans
            .iter()
            .flat_map(|(p, _)| p.groups.iter().flatten())
        {
            for (p, shard, _, end) in ranges(call) {
                ends.insert((p, shard), end);
            }
        }
        ends
    }
}

/// (partition, shard, start, end) of each range `call` applies.
fn ranges(call: &merge::Call) -> Vec<(i32, u32, i64, i64)> {
    match call {
        merge::Call::FlushUnit(u) => vec![(u.partition, u.shard, u.start, u.end)],
        merge::Call::Merged(m) => m
            .ranges
            .iter()
            .map(|r| (r.partition, m.shard, r.start, r.end))
            .collect(),
    }
}

/// What applying the kept calls again did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Reapplied {
    /// Offset ranges written again.
    pub(super) ranges: u64,
    /// Ranges refused: Redis lost more than is kept (the fence check replays those from Kafka).
    pub(super) refused: u64,
    /// The partitions found behind.
    pub(super) partitions: Vec<i32>,
}

/// What sending the kept calls needs besides the connection: the scripts' SHAs and the names
/// of the fences.
pub(super) struct ReapplyTarget<'a> {
    pub(super) scripts: &'a Scripts,
    pub(super) scope: &'a FenceScope,
}

impl Kept {
    /// On a new connection (`conn`): [`Kept::reapply_lost`], logged and counted. A reply outside
    /// the scripts' contract forgets what is kept (the fence check replays from Kafka), so it
    /// cannot block the sink.
    pub(super) async fn reapply_if_lost(
        &mut self,
        conn: &conn::Conn,
        target: ReapplyTarget<'_>,
        metrics: &Metrics,
    ) -> Result<(), AttemptError> {
        match self.reapply_lost(conn, &target).await {
            Ok(Some(done)) => note_reapplied(&done, metrics),
            Ok(None) => {}
            Err(e @ AttemptError::Redis(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the kept flushes again; the fence check replays from kafka");
                self.forget();
            }
        }
        Ok(())
    }

    /// Send again the kept calls whose ranges Redis no longer has (see the module). Nothing is
    /// sent when every fence is where the last flush left it.
    async fn reapply_lost(
        &self,
        conn: &conn::Conn,
        target: &ReapplyTarget<'_>,
    ) -> Result<Option<Reapplied>, AttemptError> {
        let last = self.last_ends();
        if last.is_empty() {
            return Ok(None);
        }
        let behind = behind(conn, target.scope, &last).await?;
        if behind.is_empty() {
            return Ok(None);
        }
        let (groups, sent) = self.past(&behind);
        let results = futures::future::join_all(groups.into_values().map(|calls| {
            encode::send_calls(conn.clone(), calls, false, target.scripts, target.scope)
        }))
        .await;
        let mut outcome = FlushOutcome::default();
        for result in results {
            for (call, reply) in &result? {
                outcome.absorb(call, reply)?;
            }
        }
        let refused = outcome.refusals.len() as u64;
        let mut partitions: Vec<i32> = behind.keys().map(|(p, _)| *p).collect();
        partitions.sort_unstable();
        partitions.dedup();
        Ok(Some(Reapplied {
            ranges: sent.saturating_sub(outcome.already_applied + refused),
            refused,
            partitions,
        }))
    }

    /// Per shard, in the order they landed: every kept call with a range past its fence in
    /// `behind`; and how many ranges those calls hold.
    fn past(&self, behind: &HashMap<(i32, u32), i64>) -> (HashMap<u32, Vec<&merge::Call>>, u64) {
        let mut groups: HashMap<u32, Vec<&merge::Call>> = HashMap::new();
        let mut sent = 0u64;
        for call in self
            .plans
            .iter()
            .flat_map(|(p, _)| p.groups.iter().flatten())
        {
            let rs = ranges(call);
            if rs
                .iter()
                .any(|(p, s, _, end)| behind.get(&(*p, *s)).is_some_and(|f| f < end))
            {
                sent += rs.len() as u64;
                groups.entry(call.shard()).or_default().push(call);
            }
        }
        (groups, sent)
    }
}

/// Log and count what [`Kept::reapply_lost`] did.
fn note_reapplied(done: &Reapplied, metrics: &Metrics) {
    metrics.recovery.reapplied_ranges.inc_by(done.ranges);
    tracing::error!(
        partitions = ?done.partitions,
        ranges = done.ranges,
        refused = done.refused,
        "redis had lost flushes it acknowledged (a failover to a replica that lagged, or an older copy restored); applied them again from memory{}",
        if done.refused > 0 { "; the rest is replayed from kafka" } else { "" }
    );
}

/// The (partition, shard) pairs of `last` whose fence is behind where the kept calls end, and
/// that fence. Read with the fence reader ([`fences::read`]), creating nothing; a fence that is
/// missing or not an offset is left out (the flush path reports those).
async fn behind(
    conn: &conn::Conn,
    scope: &FenceScope,
    last: &HashMap<(i32, u32), i64>,
) -> Result<HashMap<(i32, u32), i64>, AttemptError> {
    let mut by_shard: HashMap<u32, Vec<(i32, i64)>> = HashMap::new();
    for &(p, s) in last.keys() {
        by_shard.entry(s).or_default().push((p, -1));
    }
    let reads: Vec<fences::ShardRead<'_>> = by_shard.iter().map(|(s, ps)| (*s, &ps[..])).collect();
    let states = fences::read(conn, scope, &reads).await?;
    let mut behind = HashMap::new();
    for (&(shard, partitions), states) in reads.iter().zip(states) {
        for (&(p, _), state) in partitions.iter().zip(states) {
            let FenceState::Existing(fence) = state else {
                continue;
            };
            if last.get(&(p, shard)).is_some_and(|end| fence < *end) {
                behind.insert((p, shard), fence);
            }
        }
    }
    Ok(behind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::aggregate::{Delta, FlushUnit, Keys};

    /// A unit of partition `partition` writing `keys` keys.
    fn unit(partition: i32, start: i64, end: i64, keys: usize) -> merge::Call {
        let mut k = Keys::default();
        for i in 0..keys {
            let delta = Delta {
                delta: 1,
                expire_at_ms: 0,
            };
            k.push(format!("k{i}").as_bytes(), delta);
        }
        merge::Call::FlushUnit(FlushUnit {
            partition,
            shard: 0,
            start,
            end,
            keys: k,
            other: Vec::new(),
            max_event_ms: None,
        })
    }

    fn plan(calls: Vec<merge::Call>) -> Plan {
        Plan {
            groups: vec![calls],
            check_ttl: false,
        }
    }

    #[test]
    fn the_last_flushes_are_kept_up_to_the_cap_and_end_where_they_landed() {
        let mut kept = Kept::new(10);
        kept.keep(plan(vec![unit(1, 0, 5, 4)]));
        assert_eq!(kept.last_ends(), HashMap::from([((1, 0), 5)]));
        kept.keep(plan(vec![unit(1, 5, 9, 3), unit(2, 0, 3, 2)]));
        assert_eq!(kept.last_ends(), HashMap::from([((1, 0), 9), ((2, 0), 3)]));
        assert_eq!((kept.plans.len(), kept.entries), (2, 9));
        // Past the cap the oldest goes.
        kept.keep(plan(vec![unit(2, 3, 4, 2)]));
        assert_eq!((kept.plans.len(), kept.entries), (2, 7));
        assert_eq!(kept.last_ends(), HashMap::from([((1, 0), 9), ((2, 0), 4)]));
        // A flush larger than the cap leaves nothing: what is kept must reach the last flush.
        kept.keep(plan(vec![unit(1, 9, 12, 11)]));
        assert_eq!((kept.plans.len(), kept.entries), (0, 0));
        // Off: nothing is kept.
        let mut off = Kept::new(0);
        off.keep(plan(vec![unit(1, 0, 5, 0)]));
        assert!(off.last_ends().is_empty());
    }
}
