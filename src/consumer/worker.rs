//! The worker: everything the consumer thread owns besides the consumer itself — decoding,
//! aggregation, the flush in flight, backpressure and Kafka commits.

use std::collections::HashSet;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::aggregate::{Added, Aggregator};
use crate::config::{FlushConfig, RecoveryConfig, StartFrom};
use crate::decode::{DecodeError, Decoder};
use crate::health::Health;
use crate::metrics::{LaneGauges, Metrics};
use crate::sink::{ApplyReply, FlushOutcome, SinkRequest};

use super::policy::{FlushPolicy, Pending};
use super::recovery::{Halt, PartitionStates};

use super::TallyContext;

const LOG_EVERY: Duration = Duration::from_secs(10);

/// A flush sent to the sink and not yet answered.
pub(super) struct InFlight {
    pub(super) reply: std_mpsc::Receiver<FlushOutcome>,
    /// Offset each partition is complete up to once the flush lands.
    pub(super) ends: Vec<(i32, i64)>,
    pub(super) keys: usize,
    pub(super) started: Instant,
}

/// Everything the consumer thread owns besides the consumer itself.
pub struct Worker {
    pub(super) agg: Aggregator,
    pub(super) decoder: Decoder,
    pub(super) sink: mpsc::UnboundedSender<SinkRequest>,
    pub(super) in_flight: Option<InFlight>,
    pub(super) metrics: Metrics,
    /// This lane's parts of the process-wide gauges.
    pub(super) gauges: LaneGauges,
    pub(super) topic: String,
    pub(super) flush: FlushConfig,
    /// When to flush and when to pause.
    pub(super) policy: FlushPolicy,
    /// When the oldest unflushed message was processed.
    pub(super) batch_started: Option<Instant>,
    /// The last poll found nothing to read: what is pending can be flushed at once.
    pub(super) caught_up: bool,
    pub(super) paused: bool,
    /// Partitions being revoked right now: never seek or recover them.
    pub(super) revoking: Vec<i32>,
    pub(super) consumed: u64,
    pub(super) decode_errors: [u64; DecodeError::ALL.len()],
    pub(super) last_publish: Instant,
    pub(super) last_error_log: Instant,
    pub(super) errors_since_log: u64,
    /// Where undecodable messages are copied, if configured.
    pub(super) dead_letters: Option<super::DeadLetters>,
    /// How partitions start and recover; which are halted or being rebuilt.
    pub(super) states: PartitionStates,
    /// The last offset committed (asynchronously) per partition: committed again, and waited
    /// for, on shutdown, so a commit in flight is not lost when the consumer closes.
    pub(super) landed: std::collections::BTreeMap<i32, i64>,
    /// Partitions were assigned: commit `landed` at the next tick.
    pub(super) commit_landed: bool,
    /// How long the last flush took to land (flushes start that much before the interval).
    pub(super) flush_takes: Duration,
}

/// How the worker reaches and recovers tally's state in Redis.
pub struct StateAccess {
    /// Where a partition tally never counted starts.
    pub start_from: StartFrom,
    /// What to do when Redis lost tally's state.
    pub recovery: RecoveryConfig,
    /// Readiness, which lists halted partitions.
    pub health: Arc<Health>,
    /// Longest wait for Redis' answer about fences.
    pub init_timeout: Duration,
    /// Which consumer lane of the process this is (0 for the first).
    pub lane: usize,
}

impl Worker {
    /// A worker for `topic` sending flushes to `sink`.
    pub fn new(
        agg: Aggregator,
        decoder: Decoder,
        sink: mpsc::UnboundedSender<SinkRequest>,
        metrics: Metrics,
        topic: String,
        flush: FlushConfig,
        state: StateAccess,
    ) -> Worker {
        Worker {
            agg,
            decoder,
            sink,
            in_flight: None,
            gauges: LaneGauges::new(&metrics),
            metrics,
            topic,
            policy: FlushPolicy::new(&flush),
            flush,
            batch_started: None,
            caught_up: false,
            paused: false,
            revoking: Vec::new(),
            consumed: 0,
            decode_errors: [0; DecodeError::ALL.len()],
            last_publish: Instant::now(),
            last_error_log: Instant::now() - LOG_EVERY,
            errors_since_log: 0,
            dead_letters: None,
            states: PartitionStates::new(state),
            landed: std::collections::BTreeMap::new(),
            commit_landed: false,
            flush_takes: Duration::ZERO,
        }
    }

