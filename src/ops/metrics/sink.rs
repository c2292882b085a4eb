//! Flushes: keys written, how long a flush took, and the units and keys Redis did not apply.

use prometheus::{Histogram, IntCounter, IntCounterVec, Registry};

use super::{counter, counter_vec, histogram};

super::labels::labels!(
    /// Why Redis refused an increment (`tally_keys_rejected_total{reason}`).
    RejectReason {
        /// The stored value plus the delta overflows 64 bits.
        Overflow => "overflow",
        /// The key holds something that is not an integer.
        NotInteger => "not_integer",
    }
);

/// What the flushes wrote to Redis, and what they left unwritten.
#[derive(Clone)]
pub struct SinkMetrics {
    /// Keys written to Redis (one INCRBY each).
    pub keys_flushed: IntCounter,
    /// Keys the flush script refused to write because their expiry had passed by flush time.
    pub late_keys: IntCounter,
    /// Wall time of one flush, from sending to all replies, including retries.
    pub flush_duration: Histogram,
    /// Keys per flush.
    pub flush_keys: Histogram,
    /// Flush units refused because Redis had applied a different range (zombie or replay).
    pub fence_conflicts: IntCounter,
    /// Flush units skipped because Redis had already applied their whole range (retry, replay, zombie).
    pub units_already_applied: IntCounter,
    /// Keys Redis refused to increment, by reason (`overflow`, `not_integer`).
    pub keys_rejected: IntCounterVec,
}

impl SinkMetrics {
    pub(super) fn new(registry: &Registry) -> SinkMetrics {
        let m = SinkMetrics {
            keys_flushed: counter(
                registry,
                "tally_keys_flushed_total",
                "Counter keys incremented in Redis.",
            ),
            late_keys: counter(
                registry,
                "tally_late_keys_total",
                "Keys not written because their expiry passed before the flush ran.",
            ),
            flush_duration: histogram(
                registry,
                "tally_flush_duration_seconds",
                "Time to apply one flush to Redis, retries included.",
                prometheus::exponential_buckets(0.0005, 2.0, 18).expect("valid buckets"),
            ),
            flush_keys: histogram(
                registry,
                "tally_flush_keys",
                "Keys written per flush.",
                prometheus::exponential_buckets(1.0, 4.0, 11).expect("valid buckets"),
            ),
            fence_conflicts: counter(
                registry,
                "tally_fence_conflicts_total",
                "Flush units refused because Redis had applied a different offset range.",
            ),
            units_already_applied: counter(
                registry,
                "tally_units_already_applied_total",
                "Flush units not applied because Redis already held their whole offset range.",
            ),
            keys_rejected: counter_vec(
                registry,
                "tally_keys_rejected_total",
                "Keys Redis refused to increment (left unchanged), by reason: overflow, not_integer.",
                &["reason"],
            ),
        };
        for r in RejectReason::ALL {
            m.keys_rejected.with_label_values(&[r.label()]);
        }
        m
    }

    /// Count `n` increments Redis refused.
    pub fn keys_refused(&self, reason: RejectReason, n: u64) {
        self.keys_rejected
            .with_label_values(&[reason.label()])
            .inc_by(n);
    }
}
