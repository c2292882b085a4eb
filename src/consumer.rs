//! Consume: one thread owns the Kafka consumer, decodes and aggregates, and hands sealed
//! batches to the Redis sink. Rebalance callbacks run on this same thread (inside `poll`), so a
//! revoked partition is flushed and committed before it is released, without races.
//!
//! Offsets: on assignment a partition starts at the offset Redis says it has applied (the
//! minimum over its shards), not at Kafka's committed offset; Kafka commits follow each landed
//! flush so that lag monitoring works. Redis is the source of truth.

use std::collections::HashSet;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::aggregate::Aggregator;
use crate::config::{FlushConfig, StartFrom};
use crate::decode::Decoder;
use crate::metrics::{Metrics, DECODE_REASONS};
use crate::sink::{FlushOutcome, Health, SinkRequest};

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A flush sent to the sink and not yet answered.
struct InFlight {
    reply: std_mpsc::Receiver<FlushOutcome>,
    /// Offset each partition is complete up to once the flush lands.
    ends: Vec<(i32, i64)>,
    keys: usize,
}

/// Everything the consumer thread owns besides the consumer itself.
pub struct Worker {
    agg: Aggregator,
    decoder: Decoder,
    sink: mpsc::UnboundedSender<SinkRequest>,
    in_flight: Option<InFlight>,
    metrics: Metrics,
    topic: String,
    flush: FlushConfig,
    start_from: StartFrom,
    /// When the oldest unflushed message was processed.
    batch_started: Option<Instant>,
    paused: bool,
    /// Partitions being revoked right now: never seek or recover them.
    revoking: Vec<i32>,
    consumed: u64,
    decode_errors: [u64; 7],
    last_publish: Instant,
    last_error_log: Instant,
    errors_since_log: u64,
}

/// The rdkafka context: routes rebalances and statistics to the worker.
pub struct TallyContext {
    worker: Mutex<Worker>,
    metrics: Metrics,
    health: Arc<Health>,
    topic: String,
    shutdown: CancellationToken,
}

impl TallyContext {
    /// Context for a consumer of `topic`.
    pub fn new(worker: Worker, health: Arc<Health>, shutdown: CancellationToken) -> TallyContext {
        TallyContext {
            metrics: worker.metrics.clone(),
            topic: worker.topic.clone(),
            worker: Mutex::new(worker),
            health,
            shutdown,
        }
    }

