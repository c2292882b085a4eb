//! The worker's side of the sink: the one channel to it, the flush in flight, and backpressure
//! (when to flush and when to stop reading, per [`FlushPolicy`]).

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;

use crate::config::FlushConfig;
use crate::stream::aggregate::Aggregator;
use crate::stream::sink::{
    ApplyReply, FenceError, FlushOutcome, PartitionFences, Refusal, SinkRequest,
};

use super::policy::{FlushPolicy, Pending};
use super::TallyContext;

/// Where the sink's answer about fences arrives.
pub(super) type FenceReply = std_mpsc::Receiver<Result<PartitionFences, FenceError>>;

/// A flush sent to the sink and not yet answered.
struct InFlight {
    reply: std_mpsc::Receiver<FlushOutcome>,
    /// Offset each partition is complete up to once the flush lands.
    ends: Vec<(i32, i64)>,
    /// Keys sent: they still count as pending for backpressure.
    keys: usize,
    /// When it was sent, to learn how long flushes take.
    started: Instant,
}

/// A flush the sink answered.
pub(super) struct Landed {
    /// Offset each partition of the flush is complete up to (unless refused).
    pub(super) ends: Vec<(i32, i64)>,
    pub(super) outcome: FlushOutcome,
    /// Keys it sent.
    pub(super) keys: usize,
    /// From sending it to the answer.
    pub(super) took: Duration,
}

/// What waiting for the flush in flight gave.
pub(super) enum Wait {
    /// No flush was in flight.
    Idle,
    Landed(Landed),
    /// No answer in time: the flush is forgotten (its offsets are replayed).
    TimedOut,
}

/// Flushes to the sink, one at a time, and the backpressure they cause.
pub(super) struct Flusher {
    /// The sink task's inbox: flushes and fence reads.
    sink: mpsc::UnboundedSender<SinkRequest>,
    /// One flush at a time keeps each partition's units in order.
    in_flight: Option<InFlight>,
    /// When to flush and when to pause.
    policy: FlushPolicy,
    /// How long a revoke waits for a flush to land.
    grace: Duration,
    /// When the oldest unflushed message was processed.
    batch_started: Option<Instant>,
    /// The last poll found nothing to read: what is pending can be flushed at once.
    caught_up: bool,
    /// Consumption is paused until the flush in flight lands.
    paused: bool,
    /// How long the last flush took to land (flushes start that much before the interval).
    flush_takes: Duration,
}

impl Flusher {
    pub(super) fn new(sink: mpsc::UnboundedSender<SinkRequest>, flush: &FlushConfig) -> Flusher {
        Flusher {
            sink,
            in_flight: None,
            policy: FlushPolicy::new(flush),
            grace: flush.shutdown_grace,
            batch_started: None,
            caught_up: false,
            paused: false,
            flush_takes: Duration::ZERO,
        }
    }

    /// How long a revoke waits for a flush to land (`flush.shutdown_grace`).
    pub(super) fn grace(&self) -> Duration {
        self.grace
    }

    pub(super) fn paused(&self) -> bool {
        self.paused
    }

