//! The fence check: Redis can lose acknowledged writes (a failover to a replica that lagged, a
//! restore from an older copy) and take tally's applied offsets back with the counts, in one
//! piece. The next flush of such a partition finds out (a fence conflict, then a replay), but a
//! partition without new events has no next flush: its hole would stay, read by queries, the
//! reconciler and window results, until the counts' retention made it permanent. So the worker
//! re-reads the fences of every partition it counts, every `recovery.fence_check_interval` and
//! after each new connection of its sink (Redis came back, or the primary changed), compares
//! them with what it knows landed, and replays at once every partition that differs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ops::metrics::{Metrics, Rollback};
use crate::stream::aggregate::Aggregator;
use crate::stream::sink::{FenceState, PartitionFences};

use super::super::flush::{FenceReply, Flusher};
use super::super::partitions::PartitionStates;

/// When the fences are read next, and the read in progress.
pub(super) struct FenceWatch {
    /// `recovery.fence_check_interval`.
    every: Duration,
    /// When the last check started.
    last: Instant,
    /// The sink's connection count, and its value when the last check started.
    connections: Arc<AtomicU64>,
    seen: u64,
    /// The check sent and not answered yet.
    pending: Option<Check>,
}

/// A check sent to the sink: what each partition expected when it was sent.
struct Check {
    reply: FenceReply,
    /// (partition, applied offset expected per shard).
    expected: Vec<(i32, Vec<i64>)>,
}

impl FenceWatch {
    pub(super) fn new(every: Duration, connections: Arc<AtomicU64>) -> Self {
        FenceWatch {
            every,
            last: Instant::now(),
            seen: connections.load(Ordering::Relaxed),
            connections,
            pending: None,
        }
    }

    /// A check is due: the interval passed, or the sink connected again since the last one.
    fn due(&self) -> bool {
        self.last.elapsed() >= self.every || self.connections.load(Ordering::Relaxed) != self.seen
    }

    /// Start a fence check when one is due and no flush is in flight (so every unit sent has
    /// landed and the fences must equal the aggregator's starts); take the answer when it comes.
    /// Returns the partitions to replay. Called between messages: never waits.
    pub(super) fn poll(
        &mut self,
        agg: &Aggregator,
        flusher: &Flusher,
        parts: &PartitionStates,
        metrics: &Metrics,
    ) -> Vec<i32> {
        if let Some(check) = &self.pending {
            let answer = match check.reply.try_recv() {
                Err(TryRecvError::Empty) => return Vec::new(),
                Err(TryRecvError::Disconnected) => None,
                Ok(answer) => Some(answer),
            };
            let check = self.pending.take().expect("checked above");
            match answer {
                Some(Ok(fences)) => return compare(check, fences, agg, parts, metrics),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "fence check: redis did not answer; trying again")
                }
                None => {}
            }
            return Vec::new();
        }
        if !flusher.idle() || !self.due() {
            return Vec::new();
        }
        self.last = Instant::now();
        self.seen = self.connections.load(Ordering::Relaxed);
        let expected: Vec<(i32, Vec<i64>)> = agg
            .partitions()
            .filter(|&p| !parts.is_revoking(p))
            .filter_map(|p| Some((p, agg.expected_fences(p)?)))
            .collect();
        if expected.is_empty() {
            return Vec::new();
        }
        // -1: read only; a missing state is not created here.
        let request = expected.iter().map(|(p, _)| (*p, -1)).collect();
        if let Some(reply) = flusher.read_fences(request, parts.init_timeout()) {
            self.pending = Some(Check { reply, expected });
        }
        Vec::new()
    }
}

/// The partitions to replay: every one whose fences are not those that landed.
fn compare(
    check: Check,
    fences: PartitionFences,
    agg: &Aggregator,
    parts: &PartitionStates,
    metrics: &Metrics,
) -> Vec<i32> {
    let mut resync = Vec::new();
    for ((p, states), (_, expected)) in fences.into_iter().zip(check.expected) {
        let Some(found) = mismatch(&states, &expected) else {
            continue;
        };
        // A flush may have found it first (a fence conflict) and resynchronised it.
        if !agg.owns(p) || parts.is_revoking(p) {
            continue;
        }
        metrics
            .recovery
            .state_rollbacks
            .with_label_values(&[found.label()])
            .inc();
        tracing::error!(
                partition = p,
                ?expected,
                ?states,
                found = found.label(),
                "tally's applied offsets in redis are not those that landed (a failover lost acknowledged writes, an older copy was restored, or another process writes); replaying the partition from kafka"
            );
        resync.push(p);
    }
    resync
}

/// How the fences Redis holds differ from those expected, if they do.
fn mismatch(states: &[FenceState], expected: &[i64]) -> Option<Rollback> {
    let mut found = None;
    for (state, &want) in states.iter().zip(expected) {
        let this = match *state {
            FenceState::Existing(n) | FenceState::Created(n) if n == want => continue,
            FenceState::Existing(n) | FenceState::Created(n) if n < want => Rollback::Behind,
            FenceState::Existing(_) | FenceState::Created(_) => Rollback::Ahead,
            FenceState::Missing { .. } | FenceState::Corrupt | FenceState::Absent => Rollback::Lost,
        };
        // Lost outranks behind, which outranks ahead.
        found = Some(match (found, this) {
            (Some(Rollback::Lost), _) | (_, Rollback::Lost) => Rollback::Lost,
            (Some(Rollback::Behind), _) | (_, Rollback::Behind) => Rollback::Behind,
            _ => Rollback::Ahead,
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_that_landed_match_and_any_other_state_is_named() {
        let e = FenceState::Existing;
        assert_eq!(mismatch(&[e(5), e(7)], &[5, 7]), None);
        assert_eq!(mismatch(&[e(5), e(6)], &[5, 7]), Some(Rollback::Behind));
        assert_eq!(mismatch(&[e(9), e(7)], &[5, 7]), Some(Rollback::Ahead));
        assert_eq!(mismatch(&[e(9), e(6)], &[5, 7]), Some(Rollback::Behind));
        assert_eq!(
            mismatch(&[FenceState::Absent, e(6)], &[5, 7]),
            Some(Rollback::Lost)
        );
        let missing = FenceState::Missing { marker_copy: None };
        assert_eq!(mismatch(&[e(5), missing], &[5, 7]), Some(Rollback::Lost));
        assert_eq!(mismatch(&[FenceState::Corrupt], &[5]), Some(Rollback::Lost));
    }
}
