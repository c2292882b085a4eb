//! The worker: everything the consumer thread owns besides the consumer itself. It routes each
//! event between its owners: the aggregator counts, [`Flusher`] sends to the sink and applies
//! backpressure, [`Committer`] commits to Kafka, [`PartitionStates`] tracks parked and
//! rebuilding partitions, [`DecodeTally`] counts the input; [`Lifecycle`] opens, parks and
//! reopens partitions (where each starts: [`recovery`](super::recovery)), [`rollback::FenceWatch`] re-reads the
//! fences, [`schema_wait::SchemaWaits`] holds partitions waiting for a schema.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::config::FlushConfig;
use crate::ops::metrics::{LaneGauges, Metrics};
use crate::stream::aggregate::{Added, Aggregator};
use crate::stream::decode::{DecodeError, Decoder, Record};
use crate::stream::sink::{ApplyReply, SinkRequest};

mod lifecycle;
mod rollback;
mod schema_wait;

use lifecycle::Lifecycle;

use super::commit::Committer;
use super::decode_tally::DecodeTally;
use super::flush::{worst_refusals, Flusher, Landed, Wait};
use super::partitions::{PartitionStates, StateAccess};
use super::recovery::Halt;
use super::{DeadLetters, TallyContext};

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
        let rolled_back = self
            .fences
            .poll(&self.agg, &self.flusher, &self.parts, &self.metrics);
        self.lifecycle(consumer).resync(&rolled_back);
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
        self.lifecycle(consumer).retry_parked();
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
        let mut life = self.lifecycle(consumer);
        for worst in worst_refusals(&outcome) {
            let (p, shard) = (worst.partition, worst.shard);
            if !life.agg.owns(p) || life.parts.is_revoking(p) {
                continue;
            }
            match worst.reply {
                ApplyReply::FenceMissing { marker_copy } => {
                    let halt = Halt::FenceMissing { shard, marker_copy };
                    life.park(p, halt, true)
                }
                ApplyReply::Corrupt => life.park(p, Halt::FenceCorrupt { shard }, true),
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
        life.resync(&resync);
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

    /// The owners a partition's start and stop touch, borrowed for one call.
    fn lifecycle<'w>(&'w mut self, consumer: &'w BaseConsumer<TallyContext>) -> Lifecycle<'w> {
        Lifecycle {
            consumer,
            topic: &self.topic,
            agg: &mut self.agg,
            parts: &mut self.parts,
            flusher: &self.flusher,
            schema_waits: &mut self.schema_waits,
            metrics: &self.metrics,
            gauges: &mut self.gauges,
        }
    }

    /// Partitions were assigned: each starts where Redis says (its offset is set in `tpl`), or
    /// is parked. The caller pauses what is parked once the assignment takes effect.
    pub(super) fn on_assign(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &mut TopicPartitionList,
    ) {
        let parts = self.partitions_of(tpl);
        if parts.is_empty() {
            return;
        }
        for (p, result) in self.lifecycle(consumer).open_partitions(&parts) {
            match result {
                Ok(start) => {
                    let lane = self.parts.lane();
                    tracing::info!(partition = p, start, lane, "partition assigned");
                    if let Err(e) = tpl.set_partition_offset(&self.topic, p, Offset::Offset(start))
                    {
                        tracing::error!(partition = p, error = %e, "cannot set start offset");
                    }
                    self.commits.assigned(p, start);
                }
                Err(halt) => self.lifecycle(consumer).park(p, halt, false),
            }
        }
    }

    /// Partitions are being revoked: flush and commit what they hold before they are released.
    pub(super) fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &TopicPartitionList,
    ) {
        let parts = self.partitions_of(tpl);
        self.parts.revoking(&parts);
        let grace = self.flusher.grace();
        self.drain(consumer, grace, CommitMode::Sync);
        let (units, keys) = self.start_flush(Some(&parts), usize::MAX);
        let landed = self.drain(consumer, grace, CommitMode::Sync);
        tracing::info!(partitions = ?parts, units, keys, landed, "flushed partitions being revoked");
        for &p in &parts {
            self.agg.revoke(p);
            if self.schema_waits.forget(p) {
                // Paused for its schema: not paused when it is assigned again.
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&self.topic, p);
                let _ = consumer.resume(&tpl);
            }
            self.commits.revoked(p);
            self.parts.revoked(p, &mut self.gauges);
            self.metrics.status.revoked(self.parts.lane(), p);
            let labels = [self.topic.as_str(), &p.to_string()];
            let consumer = &self.metrics.consumer;
            let _ = consumer.consumer_lag.remove_label_values(&labels);
            let _ = consumer.lag_seconds.remove_label_values(&labels);
            let _ = consumer.committed_offset.remove_label_values(&labels);
        }
        self.parts.revoke_done();
    }

    /// After a rebalance error: stop counting the partitions of `tpl`.
    pub(super) fn release(&mut self, tpl: &TopicPartitionList) {
        for p in self.partitions_of(tpl) {
            self.agg.revoke(p);
            self.schema_waits.forget(p);
        }
    }

    /// Pause what must not be read once an assignment takes effect: everything while
    /// backpressure holds, and every parked partition.
    pub(super) fn pause_assigned(
        &self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &TopicPartitionList,
    ) {
        if self.flusher.paused() {
            let _ = consumer.pause(tpl);
        }
        let mut parked = TopicPartitionList::new();
        for p in self.parts.parked() {
            parked.add_partition(&self.topic, p);
        }
        if parked.count() > 0 {
            if let Err(e) = consumer.pause(&parked) {
                tracing::warn!(error = %e, "cannot pause parked partitions");
            }
        }
    }

    /// The number of partitions assigned to this lane, for its gauge.
    pub(super) fn set_assigned(&mut self, partitions: usize) {
        self.gauges.assigned.set(partitions as i64);
    }

    fn partitions_of(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect()
    }
}