    /// Copy undecodable messages to a dead-letter topic.
    pub fn with_dead_letters(mut self, dead_letters: super::DeadLetters) -> Worker {
        self.dead_letters = Some(dead_letters);
        self
    }

    pub(super) fn handle(
        &mut self,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        kafka_ts: Option<i64>,
        now_ms: i64,
    ) {
        self.consumed += 1;
        self.caught_up = false;
        if !self.agg.owns(partition) {
            return;
        }
        let error = match self.decoder.decode_at(payload, kafka_ts, now_ms) {
            Ok(event) => match self.agg.add(partition, offset, &event, now_ms) {
                Added::Counted | Added::Ignored => None,
                // `add` already moved past the message; it is bad input like any other.
                Added::Overflow => Some(DecodeError::Overflow),
            },
            Err(e) => {
                let fresh = self.agg.position(partition).is_some_and(|p| offset >= p);
                self.agg.skip(partition, offset);
                fresh.then_some(e)
            }
        };
        if let Some(e) = error {
            self.bad_message(partition, offset, key, payload, e);
        }
        self.batch_started.get_or_insert_with(Instant::now);
    }

    /// Count, dead-letter and (rate-limited) log a message skipped as bad input.
    fn bad_message(
        &mut self,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        e: DecodeError,
    ) {
        if let Some(dlq) = &self.dead_letters {
            dlq.send(partition, offset, key, payload, e.reason());
        }
        self.decode_errors[e.index()] += 1;
        self.errors_since_log += 1;
        if self.last_error_log.elapsed() >= LOG_EVERY {
            tracing::warn!(
                partition,
                offset,
                reason = e.reason(),
                skipped = self.errors_since_log,
                "skipping undecodable messages"
            );
            self.last_error_log = Instant::now();
            self.errors_since_log = 0;
        }
    }

    /// What waits for Redis now, for the flush policy.
    fn pending(&self) -> Pending {
        Pending {
            oldest: self.batch_started.map(|t| t.elapsed()),
            keys: self.agg.pending_keys(),
            in_flight: self.in_flight.as_ref().map(|f| f.keys),
            caught_up: self.caught_up,
            flush_takes: self.flush_takes,
        }
    }

    /// Periodic work between messages: collect a finished flush, start one, apply backpressure.
    pub(super) fn tick(&mut self, consumer: &BaseConsumer<TallyContext>) {
        if let Some(f) = &self.in_flight {
            match f.reply.try_recv() {
                Ok(outcome) => self.complete(consumer, outcome, CommitMode::Async),
                Err(std_mpsc::TryRecvError::Empty) => {}
                Err(std_mpsc::TryRecvError::Disconnected) => self.in_flight = None,
            }
        }
        if std::mem::take(&mut self.commit_landed) {
            self.commit_landed_offsets(consumer, CommitMode::Async);
        }
        let mut load = self.pending();
        if self.policy.flush_due(&load) {
            self.start_flush(None, self.policy.batch_keys());
            load = self.pending();
        }
        let pause = self.policy.pause(&load);
        if pause != self.paused {
            self.set_paused(consumer, pause);
        }
        if self.last_publish.elapsed() >= Duration::from_millis(200) {
            self.publish();
            self.report_rebuilds();
        }
        self.retry_parked(consumer);
    }

