//! Every Prometheus metric tally exports, registered in one place on an explicit registry.
//!
//! Labels are bounded: counter name (from config), partition (topic size), error kind and
//! decode reason (closed enums). A user's key or dimension value is never a label.

mod jobs;
mod labels;
mod request;
mod share;

pub use jobs::JobMetrics;
pub use labels::{
    HaltReason, Outcome, Primitive, RebalanceKind, RedisErrorKind, RejectReason, ResetReason,
};
pub use request::RequestMetrics;
pub use share::{GaugeShare, LaneGauges};

use crate::decode::DecodeError;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// All metrics of one tally process.
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Messages read from Kafka (before decoding).
    pub messages_consumed: IntCounter,
    /// Messages skipped because they could not be decoded, by reason.
    pub decode_errors: IntCounterVec,
    /// Events added to a counter's pending deltas, by counter.
    pub events_counted: IntCounterVec,
    /// Events dropped because their window (plus retention) had already expired, by counter.
    pub late_events: IntCounterVec,
    /// Event contributions skipped because Redis already holds them (replay after a restart).
    pub replayed_events_skipped: IntCounter,
    /// Keys written to Redis (one INCRBY each).
    pub keys_flushed: IntCounter,
    /// Keys the flush script refused to write because their expiry had passed by flush time.
    pub late_keys: IntCounter,
    /// Wall time of one flush, from sending to all replies, including retries.
    pub flush_duration: Histogram,
    /// Keys per flush.
    pub flush_keys: Histogram,
    /// Failed Redis round trips, by kind.
    pub redis_errors: IntCounterVec,
    /// Flush attempts repeated after a failure.
    pub redis_retries: IntCounter,
    /// Times the flush script was loaded again after NOSCRIPT.
    pub noscript_reloads: IntCounter,
    /// Flush units refused because Redis had applied a different range (zombie or replay).
    pub fence_conflicts: IntCounter,
    /// Flush units skipped because Redis had already applied their whole range (retry, replay, zombie).
    pub units_already_applied: IntCounter,
    /// Undecodable messages delivered to the dead-letter topic.
    pub dead_letters: IntCounter,
    /// Dead letters that could not be queued or delivered.
    pub dead_letter_errors: IntCounter,
    /// Keys waiting in memory for a flush.
    pub pending_keys: IntGauge,
    /// 1 while consumption is paused for backpressure.
    pub backpressure_paused: IntGauge,
    /// Consumer lanes paused right now (behind `backpressure_paused`).
    pub lanes_paused: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// Last offset committed to Kafka, by partition.
    pub committed_offset: IntGaugeVec,
    /// Consumer lag reported by librdkafka, by partition.
    pub consumer_lag: IntGaugeVec,
    /// Partition assignments and revocations.
    pub rebalances: IntCounterVec,
    /// Partitions currently assigned to this process.
    pub assigned_partitions: IntGauge,
    /// Keys Redis refused to increment, by reason (`overflow`, `not_integer`).
    pub keys_rejected: IntCounterVec,
    /// 1 while Redis' maxmemory-policy may evict keys.
    pub eviction_policy_unsafe: IntGauge,
    /// Partitions not counted because their state in Redis needs an operator (or Redis/Kafka
    /// did not answer), by reason. The partitions are named in the log and `/health/ready`.
    pub partitions_halted: IntGaugeVec,
    /// Partitions recounted from the earliest retained offset after Redis lost tally's state.
    pub state_rebuilds: IntCounter,
    /// Offsets the partitions being rebuilt still have to read.
    pub rebuild_remaining: IntGauge,
    /// Resume points outside the topic's retained range, by reason.
    pub offset_resets: IntCounterVec,
    /// The request path's metrics.
    pub request: RequestMetrics,
    /// The jobs' metrics.
    pub jobs: JobMetrics,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
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
        let m = Metrics {
            messages_consumed: counter(
                &registry,
                "tally_messages_consumed_total",
                "Messages read from Kafka.",
            ),
            decode_errors: counter_vec(
                &registry,
                "tally_decode_errors_total",
                "Messages skipped because they could not be decoded, by reason.",
                &["reason"],
            ),
            events_counted: counter_vec(
                &registry,
                "tally_events_counted_total",
                "Events added to a counter.",
                &["counter"],
            ),
            late_events: counter_vec(
                &registry,
                "tally_late_events_total",
                "Events not counted because their window and retention had already expired.",
                &["counter"],
            ),
            replayed_events_skipped: counter(
                &registry,
                "tally_replayed_events_skipped_total",
                "Event contributions skipped on replay because Redis already holds them.",
            ),
            keys_flushed: counter(
                &registry,
                "tally_keys_flushed_total",
                "Counter keys incremented in Redis.",
            ),
            late_keys: counter(
                &registry,
                "tally_late_keys_total",
                "Keys not written because their expiry passed before the flush ran.",
            ),
            flush_duration: histogram(
                &registry,
                "tally_flush_duration_seconds",
                "Time to apply one flush to Redis, retries included.",
                prometheus::exponential_buckets(0.0005, 2.0, 18).expect("valid buckets"),
            ),
            flush_keys: histogram(
                &registry,
                "tally_flush_keys",
                "Keys written per flush.",
                prometheus::exponential_buckets(1.0, 4.0, 11).expect("valid buckets"),
            ),
            redis_errors: counter_vec(
                &registry,
                "tally_redis_errors_total",
                "Failed Redis requests, by kind.",
                &["kind"],
            ),
            redis_retries: counter(
                &registry,
                "tally_redis_retries_total",
                "Flush attempts repeated after a Redis failure.",
            ),
            noscript_reloads: counter(
                &registry,
                "tally_noscript_reloads_total",
                "Flush script reloads after NOSCRIPT.",
            ),
            fence_conflicts: counter(
                &registry,
                "tally_fence_conflicts_total",
                "Flush units refused because Redis had applied a different offset range.",
            ),
            units_already_applied: counter(
                &registry,
                "tally_units_already_applied_total",
                "Flush units not applied because Redis already held their whole offset range.",
            ),
            dead_letters: counter(
                &registry,
                "tally_dead_letters_total",
                "Undecodable messages delivered to the dead-letter topic.",
            ),
            dead_letter_errors: counter(
                &registry,
                "tally_dead_letter_errors_total",
                "Dead letters that could not be queued or delivered.",
            ),
            pending_keys: gauge(
                &registry,
                "tally_pending_keys",
                "Keys held in memory waiting for a flush.",
            ),
            lanes_paused: Default::default(),
            backpressure_paused: gauge(
                &registry,
                "tally_backpressure_paused",
                "1 while consumption (of any consumer lane) is paused because too many keys are pending.",
            ),
            committed_offset: gauge_vec(
                &registry,
                "tally_committed_offset",
                "Last offset committed to Kafka.",
                &["partition"],
            ),
            consumer_lag: gauge_vec(
                &registry,
                "tally_consumer_lag_messages",
                "Messages between the committed offset and the end of the partition.",
                &["partition"],
            ),
            rebalances: counter_vec(
                &registry,
                "tally_rebalances_total",
                "Consumer group rebalances seen, by kind (assign, revoke).",
                &["kind"],
            ),
            assigned_partitions: gauge(
                &registry,
                "tally_assigned_partitions",
                "Partitions currently assigned to this process.",
            ),
            keys_rejected: counter_vec(
                &registry,
                "tally_keys_rejected_total",
                "Keys Redis refused to increment (left unchanged), by reason: overflow, not_integer.",
                &["reason"],
            ),
            eviction_policy_unsafe: gauge(
                &registry,
                "tally_redis_eviction_unsafe",
                "1 while Redis' maxmemory-policy may evict keys (tally then refuses to write unless redis.allow_eviction).",
            ),
            partitions_halted: gauge_vec(
                &registry,
                "tally_partitions_halted",
                "Partitions not counted because their state in Redis needs an operator (see `tally state`) or Redis/Kafka did not answer, by reason.",
                &["reason"],
            ),
            state_rebuilds: counter(
                &registry,
                "tally_state_rebuilds_total",
                "Partitions recounted from the earliest retained offset after Redis lost tally's state.",
            ),
            rebuild_remaining: gauge(
                &registry,
                "tally_rebuild_remaining_offsets",
                "Offsets the partitions being rebuilt after a loss of tally's state still have to read.",
            ),
            offset_resets: counter_vec(
                &registry,
                "tally_offset_resets_total",
                "Resume points outside the retained range of a partition, by reason: beyond_end, before_log_start, auto_reset.",
                &["reason"],
            ),
            request: RequestMetrics::new(&registry),
            jobs: JobMetrics::new(&registry, counter_names),
            registry,
        };
        // Touch every bounded label so dashboards see zeroes instead of no series.
        for r in RejectReason::ALL {
            m.keys_rejected.with_label_values(&[r.label()]);
        }
        for r in HaltReason::ALL {
            m.partitions_halted.with_label_values(&[r.label()]);
        }
        for r in ResetReason::ALL {
            m.offset_resets.with_label_values(&[r.label()]);
        }
        for e in DecodeError::ALL {
            m.decode_errors.with_label_values(&[e.reason()]);
        }
        for c in counter_names {
            m.events_counted.with_label_values(&[c]);
            m.late_events.with_label_values(&[c]);
        }
        for k in RedisErrorKind::ALL {
            m.redis_errors.with_label_values(&[k.label()]);
        }
        for k in RebalanceKind::ALL {
            m.rebalances.with_label_values(&[k.label()]);
        }
        m
    }

    /// Count `n` messages skipped as bad input for `reason`.
    pub fn decode_failed(&self, reason: DecodeError, n: u64) {
        self.decode_errors
            .with_label_values(&[reason.reason()])
            .inc_by(n);
    }

    /// Count a failed Redis request.
    pub fn redis_error(&self, kind: RedisErrorKind) {
        self.redis_errors.with_label_values(&[kind.label()]).inc();
    }

    /// Count a rebalance.
    pub fn rebalanced(&self, kind: RebalanceKind) {
        self.rebalances.with_label_values(&[kind.label()]).inc();
    }

    /// Count `n` increments Redis refused.
    pub fn keys_refused(&self, reason: RejectReason, n: u64) {
        self.keys_rejected
            .with_label_values(&[reason.label()])
            .inc_by(n);
    }

    /// Count a resume point outside the retained range.
    pub fn offset_reset(&self, reason: ResetReason) {
        self.offset_resets
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encode error: {e}\n"))
    }
}