    fn worker(&self) -> MutexGuard<'_, Worker> {
        // A panic while holding the lock already aborts the thread; keep the data.
        self.worker.lock().unwrap_or_else(|e| e.into_inner())
    }
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
        start_from: StartFrom,
    ) -> Worker {
        Worker {
            agg,
            decoder,
            sink,
            in_flight: None,
            metrics,
            topic,
            flush,
            start_from,
            batch_started: None,
            paused: false,
            revoking: Vec::new(),
            consumed: 0,
            decode_errors: [0; 7],
            last_publish: Instant::now(),
            last_error_log: Instant::now() - LOG_EVERY,
            errors_since_log: 0,
        }
    }

    fn handle(
        &mut self,
        partition: i32,
        offset: i64,
        payload: Option<&[u8]>,
        kafka_ts: Option<i64>,
        now_ms: i64,
    ) {
        self.consumed += 1;
        if !self.agg.owns(partition) {
            return;
        }
        match self.decoder.decode(payload, kafka_ts) {
            Ok(event) => {
                self.agg.add(partition, offset, &event, now_ms);
            }
            Err(e) => {
                if self.agg.position(partition).is_some_and(|p| offset >= p) {
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
                self.agg.skip(partition, offset);
            }
        }
        self.batch_started.get_or_insert_with(Instant::now);
    }

    /// Periodic work between messages: collect a finished flush, start one, apply backpressure.
    fn tick(&mut self, consumer: &BaseConsumer<TallyContext>) {
        if let Some(f) = &self.in_flight {
            match f.reply.try_recv() {
                Ok(outcome) => self.complete(consumer, outcome, CommitMode::Async),
                Err(std_mpsc::TryRecvError::Empty) => {}
                Err(std_mpsc::TryRecvError::Disconnected) => self.in_flight = None,
            }
        }
        let due = self
            .batch_started
            .is_some_and(|t| t.elapsed() >= self.flush.interval)
            || self.agg.pending_keys() >= self.flush.max_keys;
        if self.in_flight.is_none() && due {
            self.start_flush(None);
        }
        let pending = self.agg.pending_keys() + self.in_flight.as_ref().map_or(0, |f| f.keys);
        let over = self.in_flight.is_some() && pending >= self.flush.max_pending_keys;
        if over != self.paused {
            self.set_paused(consumer, over);
        }
        if self.last_publish.elapsed() >= Duration::from_millis(200) {
            self.publish();
        }
    }

    fn set_paused(&mut self, consumer: &BaseConsumer<TallyContext>, paused: bool) {
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let result = if paused {
            consumer.pause(&assignment)
        } else {
            consumer.resume(&assignment)
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
        self.metrics.backpressure_paused.set(i64::from(paused));
    }

    /// Publish per-batch counts to metrics.
    fn publish(&mut self) {
        self.last_publish = Instant::now();
        self.metrics
            .messages_consumed
            .inc_by(std::mem::take(&mut self.consumed));
        for (i, n) in self.decode_errors.iter_mut().enumerate() {
            if *n > 0 {
                self.metrics
                    .decode_errors
                    .with_label_values(&[DECODE_REASONS[i]])
                    .inc_by(std::mem::take(n));
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
        self.metrics
            .pending_keys
            .set((self.agg.pending_keys() + in_flight) as i64);
    }

    /// Seal pending units (of `only` partitions, or all) and send them to the sink.
    /// Returns the number of units and keys sent.
    fn start_flush(&mut self, only: Option<&[i32]>) -> (usize, usize) {
        debug_assert!(
            self.in_flight.is_none(),
            "one flush at a time keeps units in order"
        );
        let batch = self.agg.seal(only);
        if only.is_some() {
            let ranges: Vec<(i32, i64, i64)> = batch
                .ends
                .iter()
                .map(|&(p, end)| {
                    let start = batch
                        .units
                        .iter()
                        .filter(|u| u.partition == p)
                        .map(|u| u.start)
                        .min()
                        .unwrap_or(end);
                    (p, start, end)
                })
                .collect();
            tracing::debug!(?ranges, "sealing partitions being revoked");
        }
        if only.is_none() {
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
        });
        self.publish();
        (units, keys)
    }

    /// Wait up to `timeout` for the flush in flight and process its outcome.
    fn drain(
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
    fn complete(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        outcome: FlushOutcome,
        mode: CommitMode,
    ) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        let conflicted: HashSet<i32> = outcome.conflicts.iter().map(|c| c.0).collect();
        let mut tpl = TopicPartitionList::new();
        for &(p, end) in &f.ends {
            if conflicted.contains(&p) {
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
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, mode) {
                // Harmless for exactness (Redis holds the applied offsets); lag may read high.
                tracing::warn!(error = %e, "kafka offset commit failed");
            }
        }
        let mut resynced: Vec<i32> = Vec::new();
        for &(p, shard, applied) in &outcome.conflicts {
            if resynced.contains(&p) {
                continue;
            }
            resynced.push(p);
            let refused = outcome.conflicts.iter().filter(|c| c.0 == p).count();
            tracing::warn!(partition = p, shard, applied, refused_units = refused, "redis applied a different offset range (another replica, or a replay); resynchronising");
            if self.agg.owns(p) && !self.revoking.contains(&p) {
                self.resync(consumer, p, applied);
            }
        }
        self.publish();
    }

    /// Drop what is pending for `partition` and restart it from Redis' applied offsets.
    fn resync(&mut self, consumer: &BaseConsumer<TallyContext>, partition: i32, hint: i64) {
        self.agg.revoke(partition);
        let Some(fences) = self.init_fences(vec![(partition, hint.max(0))]) else {
            return;
        };
        for (p, applied) in fences {
            let start = self.agg.assign(p, &applied);
            if let Err(e) = consumer.seek(&self.topic, p, Offset::Offset(start), KAFKA_TIMEOUT) {
                tracing::error!(partition = p, error = %e, "cannot seek; dropping the partition until the next rebalance");
                self.agg.revoke(p);
            }
        }
    }

    /// Ask the sink for the applied offsets of `partitions`, blocking this thread.
    fn init_fences(&mut self, partitions: Vec<(i32, i64)>) -> Option<Vec<(i32, Vec<i64>)>> {
        let (tx, rx) = std_mpsc::channel();
        self.sink
            .send(SinkRequest::InitFences {
                partitions,
                reply: tx,
            })
            .ok()?;
        rx.recv().ok()
    }

    fn on_assign(&mut self, consumer: &BaseConsumer<TallyContext>, tpl: &mut TopicPartitionList) {
        let parts: Vec<i32> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        if parts.is_empty() {
            return;
        }
        // Where to start a partition Redis has never seen: Kafka's committed offset, else the
        // configured end of the log.
        let committed = consumer.committed_offsets(tpl.clone(), KAFKA_TIMEOUT).ok();
        let mut initial = Vec::with_capacity(parts.len());
        for &p in &parts {
            let from_commit = committed
                .as_ref()
                .and_then(|c| c.find_partition(&self.topic, p))
                .and_then(|e| match e.offset() {
                    Offset::Offset(n) if n >= 0 => Some(n),
                    _ => None,
                });
            let start = from_commit.unwrap_or_else(|| match consumer.fetch_watermarks(&self.topic, p, KAFKA_TIMEOUT) {
                Ok((low, high)) => match self.start_from {
                    StartFrom::Earliest => low,
                    StartFrom::Latest => high,
                },
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "cannot read watermarks; starting at offset 0");
                    0
                }
            });
            initial.push((p, start));
        }
        let Some(fences) = self.init_fences(initial) else {
            tracing::warn!("redis unavailable while assigning partitions; shutting down");
            return;
        };
        for (p, applied) in fences {
            let start = self.agg.assign(p, &applied);
            tracing::info!(partition = p, start, "partition assigned");
            if let Err(e) = tpl.set_partition_offset(&self.topic, p, Offset::Offset(start)) {
                tracing::error!(partition = p, error = %e, "cannot set start offset");
            }
        }
    }

    fn on_revoke(&mut self, consumer: &BaseConsumer<TallyContext>, tpl: &TopicPartitionList) {
        let parts: Vec<i32> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        self.revoking = parts.clone();
        let grace = self.flush.shutdown_grace;
        self.drain(consumer, grace, CommitMode::Sync);
        let before = (
            self.metrics.fence_conflicts.get(),
            self.metrics.units_already_applied.get(),
        );
        let (units, keys) = self.start_flush(Some(&parts));
        self.drain(consumer, grace, CommitMode::Sync);
        let refused = self.metrics.fence_conflicts.get() + self.metrics.units_already_applied.get()
            - before.0
            - before.1;
        tracing::info!(partitions = ?parts, units, keys, refused, "flushed partitions being revoked");
        for &p in &parts {
            self.agg.revoke(p);
            let _ = self
                .metrics
                .committed_offset
                .remove_label_values(&[&p.to_string()]);
            let _ = self
                .metrics
                .consumer_lag
                .remove_label_values(&[&p.to_string()]);
        }
        self.revoking.clear();
    }

    /// Final flush and commit on shutdown, within `grace`.
    fn finish(&mut self, consumer: &BaseConsumer<TallyContext>, grace: Duration) {
        let deadline = Instant::now() + grace;
        self.drain(consumer, grace, CommitMode::Sync);
        self.start_flush(None);
        let left = deadline.saturating_duration_since(Instant::now());
        if self.drain(consumer, left, CommitMode::Sync) {
            tracing::info!("final flush landed and offsets committed");
        }
        self.publish();
    }
}

