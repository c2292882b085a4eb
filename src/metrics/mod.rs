//! Every Prometheus metric tally exports, registered in one place on an explicit registry.
//!
//! Labels are bounded: counter name (from config), partition (topic size), error kind and
//! decode reason (closed enums). A user's key or dimension value is never a label.
//!
//! One struct per stage, each in its own file with its constructor beside the label enums it
//! uses, following the data: [`ConsumerMetrics`] (Kafka), [`DecodeMetrics`],
//! [`AggregateMetrics`], [`SinkMetrics`] (flushes), [`RedisMetrics`] (the stream path's
//! connection), [`RecoveryMetrics`], then [`RequestMetrics`] and [`JobMetrics`].

mod aggregate;
mod consumer;
mod decode;
mod jobs;
mod labels;
mod recovery;
mod redis;
mod request;
mod share;
mod sink;

pub use aggregate::AggregateMetrics;
pub use consumer::{ConsumerMetrics, RebalanceKind};
pub use decode::DecodeMetrics;
pub use jobs::JobMetrics;
pub use recovery::{HaltReason, RecoveryMetrics, ResetReason};
pub use redis::{RedisErrorKind, RedisMetrics};
pub use request::{Outcome, Primitive, RequestMetrics};
pub use share::{GaugeShare, LaneGauges};
pub use sink::{RejectReason, SinkMetrics};

use crate::decode::DecodeError;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// All metrics of one tally process.
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Messages read, offsets committed, rebalances, backpressure.
    pub consumer: ConsumerMetrics,
    /// Messages that could not be decoded.
    pub decode: DecodeMetrics,
    /// Events counted, late or replayed; keys pending.
    pub aggregate: AggregateMetrics,
    /// What the flushes wrote.
    pub sink: SinkMetrics,
    /// The stream path's Redis errors and retries.
    pub redis: RedisMetrics,
    /// Partitions halted, rebuilt or reset.
    pub recovery: RecoveryMetrics,
    /// The request path's metrics.
    pub request: RequestMetrics,
    /// The jobs' metrics.
    pub jobs: JobMetrics,
    // The same handles under their names from before the split, until the callers use the
    // sections (`metrics.sink.flush_duration`); each is a clone of the section's handle.
    /// Alias of `consumer.messages_consumed`.
    pub messages_consumed: IntCounter,
    /// Alias of `decode.decode_errors`.
    pub decode_errors: IntCounterVec,
    /// Alias of `aggregate.events_counted`.
    pub events_counted: IntCounterVec,
    /// Alias of `aggregate.late_events`.
    pub late_events: IntCounterVec,
    /// Alias of `aggregate.replayed_events_skipped`.
    pub replayed_events_skipped: IntCounter,
    /// Alias of `sink.keys_flushed`.
    pub keys_flushed: IntCounter,
    /// Alias of `sink.late_keys`.
    pub late_keys: IntCounter,
    /// Alias of `sink.flush_duration`.
    pub flush_duration: Histogram,
    /// Alias of `sink.flush_keys`.
    pub flush_keys: Histogram,
    /// Alias of `redis.redis_errors`.
    pub redis_errors: IntCounterVec,
    /// Alias of `redis.redis_retries`.
    pub redis_retries: IntCounter,
    /// Alias of `redis.noscript_reloads`.
    pub noscript_reloads: IntCounter,
    /// Alias of `sink.fence_conflicts`.
    pub fence_conflicts: IntCounter,
    /// Alias of `sink.units_already_applied`.
    pub units_already_applied: IntCounter,
    /// Alias of `decode.dead_letters`.
    pub dead_letters: IntCounter,
    /// Alias of `decode.dead_letter_errors`.
    pub dead_letter_errors: IntCounter,
    /// Alias of `aggregate.pending_keys`.
    pub pending_keys: IntGauge,
    /// Alias of `consumer.backpressure_paused`.
    pub backpressure_paused: IntGauge,
    /// Alias of `consumer.lanes_paused`.
    pub lanes_paused: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// Alias of `consumer.committed_offset`.
    pub committed_offset: IntGaugeVec,
    /// Alias of `consumer.consumer_lag`.
    pub consumer_lag: IntGaugeVec,
    /// Alias of `consumer.rebalances`.
    pub rebalances: IntCounterVec,
    /// Alias of `consumer.assigned_partitions`.
    pub assigned_partitions: IntGauge,
    /// Alias of `sink.keys_rejected`.
    pub keys_rejected: IntCounterVec,
    /// Alias of `redis.eviction_policy_unsafe`.
    pub eviction_policy_unsafe: IntGauge,
    /// Alias of `recovery.partitions_halted`.
    pub partitions_halted: IntGaugeVec,
    /// Alias of `recovery.state_rebuilds`.
    pub state_rebuilds: IntCounter,
    /// Alias of `recovery.rebuild_remaining`.
    pub rebuild_remaining: IntGauge,
    /// Alias of `recovery.offset_resets`.
    pub offset_resets: IntCounterVec,
}