    /// Keys of the flush in flight (0 if none).
    pub(super) fn in_flight_keys(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |f| f.keys)
    }

    /// A message was read: more may follow.
    pub(super) fn reading(&mut self) {
        self.caught_up = false;
    }

    /// A message of an owned partition was processed: something may be pending.
    pub(super) fn processed(&mut self) {
        self.batch_started.get_or_insert_with(Instant::now);
    }

    /// The last poll found nothing to read.
    pub(super) fn caught_up(&mut self) {
        self.caught_up = true;
    }

    /// What waits for Redis now, for the flush policy.
    fn pending(&self, agg: &Aggregator) -> Pending {
        Pending {
            oldest: self.batch_started.map(|t| t.elapsed()),
            keys: agg.pending_keys(),
            in_flight: self.in_flight.as_ref().map(|f| f.keys),
            caught_up: self.caught_up,
            flush_takes: self.flush_takes,
        }
    }

    /// Start a regular flush now? Then with at most how many keys.
    pub(super) fn due(&self, agg: &Aggregator) -> Option<usize> {
        self.policy
            .flush_due(&self.pending(agg))
            .then(|| self.policy.batch_keys())
    }

    /// Should consumption be paused now?
    pub(super) fn pause_due(&self, agg: &Aggregator) -> bool {
        self.policy.pause(&self.pending(agg))
    }

    /// Seal pending units (of `only` partitions, or all) and send them to the sink.
    /// `Some((units, keys))` when a flush was sent. `max_keys` caps the batch (regular
    /// flushes); revoke and shutdown flush everything.
    pub(super) fn start(
        &mut self,
        agg: &mut Aggregator,
        only: Option<&[i32]>,
        max_keys: usize,
        status: &crate::ops::status::Status,
    ) -> Option<(usize, usize)> {
        debug_assert!(
            self.in_flight.is_none(),
            "one flush at a time keeps units in order"
        );
        let batch = agg.seal_up_to(only, max_keys);
        // A capped flush leaves the rest due: the next one starts as soon as this one lands.
        if only.is_none() && batch.complete {
            self.batch_started = None;
        }
        if batch.units.is_empty() {
            return None;
        }
        // The heavy hitters see each sealed batch once, never per message.
        status.sealed(batch.count_deltas(), batch.max_units_per_key());
        let (tx, rx) = std_mpsc::channel();
        let keys = batch.keys;
        let units = batch.units.len();
        let request = SinkRequest::Flush {
            units: batch.units,
            reply: tx,
        };
        if self.sink.send(request).is_err() {
            tracing::error!("redis sink has stopped; pending data will be replayed on restart");
            return None;
        }
        self.in_flight = Some(InFlight {
            reply: rx,
            ends: batch.ends,
            keys,
            started: Instant::now(),
        });
        Some((units, keys))
    }

    /// The flush in flight, if the sink has answered it (without waiting).
    pub(super) fn poll(&mut self) -> Option<Landed> {
        let f = self.in_flight.as_ref()?;
        match f.reply.try_recv() {
            Ok(outcome) => Some(self.landed(outcome)),
            Err(std_mpsc::TryRecvError::Empty) => None,
            Err(std_mpsc::TryRecvError::Disconnected) => {
                self.in_flight = None;
                None
            }
        }
    }

    /// Wait up to `timeout` for the flush in flight.
    pub(super) fn wait(&mut self, timeout: Duration) -> Wait {
        let Some(f) = &self.in_flight else {
            return Wait::Idle;
        };
        match f.reply.recv_timeout(timeout) {
            Ok(outcome) => Wait::Landed(self.landed(outcome)),
            Err(_) => {
                // Not lost: Redis has not recorded these offsets, so they are consumed again.
                tracing::warn!("flush did not land in time; its events will be replayed from the applied offsets");
                self.in_flight = None;
                Wait::TimedOut
            }
        }
    }

    fn landed(&mut self, outcome: FlushOutcome) -> Landed {
        let f = self.in_flight.take().expect("a flush is in flight");
        self.flush_takes = f.started.elapsed();
        Landed {
            ends: f.ends,
            outcome,
            keys: f.keys,
            took: self.flush_takes,
        }
    }

    /// Pause or resume consumption; parked partitions stay paused until their state allows
    /// counting them. Returns whether the state changed.
    pub(super) fn set_paused(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        paused: bool,
        is_parked: impl Fn(i32) -> bool,
    ) -> bool {
        let Ok(assignment) = consumer.assignment() else {
            return false;
        };
        let result = if paused {
            consumer.pause(&assignment)
        } else {
            let mut active = TopicPartitionList::new();
            for e in assignment.elements() {
                if !is_parked(e.partition()) {
                    active.add_partition(e.topic(), e.partition());
                }
            }
            consumer.resume(&active)
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, paused, "cannot change consumption state");
            return false;
        }
        self.paused = paused;
        true
    }

    /// No flush is in flight: every unit sent has landed (or was refused and resynchronised).
    pub(super) fn idle(&self) -> bool {
        self.in_flight.is_none()
    }

    /// Ask the sink for the fences of `partitions` (creating those Redis has no state for at
    /// the given offset, unless it is negative) without waiting for the answer (None: the sink
    /// has stopped). Requests are served in order, so the answer reflects Redis before any
    /// flush sent after this call.
    pub(super) fn read_fences(
        &self,
        partitions: Vec<(i32, i64)>,
        timeout: Duration,
    ) -> Option<FenceReply> {
        let (tx, rx) = std_mpsc::channel();
        self.sink
            .send(SinkRequest::InitFences {
                partitions,
                deadline: Instant::now() + timeout,
                reply: tx,
            })
            .ok()?;
        Some(rx)
    }

    /// [`Flusher::read_fences`], waiting at most `timeout` for the answer.
    pub(super) fn init_fences(
        &self,
        partitions: Vec<(i32, i64)>,
        timeout: Duration,
    ) -> Result<PartitionFences, FenceError> {
        self.read_fences(partitions, timeout)
            .ok_or(FenceError::SinkStopped)?
            .recv_timeout(timeout)
            .unwrap_or(Err(FenceError::NoAnswer))
    }
}

/// The refusal that decides each refused partition's fate, in the order the partitions were
/// first refused: a partial loss or corruption halts it, even if another shard only reported
/// a conflict.
pub(super) fn worst_refusals(outcome: &FlushOutcome) -> Vec<&Refusal> {
    let mut worst: Vec<&Refusal> = Vec::new();
    for refusal in &outcome.refusals {
        match worst.iter_mut().find(|w| w.partition == refusal.partition) {
            // `max_by_key` keeps the last of equals: so does `>=`.
            Some(w) if severity(&refusal.reply) >= severity(&w.reply) => *w = refusal,
            Some(_) => {}
            None => worst.push(refusal),
        }
    }
    worst
}

fn severity(reply: &ApplyReply) -> u8 {
    match reply {
        ApplyReply::FenceMissing { .. } | ApplyReply::Corrupt => 2,
        ApplyReply::StateLost => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(partition: i32, shard: u32, reply: ApplyReply) -> Refusal {
        Refusal {
            partition,
            shard,
            reply,
        }
    }

    #[test]
    fn the_most_serious_refusal_of_each_partition_decides() {
        let outcome = FlushOutcome {
            refusals: vec![
                refusal(3, 0, ApplyReply::Conflict { applied: 7 }),
                refusal(1, 0, ApplyReply::NotApplied),
                refusal(3, 1, ApplyReply::Corrupt),
                refusal(3, 2, ApplyReply::StateLost),
                refusal(1, 1, ApplyReply::NotApplied),
                refusal(3, 3, ApplyReply::FenceMissing { marker_copy: None }),
            ],
            ..FlushOutcome::default()
        };
        let worst: Vec<(i32, u32)> = worst_refusals(&outcome)
            .iter()
            .map(|r| (r.partition, r.shard))
            .collect();
        // Partition 3 first (refused first); of equals, the last one decides.
        assert_eq!(worst, [(3, 3), (1, 1)]);
    }
}
