//! A lane's partition lifecycle: where a partition starts (at assignment, after it was parked,
//! after Redis' state changed under it) and how it stops counting (parked), as [`Lifecycle`], a
//! view over the worker's owners made for one call.
//!
//! Resynchronising from Redis' state happens after a refused unit, or a fence check that found
//! an applied offset changed (a failover that lost acknowledged writes). Every partition of the
//! primary is usually concerned at once, so they are reopened together, and the common case asks
//! Kafka nothing: Redis' fences are read first, and a partition whose fences all exist and lie
//! within the watermarks librdkafka last saw starts at once. That is safe because a watermark
//! only grows: a fence at or below a high watermark seen is below the end now, and a start that
//! retention deleted since is reset by librdkafka and counted like any position deleted while
//! running. Any other partition (its state lost, missing or corrupt, a fence past the seen end or
//! before the seen start, no watermarks seen) is decided on fresh offsets, as at assignment.
//! After a Sentinel failover with lag, asking Kafka took 1-484 ms per lane of 4.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::ops::metrics::{LaneGauges, Metrics, ResetReason};
use crate::stream::aggregate::Aggregator;
use crate::stream::sink::FenceState;

use super::super::flush::Flusher;
use super::super::partitions::{kafka_offsets, PartitionStates};
use super::super::recovery::{self, Halt, Start};
use super::super::{TallyContext, KAFKA_TIMEOUT};
use super::schema_wait::SchemaWaits;

/// Partitions opened: where each starts, or why it must not.
pub(super) type Opened = Vec<(i32, Result<i64, Halt>)>;

/// The worker's owners that a partition's start and stop touch, borrowed for one call.
pub(super) struct Lifecycle<'w> {
    pub(super) consumer: &'w BaseConsumer<TallyContext>,
    pub(super) topic: &'w str,
    pub(super) agg: &'w mut Aggregator,
    pub(super) parts: &'w mut PartitionStates,
    pub(super) flusher: &'w Flusher,
    pub(super) schema_waits: &'w mut SchemaWaits,
    pub(super) metrics: &'w Metrics,
    pub(super) gauges: &'w mut LaneGauges,
}