pub(super) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

pub(super) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

pub(super) fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

impl Metrics {
    /// Create and register every metric, including process CPU and memory.
    pub fn new(counter_names: &[String]) -> Metrics {
        let registry = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            let _ = registry.register(Box::new(pc));
        }
        let (consumer, decode) = (
            ConsumerMetrics::new(&registry),
            DecodeMetrics::new(&registry),
        );
        let aggregate = AggregateMetrics::new(&registry, counter_names);
        let (sink, redis) = (SinkMetrics::new(&registry), RedisMetrics::new(&registry));
        let recovery = RecoveryMetrics::new(&registry);
        Metrics {
            messages_consumed: consumer.messages_consumed.clone(),
            decode_errors: decode.decode_errors.clone(),
            events_counted: aggregate.events_counted.clone(),
            late_events: aggregate.late_events.clone(),
            replayed_events_skipped: aggregate.replayed_events_skipped.clone(),
            keys_flushed: sink.keys_flushed.clone(),
            late_keys: sink.late_keys.clone(),
            flush_duration: sink.flush_duration.clone(),
            flush_keys: sink.flush_keys.clone(),
            redis_errors: redis.redis_errors.clone(),
            redis_retries: redis.redis_retries.clone(),
            noscript_reloads: redis.noscript_reloads.clone(),
            fence_conflicts: sink.fence_conflicts.clone(),
            units_already_applied: sink.units_already_applied.clone(),
            dead_letters: decode.dead_letters.clone(),
            dead_letter_errors: decode.dead_letter_errors.clone(),
            pending_keys: aggregate.pending_keys.clone(),
            backpressure_paused: consumer.backpressure_paused.clone(),
            lanes_paused: consumer.lanes_paused.clone(),
            committed_offset: consumer.committed_offset.clone(),
            consumer_lag: consumer.consumer_lag.clone(),
            rebalances: consumer.rebalances.clone(),
            assigned_partitions: consumer.assigned_partitions.clone(),
            keys_rejected: sink.keys_rejected.clone(),
            eviction_policy_unsafe: redis.eviction_policy_unsafe.clone(),
            partitions_halted: recovery.partitions_halted.clone(),
            state_rebuilds: recovery.state_rebuilds.clone(),
            rebuild_remaining: recovery.rebuild_remaining.clone(),
            offset_resets: recovery.offset_resets.clone(),
            request: RequestMetrics::new(&registry),
            jobs: JobMetrics::new(&registry, counter_names),
            consumer,
            decode,
            aggregate,
            sink,
            redis,
            recovery,
            registry,
        }
    }

    /// Count `n` messages skipped as bad input for `reason`.
    pub fn decode_failed(&self, reason: DecodeError, n: u64) {
        self.decode.decode_failed(reason, n);
    }

    /// Count a failed Redis request.
    pub fn redis_error(&self, kind: RedisErrorKind) {
        self.redis.redis_error(kind);
    }

    /// Count a rebalance.
    pub fn rebalanced(&self, kind: RebalanceKind) {
        self.consumer.rebalanced(kind);
    }

    /// Count `n` increments Redis refused.
    pub fn keys_refused(&self, reason: RejectReason, n: u64) {
        self.sink.keys_refused(reason, n);
    }

    /// Count a resume point outside the retained range.
    pub fn offset_reset(&self, reason: ResetReason) {
        self.recovery.offset_reset(reason);
    }

    /// Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encode error: {e}\n"))
    }
}