    pub(super) fn set_paused(&mut self, consumer: &BaseConsumer<TallyContext>, paused: bool) {
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let result = if paused {
            consumer.pause(&assignment)
        } else {
            // Parked partitions stay paused until their state allows counting them.
            let mut active = TopicPartitionList::new();
            for e in assignment.elements() {
                if !self.states.parked.contains_key(&e.partition()) {
                    active.add_partition(e.topic(), e.partition());
                }
            }
            consumer.resume(&active)
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, paused, "cannot change consumption state");
            return;
        }
        if paused {
            tracing::info!(
                pending_keys = self.agg.pending_keys(),
                "backpressure: pausing consumption until the flush lands"
            );
        }
        self.paused = paused;
        self.gauges.paused.set(i64::from(paused));
    }

    /// Publish per-batch counts to metrics.
    pub(super) fn publish(&mut self) {
        self.last_publish = Instant::now();
        self.metrics
            .messages_consumed
            .inc_by(std::mem::take(&mut self.consumed));
        for (i, n) in self.decode_errors.iter_mut().enumerate() {
            if *n > 0 {
                self.metrics
                    .decode_failed(DecodeError::ALL[i], std::mem::take(n));
            }
        }
        let stats = self.agg.take_stats();
        for (i, counter) in self.agg.counters().iter().enumerate() {
            if stats.counted[i] > 0 {
                self.metrics
                    .events_counted
                    .with_label_values(&[&counter.name])
                    .inc_by(stats.counted[i]);
            }
            if stats.late[i] > 0 {
                self.metrics
                    .late_events
                    .with_label_values(&[&counter.name])
                    .inc_by(stats.late[i]);
            }
        }
        self.metrics
            .replayed_events_skipped
            .inc_by(stats.replay_skipped);
        let in_flight = self.in_flight.as_ref().map_or(0, |f| f.keys);
        self.gauges
            .pending_keys
            .set((self.agg.pending_keys() + in_flight) as i64);
    }

    /// Seal pending units (of `only` partitions, or all) and send them to the sink.
    /// Returns the number of units and keys sent.
    /// `max_keys` caps the batch (regular flushes); revoke and shutdown flush everything.
    pub(super) fn start_flush(&mut self, only: Option<&[i32]>, max_keys: usize) -> (usize, usize) {
        debug_assert!(
            self.in_flight.is_none(),
            "one flush at a time keeps units in order"
        );
        let batch = self.agg.seal_up_to(only, max_keys);
        // A capped flush leaves the rest due: the next one starts as soon as this one lands.
        if only.is_none() && batch.complete {
            self.batch_started = None;
        }
        if batch.units.is_empty() {
            return (0, 0);
        }
        let (tx, rx) = std_mpsc::channel();
        let keys = batch.keys;
        let units = batch.units.len();
        if self
            .sink
            .send(SinkRequest::Flush {
                units: batch.units,
                reply: tx,
            })
            .is_err()
        {
            tracing::error!("redis sink has stopped; pending data will be replayed on restart");
            return (0, 0);
        }
        self.in_flight = Some(InFlight {
            reply: rx,
            ends: batch.ends,
            keys,
            started: Instant::now(),
        });
        self.publish();
        (units, keys)
    }

    /// Wait up to `timeout` for the flush in flight and process its outcome.
    pub(super) fn drain(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        timeout: Duration,
        mode: CommitMode,
    ) -> bool {
        let Some(f) = &self.in_flight else {
            return true;
        };
        match f.reply.recv_timeout(timeout) {
            Ok(outcome) => {
                self.complete(consumer, outcome, mode);
                true
            }
            Err(_) => {
                // Not lost: Redis has not recorded these offsets, so they are consumed again.
                tracing::warn!("flush did not land in time; its events will be replayed from the applied offsets");
                self.in_flight = None;
                false
            }
        }
    }

    /// A flush landed: commit what it covered, and resynchronise partitions whose units Redis refused.
    pub(super) fn complete(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        outcome: FlushOutcome,
        mode: CommitMode,
    ) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        self.flush_takes = f.started.elapsed();
        let refused: HashSet<i32> = outcome.refusals.iter().map(|r| r.partition).collect();
        let mut tpl = TopicPartitionList::new();
        for &(p, end) in &f.ends {
            if refused.contains(&p) {
                continue;
            }
            // Kafka's committed offset is the next message to read, like our `end`.
            if tpl
                .add_partition_offset(&self.topic, p, Offset::Offset(end))
                .is_ok()
            {
                self.metrics
                    .committed_offset
                    .with_label_values(&[&p.to_string()])
                    .set(end);
                self.landed.insert(p, end);
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, mode) {
                // Harmless for exactness (Redis holds the applied offsets); lag may read high.
                tracing::warn!(error = %e, "kafka offset commit failed");
            }
        }
        let mut handled: Vec<i32> = Vec::new();
        for refusal in &outcome.refusals {
            let p = refusal.partition;
            if handled.contains(&p) {
                continue;
            }
            handled.push(p);
            if !self.agg.owns(p) || self.revoking.contains(&p) {
                continue;
            }
            // The most serious refusal of the partition decides.
            let worst = outcome
                .refusals
                .iter()
                .filter(|r| r.partition == p)
                .max_by_key(|r| severity(&r.reply))
                .expect("the partition has a refusal");
            match worst.reply {
                ApplyReply::FenceMissing { marker_copy } => self.park(
                    Some(consumer),
                    p,
                    Halt::FenceMissing {
                        shard: worst.shard,
                        marker_copy,
                    },
                ),
                ApplyReply::Corrupt => {
                    self.park(Some(consumer), p, Halt::FenceCorrupt { shard: worst.shard })
                }
                ApplyReply::StateLost => {
                    tracing::error!(partition = p, shard = worst.shard, "redis holds no state for this partition any more (lost or flushed); reopening it");
                    self.resync(consumer, p);
                }
                ApplyReply::NotApplied => {
                    tracing::info!(partition = p, shard = worst.shard, "not applied: merged with a partition redis refused; replaying from the applied offset");
                    self.resync(consumer, p);
                }
                reply => {
                    tracing::warn!(partition = p, shard = worst.shard, ?reply, "redis applied a different offset range (another replica, or lost writes); resynchronising");
                    self.resync(consumer, p);
                }
            }
        }
        self.publish();
    }

    /// Commit the last landed offset (or assigned start) of every owned partition.
    fn commit_landed_offsets(&self, consumer: &BaseConsumer<TallyContext>, mode: CommitMode) {
        let mut tpl = TopicPartitionList::new();
        for (&p, &end) in &self.landed {
            if self.agg.owns(p) {
                let _ = tpl.add_partition_offset(&self.topic, p, Offset::Offset(end));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, mode) {
                tracing::warn!(error = %e, "kafka offset commit failed");
            }
        }
    }

    /// Final flush and commit on shutdown, within `grace`.
    pub(super) fn finish(&mut self, consumer: &BaseConsumer<TallyContext>, grace: Duration) {
        let deadline = Instant::now() + grace;
        self.drain(consumer, grace, CommitMode::Sync);
        self.start_flush(None, usize::MAX);
        let left = deadline.saturating_duration_since(Instant::now());
        if self.drain(consumer, left, CommitMode::Sync) {
            tracing::info!("final flush landed and offsets committed");
        }
        // Earlier commits were asynchronous: make sure the last of each partition reached Kafka
        // before the consumer closes (lag monitoring reads them; Redis holds the truth anyway).
        self.commit_landed_offsets(consumer, CommitMode::Sync);
        if let Some(dlq) = &self.dead_letters {
            dlq.flush(deadline.saturating_duration_since(Instant::now()));
        }
        self.publish();
    }
}

/// Which refusal of a partition decides what happens to it: a partial loss or corruption halts
/// it, even if another shard only reported a conflict.
fn severity(reply: &ApplyReply) -> u8 {
    match reply {
        ApplyReply::FenceMissing { .. } | ApplyReply::Corrupt => 2,
        ApplyReply::StateLost => 1,
        _ => 0,
    }
}
