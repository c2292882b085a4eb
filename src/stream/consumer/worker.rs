//! The worker: everything the consumer thread owns besides the consumer itself. It routes each
//! event between its owners: the aggregator counts, [`Flusher`] sends to the sink and applies
//! backpressure, [`Committer`] commits to Kafka, [`PartitionStates`] tracks parked and
//! rebuilding partitions, [`DecodeTally`] counts the input; [`recovery`] decides where a
//! partition starts.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::config::FlushConfig;
use crate::ops::metrics::{LaneGauges, Metrics, ResetReason};
use crate::stream::aggregate::{Added, Aggregator};
use crate::stream::decode::{DecodeError, Decoder, Record};
use crate::stream::sink::{ApplyReply, SinkRequest};

mod assign;
mod resync;
mod rollback;
mod schema_wait;

use super::commit::Committer;
use super::decode_tally::DecodeTally;
use super::flush::{worst_refusals, Flusher, Landed, Wait};
use super::partitions::{kafka_offsets, PartitionStates, StateAccess};
use super::recovery::{self, Halt, Start};
use super::{DeadLetters, TallyContext, KAFKA_TIMEOUT};

/// Partitions opened: where each starts, or why it must not.
type Opened = Vec<(i32, Result<i64, Halt>)>;

/// How often per-batch counts reach the metrics.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// Everything the consumer thread owns besides the consumer itself.
pub struct Worker {
    /// Counts events into units, per partition and shard.
    agg: Aggregator,
    /// Turns payloads into events for the counters.
    decoder: Decoder,
    /// Input counts and bad messages.
    tally: DecodeTally,
    /// The sink channel, the flush in flight, backpressure.
    flusher: Flusher,
    /// Kafka commits, which follow landed flushes.
    commits: Committer,
    /// Parked, rebuilding and revoking partitions.
    parts: PartitionStates,
    /// Per-batch counts are published here every [`PUBLISH_EVERY`].
    metrics: Metrics,
    /// This lane's parts of the process-wide gauges.
    gauges: LaneGauges,
    /// The topic consumed: every partition list the worker builds names it.
    topic: String,
    /// Partitions paused until the schema registry answers for their next event.
    schema_waits: schema_wait::SchemaWaits,
    /// Re-reads the fences, to replay what Redis took back (see [`rollback`]).
    fences: rollback::FenceWatch,
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
            tally: DecodeTally::new(),
            flusher: Flusher::new(sink, &flush),
            commits: Committer::new(topic.clone(), metrics.consumer.committed_offset.clone()),
            fences: rollback::FenceWatch::new(
                state.recovery.fence_check_interval,
                state.connections.clone(),
            ),
            parts: PartitionStates::new(state, metrics.status.clone()),
            gauges: LaneGauges::new(&metrics),
            metrics,
            topic,
            schema_waits: schema_wait::SchemaWaits::default(),
        }
    }

    /// Copy undecodable messages to a dead-letter topic.
    pub fn with_dead_letters(mut self, dead_letters: DeadLetters) -> Worker {
        self.tally.set_dead_letters(dead_letters);
        self
    }

    pub(super) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(super) fn topic(&self) -> &str {
        &self.topic
    }

    /// One message of the lane's topic. The record's parts are read only where the decoder
    /// uses them: its topic is the lane's own, its headers are parsed when a field reads one.
    pub(super) fn handle(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        msg: &BorrowedMessage<'_>,
        now_ms: i64,
    ) {
        let (offset, payload) = (msg.offset(), msg.payload());
        let kafka_ts = msg.timestamp().to_millis();
        let record = Record {
            key: msg.key(),
            headers: if self.decoder.reads_headers() {
                msg.headers()
            } else {
                None
            },
            topic: &self.topic,
            partition: msg.partition(),
        };
        let partition = record.partition;
        self.tally.consumed();
        self.flusher.reading();
        // A partition waiting for a schema reads this event again once it is known.
        if !self.agg.owns(partition) || self.schema_waits.holds(partition) {
            return;
        }
        let error = match self
            .decoder
            .decode_record(&record, payload, kafka_ts, now_ms)
        {
            Ok(event) => match self.agg.add(partition, offset, &event, now_ms) {
                Added::Counted => {
                    self.tally.skipped(&event.skips);
                    None
                }
                Added::Ignored => None,
                // `add` already moved past the message; it is bad input like any other.
                Added::Overflow => Some(DecodeError::Overflow),
            },
            // Its schema is not known yet: nothing moves past this offset, the partition
            // waits (paused) and reads it again once the registry answers, or at the next
            // start.
            Err(DecodeError::Unavailable) => Some(DecodeError::Unavailable),
            Err(e) => {
                let fresh = self.agg.position(partition).is_some_and(|p| offset >= p);
                self.agg.skip(partition, offset);
                fresh.then_some(e)
            }
        };
        if error == Some(DecodeError::Unavailable) {
            let lane = schema_wait::WaitingLane {
                consumer,
                topic: &self.topic,
                decoder: &self.decoder,
            };
            self.schema_waits.wait(&lane, partition, offset);
            return;
        }
        if let Some(e) = error {
            self.tally
                .bad_message(partition, offset, record.key, payload, e);
        }
        self.flusher.processed();
    }

    /// The last poll found nothing to read.
    pub(super) fn caught_up(&mut self) {
        self.flusher.caught_up();
    }

    /// Periodic work between messages: collect a finished flush, start one, apply backpressure.
    pub(super) fn tick(&mut self, consumer: &BaseConsumer<TallyContext>) {
        if let Some(landed) = self.flusher.poll() {
            self.complete(consumer, landed, CommitMode::Async);
        }
        self.commits.tick(consumer, &self.agg);
        // Before a flush is started: a check starts only while none is in flight.
        self.check_fences(consumer);
        if let Some(max_keys) = self.flusher.due(&self.agg) {
            self.start_flush(None, max_keys);
        }
        let pause = self.flusher.pause_due(&self.agg);
        if pause != self.flusher.paused() {
            self.set_paused(consumer, pause);
        }
        if self.tally.publish_due(PUBLISH_EVERY) {
            self.publish();
            self.parts.report_rebuilds(&self.agg, &mut self.gauges);
        }
        self.retry_parked(consumer);
        let lane = schema_wait::WaitingLane {
            consumer,
            topic: &self.topic,
            decoder: &self.decoder,
        };
        let (flusher, parts) = (&self.flusher, &self.parts);
        self.schema_waits.retry(&lane, &self.agg, |p| {
            !flusher.paused() && !parts.is_parked(p)
        });
    }

    fn set_paused(&mut self, consumer: &BaseConsumer<TallyContext>, paused: bool) {
        let (parts, waits) = (&self.parts, &self.schema_waits);
        if !self
            .flusher
            .set_paused(consumer, paused, |p| parts.is_parked(p) || waits.holds(p))
        {
            return;
        }
        if paused {
            tracing::info!(
                pending_keys = self.agg.pending_keys(),
                "backpressure: pausing consumption until the flush lands"
            );
        }
        self.gauges.paused.set(i64::from(paused));
    }

    /// Publish per-batch counts to metrics.
    fn publish(&mut self) {
        self.tally.publish(&self.metrics);
        self.schema_waits.publish(&self.decoder, &self.metrics);
        let counters = self.agg.counters();
        self.tally
            .publish_skips(&self.metrics, |ci| counters[ci].name.as_str());
        let stats = self.agg.take_stats();
        for (i, counter) in self.agg.counters().iter().enumerate() {
            if stats.counted[i] > 0 {
                self.metrics
                    .aggregate
                    .events_counted
                    .with_label_values(&[&counter.name])
                    .inc_by(stats.counted[i]);
            }
            if stats.late[i] > 0 {
                self.metrics
                    .aggregate
                    .late_events
                    .with_label_values(&[&counter.name])
                    .inc_by(stats.late[i]);
                self.metrics.status.late(stats.late[i]);
            }
        }
        self.metrics
            .aggregate
            .replayed_events_skipped
            .inc_by(stats.replay_skipped);
        let pending = self.agg.pending_keys() + self.flusher.in_flight_keys();
        self.gauges.pending_keys.set(pending as i64);
    }

    /// Seal pending units (of `only` partitions, or all) and send them to the sink.
    /// Returns the number of units and keys sent.
    fn start_flush(&mut self, only: Option<&[i32]>, max_keys: usize) -> (usize, usize) {
        match self
            .flusher
            .start(&mut self.agg, only, max_keys, &self.metrics.status)
        {
            Some(sent) => {
                self.publish();
                sent
            }
            None => (0, 0),
        }
    }

    /// Wait up to `timeout` for the flush in flight and process its outcome; false if it did
    /// not land in time.
    fn drain(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        timeout: Duration,
        mode: CommitMode,
    ) -> bool {
        match self.flusher.wait(timeout) {
            Wait::Idle => true,
            Wait::Landed(landed) => {
                self.complete(consumer, landed, mode);
                true
            }
            Wait::TimedOut => false,
        }
    }

    /// A flush landed: commit what it covered, and resynchronise partitions whose units Redis refused.
    fn complete(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        landed: Landed,
        mode: CommitMode,
    ) {
        let outcome = landed.outcome;
        let refused: HashSet<i32> = outcome.refusals.iter().map(|r| r.partition).collect();
        let applied = landed.ends.iter().filter(|(p, _)| !refused.contains(p));
        self.metrics.status.flush_landed(
            self.parts.lane(),
            applied.copied(),
            landed.keys,
            landed.took,
        );
        self.commits
            .flush_landed(consumer, &landed.ends, &refused, mode);
        let mut resync = Vec::new();
        for worst in worst_refusals(&outcome) {
            let (p, shard) = (worst.partition, worst.shard);
            if !self.agg.owns(p) || self.parts.is_revoking(p) {
                continue;
            }
            match worst.reply {
                ApplyReply::FenceMissing { marker_copy } => {
                    let halt = Halt::FenceMissing { shard, marker_copy };
                    self.park(Some(consumer), p, halt)
                }
                ApplyReply::Corrupt => self.park(Some(consumer), p, Halt::FenceCorrupt { shard }),
                ApplyReply::StateLost => {
                    tracing::error!(partition = p, shard, "redis holds no state for this partition any more (lost or flushed); reopening it");
                    resync.push(p);
                }
                ApplyReply::NotApplied => {
                    tracing::info!(partition = p, shard, "not applied: merged with a partition redis refused; replaying from the applied offset");
                    resync.push(p);
                }
                reply => {
                    tracing::warn!(partition = p, shard, ?reply, "redis applied a different offset range (another replica, or lost writes); resynchronising");
                    resync.push(p);
                }
            }
        }
        self.resync(consumer, &resync);
        self.publish();
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
        self.commits
            .commit_landed_offsets(consumer, &self.agg, CommitMode::Sync);
        self.tally
            .flush_dead_letters(deadline.saturating_duration_since(Instant::now()));
        self.publish();
    }

    /// Decide where each of `parts` starts, from Redis' fences and Kafka's offsets (see
    /// [`recovery`]). `Ok(start)`: the partition is tracked and must be consumed from `start`;
    /// `Err`: it must not be.
    fn open_partitions(&mut self, consumer: &BaseConsumer<TallyContext>, parts: &[i32]) -> Opened {
        let mut out = Vec::with_capacity(parts.len());
        let mut ready = Vec::with_capacity(parts.len());
        for (p, kafka) in kafka_offsets(consumer, &self.topic, parts) {
            match kafka {
                Ok(kafka) => ready.push((p, kafka)),
                Err(halt) => out.push((p, Err(halt))),
            }
        }
        if ready.is_empty() {
            return out;
        }
        let request = ready
            .iter()
            .map(|(p, kafka)| (*p, self.parts.fresh_start(kafka)))
            .collect();
        match self.flusher.init_fences(request, self.parts.init_timeout()) {
            Ok(fences) => {
                for ((p, states), (_, kafka)) in fences.into_iter().zip(&ready) {
                    let decision =
                        recovery::decide(&states, kafka.has_commit, kafka.low, kafka.high);
                    out.push((p, self.open(p, decision)));
                }
            }
            Err(e) => out.extend(
                ready
                    .iter()
                    .map(|(p, _)| (*p, Err(Halt::RedisUnavailable(e.to_string())))),
            ),
        }
        out
    }

    /// Act on the recovery decision for `partition`.
    fn open(&mut self, partition: i32, decision: Result<Start, Halt>) -> Result<i64, Halt> {
        let start = decision.inspect_err(|halt| {
            if let Halt::BeyondEnd { .. } = halt {
                self.metrics.recovery.offset_reset(ResetReason::BeyondEnd);
            }
        })?;
        self.parts.opened(partition, &start, &self.metrics);
        let lane = self.parts.lane();
        self.metrics.status.assigned(lane, partition, start.offset);
        self.agg.assign(partition, &start.applied);
        Ok(start.offset)
    }

    /// Stop counting `partition` until it can be opened again. Pauses it when `consumer` is
    /// given (after a rebalance assigns it, the caller pauses parked partitions itself).
    fn park(&mut self, consumer: Option<&BaseConsumer<TallyContext>>, partition: i32, halt: Halt) {
        self.agg.revoke(partition);
        // Reopened where Redis says, it reads its events again anyway.
        self.schema_waits.forget(partition);
        if let Some(consumer) = consumer {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.topic, partition);
            if let Err(e) = consumer.pause(&tpl) {
                tracing::warn!(partition, error = %e, "cannot pause partition");
            }
        }
        self.parts.park(partition, halt, &mut self.gauges);
    }

    /// Try parked partitions again (every few seconds); resume those that open.
    fn retry_parked(&mut self, consumer: &BaseConsumer<TallyContext>) {
        let parts = self.parts.retry_due();
        if parts.is_empty() {
            return;
        }
        for (p, result) in self.open_partitions(consumer, &parts) {
            let start = match result {
                Ok(start) => start,
                Err(halt) => {
                    self.park(None, p, halt);
                    continue;
                }
            };
            if let Err(e) = consumer.seek(&self.topic, p, Offset::Offset(start), KAFKA_TIMEOUT) {
                tracing::warn!(partition = p, error = %e, "cannot seek; will retry");
                self.agg.revoke(p);
                continue;
            }
            self.parts.unpark(p, &mut self.gauges);
            if !self.flusher.paused() && !self.schema_waits.holds(p) {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&self.topic, p);
                let _ = consumer.resume(&tpl);
            }
            tracing::info!(partition = p, start, "partition resumed");
        }
    }
}
