//! The Kafka side: messages read, offsets committed, lag, rebalances, assignment and
//! backpressure.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter, counter_vec, float_gauge_vec, gauge, gauge_vec};

super::labels::labels!(
    /// A consumer group rebalance (`tally_rebalances_total{kind}`).
    RebalanceKind {
        /// Partitions assigned to this process.
        Assign => "assign",
        /// Partitions taken away.
        Revoke => "revoke",
    }
);

/// What the consumer lanes read and commit.
#[derive(Clone)]
pub struct ConsumerMetrics {
    /// Messages read from Kafka (before decoding).
    pub messages_consumed: IntCounter,
    /// Last offset committed to Kafka, by topic and partition.
    pub committed_offset: IntGaugeVec,
    /// Messages not yet counted, by owned topic and partition (the lag probe: the broker's end minus what
    /// Redis has applied).
    pub consumer_lag: IntGaugeVec,
    /// Age of the oldest message not yet counted, by owned topic and partition (0 without a backlog).
    pub lag_seconds: GaugeVec,
    /// Partition assignments and revocations.
    pub rebalances: IntCounterVec,
    /// Partitions each rebalance assigned or revoked (with incremental rebalances, only those
    /// that moved; with the eager protocol, every partition of the member).
    pub rebalanced_partitions: IntCounterVec,
    /// Partitions currently assigned to this process.
    pub assigned_partitions: IntGauge,
    /// 1 while consumption is paused for backpressure.
    pub backpressure_paused: IntGauge,
    /// Consumer lanes paused right now (behind `backpressure_paused`).
    pub lanes_paused: Arc<AtomicI64>,
    /// Topics each `kafka.topics[].pattern` matches, by pattern and state (`reading`,
    /// `unread`: no counter reads it, `over_limit`: past `kafka.max_pattern_topics`).
    pub patterns: IntGaugeVec,
}

impl ConsumerMetrics {
    pub(super) fn new(registry: &Registry) -> ConsumerMetrics {
        let m = ConsumerMetrics {
            messages_consumed: counter(
                registry,
                "tally_messages_consumed_total",
                "Messages read from Kafka.",
            ),
            committed_offset: gauge_vec(
                registry,
                "tally_committed_offset",
                "Last offset committed to Kafka, by topic and partition.",
                &["topic", "partition"],
            ),
            consumer_lag: gauge_vec(
                registry,
                "tally_consumer_lag_messages",
                "Messages not yet counted: the partition's end, asked of the broker every kafka.lag_interval, minus the offset Redis has applied (paused and halted partitions included), by topic and partition.",
                &["topic", "partition"],
            ),
            lag_seconds: float_gauge_vec(
                registry,
                "tally_consumer_lag_seconds",
                "Age of the oldest message not yet counted (its Kafka timestamp), by topic and partition; 0 without a backlog.",
                &["topic", "partition"],
            ),
            rebalances: counter_vec(
                registry,
                "tally_rebalances_total",
                "Consumer group rebalances seen, by kind (assign, revoke).",
                &["kind"],
            ),
            rebalanced_partitions: counter_vec(
                registry,
                "tally_rebalanced_partitions_total",
                "Partitions assigned to or revoked from this process by rebalances, by kind (assign, revoke).",
                &["kind"],
            ),
            assigned_partitions: gauge(
                registry,
                "tally_assigned_partitions",
                "Partitions currently assigned to this process.",
            ),
            backpressure_paused: gauge(
                registry,
                "tally_backpressure_paused",
                "1 while consumption (of any consumer lane) is paused because too many keys are pending.",
            ),
            lanes_paused: Default::default(),
            patterns: gauge_vec(
                registry,
                "tally_pattern_topics",
                "Topics a kafka.topics[].pattern matches, by pattern and state: reading, unread (no counter reads it), over_limit (not read: past kafka.max_pattern_topics).",
                &["pattern", "state"],
            ),
        };
        for k in RebalanceKind::ALL {
            m.rebalances.with_label_values(&[k.label()]);
            m.rebalanced_partitions.with_label_values(&[k.label()]);
        }
        m
    }

    /// The topics `pattern` matches: `[reading, unread, over_limit]`.
    pub fn pattern_topics(&self, pattern: &str, counts: [usize; 3]) {
        for (state, n) in ["reading", "unread", "over_limit"].into_iter().zip(counts) {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.patterns.with_label_values(&[pattern, state]).set(n);
        }
    }

    /// Count a rebalance.
    /// A rebalance of `kind` that moved `partitions` partitions.
    pub fn rebalanced(&self, kind: RebalanceKind, partitions: usize) {
        self.rebalances.with_label_values(&[kind.label()]).inc();
        self.rebalanced_partitions
            .with_label_values(&[kind.label()])
            .inc_by(partitions as u64);
    }
}
