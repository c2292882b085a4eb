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

use rdkafka::consumer::BaseConsumer;

use crate::ops::metrics::Rollback;
use crate::stream::sink::{FenceState, PartitionFences};

use super::super::flush::FenceReply;
use super::super::TallyContext;
use super::Worker;

/// When the fences are read next, and the read in progress.
pub(in crate::stream::consumer) struct FenceWatch {
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
    pub(in crate::stream::consumer) fn new(every: Duration, connections: Arc<AtomicU64>) -> Self {
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
}

impl Worker {
    /// Start a fence check when one is due and no flush is in flight (so every unit sent has
    /// landed and the fences must equal the aggregator's starts); act on the answer when it
    /// comes. Called between messages: never waits.
    pub(in crate::stream::consumer) fn check_fences(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
    ) {
        if let Some(check) = &self.fences.pending {
            let answer = match check.reply.try_recv() {
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => None,
                Ok(answer) => Some(answer),
            };
            let check = self.fences.pending.take().expect("checked above");
            match answer {
                Some(Ok(fences)) => self.compare_fences(consumer, check, fences),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "fence check: redis did not answer; trying again")
                }
                None => {}
            }
            return;
        }
        if !self.flusher.idle() || !self.fences.due() {
            return;
        }
        self.fences.last = Instant::now();
        self.fences.seen = self.fences.connections.load(Ordering::Relaxed);
        let expected: Vec<(i32, Vec<i64>)> = self
            .agg
            .partitions()
            .filter(|&p| !self.parts.is_revoking(p))
            .filter_map(|p| Some((p, self.agg.expected_fences(p)?)))
            .collect();
        if expected.is_empty() {
            return;
        }
        // -1: read only; a missing state is not created here.
        let request = expected.iter().map(|(p, _)| (*p, -1)).collect();
        if let Some(reply) = self.flusher.read_fences(request, self.parts.init_timeout()) {
            self.fences.pending = Some(Check { reply, expected });
        }
    }

    /// Replay every partition whose fences are not those that landed.
    fn compare_fences(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        check: Check,
        fences: PartitionFences,
    ) {
        let mut resync = Vec::new();
        for ((p, states), (_, expected)) in fences.into_iter().zip(check.expected) {
            let Some(found) = mismatch(&states, &expected) else {
                continue;
            };
            // A flush may have found it first (a fence conflict) and resynchronised it.
            if !self.agg.owns(p) || self.parts.is_revoking(p) {
                continue;
            }
            self.metrics
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
        self.resync(consumer, &resync);
    }
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