impl ClientContext for TallyContext {
    fn stats(&self, statistics: Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else {
            return;
        };
        for (p, part) in &topic.partitions {
            if *p >= 0 && part.consumer_lag >= 0 {
                self.metrics
                    .consumer_lag
                    .with_label_values(&[&p.to_string()])
                    .set(part.consumer_lag);
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(error = %error, reason, "kafka client error");
    }
}

impl ConsumerContext for TallyContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let mut worker = self.worker();
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.metrics.rebalances.with_label_values(&["assign"]).inc();
                if !self.shutdown.is_cancelled() {
                    worker.on_assign(consumer, tpl);
                }
                let r = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if worker.paused {
                    let _ = consumer.pause(tpl);
                }
                r
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.metrics.rebalances.with_label_values(&["revoke"]).inc();
                worker.on_revoke(consumer, tpl);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; releasing all partitions");
                for e in tpl.elements_for_topic(&self.topic) {
                    worker.agg.revoke(e.partition());
                }
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "applying the new assignment failed");
        }
        self.health
            .kafka
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let assigned = consumer.assignment().map_or(0, |a| a.count());
        self.metrics.assigned_partitions.set(assigned as i64);
    }
}

/// The consumer thread: poll, decode, aggregate, flush; until `shutdown`, then a final flush.
pub fn run(consumer: BaseConsumer<TallyContext>, grace: Duration) -> Result<(), KafkaError> {
    let ctx = consumer.context().clone();
    consumer.subscribe(&[&ctx.topic])?;
    let mut now_ms = unix_ms();
    let mut polls: u32 = 0;
    while !ctx.shutdown.is_cancelled() {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) {
            now_ms = unix_ms();
            ctx.worker().tick(&consumer);
        }
        match consumer.poll(Duration::from_millis(20)) {
            None => {
                now_ms = unix_ms();
                ctx.worker().tick(&consumer);
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "kafka consume error");
                ctx.worker().tick(&consumer);
            }
            Some(Ok(msg)) => {
                ctx.health
                    .kafka
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let ts = msg.timestamp().to_millis();
                ctx.worker()
                    .handle(msg.partition(), msg.offset(), msg.payload(), ts, now_ms);
            }
        }
    }
    tracing::info!("shutting down: final flush");
    ctx.worker().finish(&consumer, grace);
    tracing::debug!("closing the kafka consumer");
    drop(consumer);
    tracing::debug!("kafka consumer closed");
    Ok(())
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