impl Lifecycle<'_> {
    /// Decide where each of `parts` starts, from Redis' fences and Kafka's offsets (see
    /// [`recovery`]). `Ok(start)`: the partition is tracked and must be consumed from `start`;
    /// `Err`: it must not be.
    pub(super) fn open_partitions(&mut self, parts: &[i32]) -> Opened {
        let mut out = Vec::with_capacity(parts.len());
        let mut ready = Vec::with_capacity(parts.len());
        for (p, kafka) in kafka_offsets(self.consumer, self.topic, parts) {
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
        self.parts.opened(partition, &start, self.metrics);
        let lane = self.parts.lane();
        self.metrics.status.assigned(lane, partition, start.offset);
        self.agg.assign(partition, &start.applied);
        Ok(start.offset)
    }

    /// Stop counting `partition` until it can be opened again. Pauses it when `pause` (after a
    /// rebalance assigns it, the caller pauses parked partitions itself).
    pub(super) fn park(&mut self, partition: i32, halt: Halt, pause: bool) {
        self.agg.revoke(partition);
        // Reopened where Redis says, it reads its events again anyway.
        self.schema_waits.forget(partition);
        if pause {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(self.topic, partition);
            if let Err(e) = self.consumer.pause(&tpl) {
                tracing::warn!(partition, error = %e, "cannot pause partition");
            }
        }
        self.parts.park(partition, halt, self.gauges);
    }

    /// Try parked partitions again (every few seconds); resume those that open.
    pub(super) fn retry_parked(&mut self) {
        let parts = self.parts.retry_due();
        if parts.is_empty() {
            return;
        }
        for (p, result) in self.open_partitions(&parts) {
            let start = match result {
                Ok(start) => start,
                Err(halt) => {
                    self.park(p, halt, false);
                    continue;
                }
            };
            let sought = self
                .consumer
                .seek(self.topic, p, Offset::Offset(start), KAFKA_TIMEOUT);
            if let Err(e) = sought {
                tracing::warn!(partition = p, error = %e, "cannot seek; will retry");
                self.agg.revoke(p);
                continue;
            }
            self.parts.unpark(p, self.gauges);
            if !self.flusher.paused() && !self.schema_waits.holds(p) {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(self.topic, p);
                let _ = self.consumer.resume(&tpl);
            }
            tracing::info!(partition = p, start, "partition resumed");
        }
    }

    /// Drop what is pending for `partitions` and restart them from Redis' state; park those
    /// whose state does not allow a safe start. Reopened behind where it was, a partition is
    /// replaying: not ready until back there.
    pub(super) fn resync(&mut self, partitions: &[i32]) {
        if partitions.is_empty() {
            return;
        }
        let was_at: Vec<(i32, Option<i64>)> = partitions
            .iter()
            .map(|&p| (p, self.agg.position(p)))
            .collect();
        for &p in partitions {
            self.agg.revoke(p);
        }
        let began = Instant::now();
        let (opened, asked_kafka, [fences, kafka]) = self.reopen(partitions);
        let read = began.elapsed();
        let mut seeks = TopicPartitionList::new();
        for (p, result) in &opened {
            match result {
                Ok(start) => {
                    let _ = seeks
                        .add_partition(self.topic, *p)
                        .set_offset(Offset::Offset(*start));
                }
                Err(halt) => self.park(*p, halt.clone(), true),
            }
        }
        if seeks.count() == 0 {
            return;
        }
        let sought = self.consumer.seek_partitions(seeks, KAFKA_TIMEOUT);
        tracing::info!(
            partitions = ?partitions,
            redis_fences = ?fences,
            asked_kafka = ?asked_kafka,
            kafka_offsets = ?kafka,
            seek = ?began.elapsed().saturating_sub(read),
            "partitions reopened where redis says they are"
        );
        for (p, result) in opened {
            let Ok(start) = result else { continue };
            let error = match &sought {
                Err(e) => Some(e.to_string()),
                Ok(list) => list
                    .find_partition(self.topic, p)
                    .and_then(|e| e.error().err())
                    .map(|e| e.to_string()),
            };
            if let Some(e) = error {
                tracing::warn!(partition = p, error = %e, "cannot seek; retrying shortly");
                self.park(p, Halt::KafkaUnavailable(e), true);
            } else if let Some(was_at) = was_at
                .iter()
                .find(|(q, _)| *q == p)
                .and_then(|(_, at)| *at)
                .filter(|&at| start < at)
            {
                self.parts.replaying(p, start, was_at);
            }
        }
    }

    /// Where each of `parts` starts again (see the module): from the fences and the watermarks
    /// seen where they allow it, else on fresh offsets. Also returns the partitions that needed
    /// Kafka, and how long the fence read and Kafka took.
    fn reopen(&mut self, parts: &[i32]) -> (Opened, Vec<i32>, [Duration; 2]) {
        let began = Instant::now();
        // -1: read only; a missing state is created on the full path, from Kafka's offsets.
        let request = parts.iter().map(|&p| (p, -1)).collect();
        let fences = self.flusher.init_fences(request, self.parts.init_timeout());
        let fences_took = began.elapsed();
        let mut out = Vec::with_capacity(parts.len());
        let mut ask = Vec::new();
        match fences {
            Ok(fences) => {
                for (p, states) in fences {
                    match seen_start(self.consumer, self.topic, p, &states) {
                        Some(start) => out.push((p, self.open(p, Ok(start)))),
                        None => ask.push(p),
                    }
                }
            }
            // Redis did not answer: every partition waits for it (parked, retried shortly).
            Err(e) => out.extend(
                parts
                    .iter()
                    .map(|&p| (p, Err(Halt::RedisUnavailable(e.to_string())))),
            ),
        }
        let began = Instant::now();
        if !ask.is_empty() {
            out.extend(self.open_partitions(&ask));
        }
        (out, ask, [fences_took, began.elapsed()])
    }
}

/// The start the fences give when they all exist and lie within the watermarks librdkafka last
/// saw for partition `p` (no request); None when that is not known without asking Kafka.
fn seen_start(
    consumer: &BaseConsumer<TallyContext>,
    topic: &str,
    p: i32,
    states: &[FenceState],
) -> Option<Start> {
    if !states.iter().all(|s| matches!(s, FenceState::Existing(_))) {
        return None;
    }
    let (low, high) = seen_watermarks(consumer, topic, p)?;
    if low < 0 || high < 0 {
        return None;
    }
    // `has_commit` only matters for a state created here, and none is.
    let start = recovery::decide(states, true, low, high).ok()?;
    (start.gap_from.is_none()).then_some(start)
}

/// librdkafka's cached watermarks of `p` (`rd_kafka_get_watermark_offsets`, which sends no
/// request: the high one follows every fetch response, the low one the statistics); rust-rdkafka
/// wraps only the querying `fetch_watermarks`.
fn seen_watermarks(
    consumer: &BaseConsumer<TallyContext>,
    topic: &str,
    p: i32,
) -> Option<(i64, i64)> {
    use rdkafka::bindings::{rd_kafka_get_watermark_offsets, rd_kafka_resp_err_t};
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle lives as long as `consumer`, borrowed for the call; `topic` is
    // NUL-terminated and outlives the call; `low` and `high` are valid for writes.
    let err = unsafe {
        rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            p,
            &mut low,
            &mut high,
        )
    };
    (err == rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then_some((low, high))
}
