//! Aggregation: events added to each counter, dropped as late or skipped on replay, and the
//! keys held in memory until a flush. Labelled by counter name (from the config).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use super::{counter, counter_vec, gauge};

/// What the aggregators did with decoded events.
#[derive(Clone)]
pub struct AggregateMetrics {
    /// Events added to a counter's pending deltas, by counter.
    pub events_counted: IntCounterVec,
    /// Events dropped because their window (plus retention) had already expired, by counter.
    pub late_events: IntCounterVec,
    /// Events a counter did not take, by counter and reason: `filtered` (its filter said no),
    /// `expression_error` (its filter or a derived field failed), `missing_field` and
    /// `invalid_field` (a field only filtered counters read).
    pub events_skipped: IntCounterVec,
    /// Event contributions skipped because Redis already holds them (replay after a restart).
    pub replayed_events_skipped: IntCounter,
    /// Keys waiting in memory for a flush.
    pub pending_keys: IntGauge,
}

impl AggregateMetrics {
    pub(super) fn new(registry: &Registry, counter_names: &[String]) -> AggregateMetrics {
        let m = AggregateMetrics {
            events_counted: counter_vec(
                registry,
                "tally_events_counted_total",
                "Events added to a counter.",
                &["counter"],
            ),
            late_events: counter_vec(
                registry,
                "tally_late_events_total",
                "Events not counted because their window and retention had already expired.",
                &["counter"],
            ),
            events_skipped: counter_vec(
                registry,
                "tally_events_skipped_total",
                "Events a counter did not take: its filter said no, an expression failed, or a field it needs is missing or invalid.",
                &["counter", "reason"],
            ),
            replayed_events_skipped: counter(
                registry,
                "tally_replayed_events_skipped_total",
                "Event contributions skipped on replay because Redis already holds them.",
            ),
            pending_keys: gauge(
                registry,
                "tally_pending_keys",
                "Keys held in memory waiting for a flush.",
            ),
        };
        for c in counter_names {
            m.events_counted.with_label_values(&[c]);
            m.late_events.with_label_values(&[c]);
        }
        m
    }
}
