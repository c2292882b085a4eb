//! Metrics of window results downstream: the watermarks the stream records and the publisher.
//! Labels are a counter's name or a partition number (bounded by the topic's partitions).

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Registry};

use super::{counter_vec, float_gauge_vec, gauge_vec};

/// Watermarks, idle partitions and what the publisher produced.
#[derive(Clone)]
pub struct PublishMetrics {
    /// Highest event time applied per partition (Unix ms), as the publisher last read it.
    pub watermark_seconds: GaugeVec,
    /// 1 for a partition the watermark currently leaves out (caught up and quiet), by partition.
    pub idle: IntGaugeVec,
    /// The watermark (after allowed lateness) per counter, Unix ms.
    pub counter_watermark_seconds: GaugeVec,
    /// Windows published when they closed, by counter.
    pub windows: IntCounterVec,
    /// Records produced and acknowledged, by counter and kind (final, correction, update, late,
    /// tombstone).
    pub records: IntCounterVec,
    /// Keys whose value changed after their window was published, by counter.
    pub corrections: IntCounterVec,
    /// Late changes of published windows not corrected (`late = "drop"`), by counter.
    pub late_dropped: IntCounterVec,
    /// Final attempts that produced a window's stored snapshot again, by counter.
    pub republished: IntCounterVec,
    /// How far publishing is behind: event time from the end of the oldest closed window not
    /// published to the counter's watermark (0: every closed window is out), by counter.
    pub behind_seconds: IntGaugeVec,
}

impl PublishMetrics {
    pub(super) fn new(registry: &Registry, counters: &[String]) -> PublishMetrics {
        let m = PublishMetrics {
            watermark_seconds: float_gauge_vec(
                registry,
                "tally_watermark_seconds",
                "Highest event time applied per partition (Unix seconds, millisecond precision), read by the window publisher, by topic and partition.",
                &["topic", "partition"],
            ),
            idle: gauge_vec(
                registry,
                "tally_partition_idle",
                "1 for a partition the watermark leaves out (caught up, no message for idle_timeout), by topic and partition.",
                &["topic", "partition"],
            ),
            counter_watermark_seconds: float_gauge_vec(
                registry,
                "tally_publish_watermark_seconds",
                "The topic watermark minus the counter's allowed lateness (Unix seconds, millisecond precision), by counter.",
                &["counter"],
            ),
            windows: counter_vec(
                registry,
                "tally_publish_windows_total",
                "Closed windows published, by counter.",
                &["counter"],
            ),
            records: counter_vec(
                registry,
                "tally_publish_records_total",
                "Records Kafka acknowledged, by counter and kind (final, correction, update; late: to the late topic; tombstone).",
                &["counter", "kind"],
            ),
            corrections: counter_vec(
                registry,
                "tally_publish_corrections_total",
                "Keys whose value changed after their window was published (late events), by counter.",
                &["counter"],
            ),
            late_dropped: counter_vec(
                registry,
                "tally_publish_late_dropped_total",
                "Keys whose value changed after their window was published final and that no correction was produced for (late = \"drop\"; counted in Redis all the same), by counter.",
                &["counter"],
            ),
            republished: counter_vec(
                registry,
                "tally_publish_republished_total",
                "Final attempts that produced a window's stored snapshot again (a retry after a failed or interrupted attempt), by counter.",
                &["counter"],
            ),
            behind_seconds: gauge_vec(
                registry,
                "tally_publish_behind_seconds",
                "Event time between the end of the oldest closed window not yet published and the counter's watermark (0: every closed window is published; it grows from the first closable window while nothing is published), by counter.",
                &["counter"],
            ),
        };
        for c in counters {
            m.counter_watermark_seconds.with_label_values(&[c]);
            m.windows.with_label_values(&[c]);
            m.corrections.with_label_values(&[c]);
            m.late_dropped.with_label_values(&[c]);
            m.republished.with_label_values(&[c]);
            m.behind_seconds.with_label_values(&[c]);
            for kind in ["final", "correction", "update", "late", "tombstone"] {
                m.records.with_label_values(&[c, kind]);
            }
        }
        m
    }
}
