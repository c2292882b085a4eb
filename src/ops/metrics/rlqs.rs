//! Envoy's rate limit quota service (on the RLS port): open streams, the requests the Envoys
//! report, the assignments sent, and the reports skipped, by domain and configured limit.

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

/// Metrics of `StreamRateLimitQuotas`.
#[derive(Clone)]
pub struct RlqsMetrics {
    /// Streams open on this replica (one per Envoy).
    pub streams: IntGauge,
    /// Requests the Envoys reported, by domain, configured limit (`name`) and outcome
    /// (`allowed`, `denied`).
    pub reported: IntCounterVec,
    /// Bucket actions sent, by domain, configured limit and action (`grant`, `deny_all`,
    /// `abandon`).
    pub actions: IntCounterVec,
    /// Requests granted to the Envoys (summed over assignments), by domain and limit.
    pub granted: IntCounterVec,
    /// Bucket reports (or streams) not answered, by reason (`no_limit`, `invalid_bucket`,
    /// `too_many_buckets`, `redis`, `no_domain`; streams refused: `too_many_streams`,
    /// `too_many_streams_per_peer`, `too_many_streams_per_connection`; closed:
    /// `report_timeout`).
    pub skipped: IntCounterVec,
    /// Requests reported allowed beyond what the reporting stream was granted (and the slack),
    /// not counted in the window, by domain and limit. The client is in the log line: one
    /// certificate or address per Envoy would be a label without bound.
    pub excess: IntCounterVec,
    /// The window's requests reported allowed across every Envoy, at the last report, by domain
    /// and limit (the last bucket reported).
    pub used: IntGaugeVec,
}

impl RlqsMetrics {
    pub(super) fn new(registry: &Registry) -> RlqsMetrics {
        let m = RlqsMetrics {
            streams: super::gauge(
                registry,
                "tally_rlqs_streams",
                "Envoy rate limit quota streams open on this replica.",
            ),
            reported: super::counter_vec(
                registry,
                "tally_rlqs_reported_requests_total",
                "Requests Envoy reported to the quota service, by domain, limit and outcome.",
                &["domain", "limit", "outcome"],
            ),
            actions: super::counter_vec(
                registry,
                "tally_rlqs_actions_total",
                "Bucket actions sent to Envoy by the quota service, by domain, limit and action.",
                &["domain", "limit", "action"],
            ),
            granted: super::counter_vec(
                registry,
                "tally_rlqs_granted_requests_total",
                "Requests granted to Envoys by the quota service's assignments, by domain and limit.",
                &["domain", "limit"],
            ),
            skipped: super::counter_vec(
                registry,
                "tally_rlqs_skipped_total",
                "Bucket reports or streams the quota service did not answer, by reason.",
                &["reason"],
            ),
            excess: super::counter_vec(
                registry,
                "tally_rlqs_excess_requests_total",
                "Requests an Envoy reported allowed beyond its grants and the slack, not counted, by domain and limit.",
                &["domain", "limit"],
            ),
            used: super::gauge_vec(
                registry,
                "tally_rlqs_window_used",
                "Requests reported allowed in the current window across every Envoy, at the last report, by domain and limit.",
                &["domain", "limit"],
            ),
        };
        for reason in [
            "no_limit",
            "invalid_bucket",
            "too_many_buckets",
            "redis",
            "too_many_streams",
            "too_many_streams_per_peer",
            "too_many_streams_per_connection",
            "report_timeout",
            "no_domain",
        ] {
            m.skipped.with_label_values(&[reason]);
        }
        m
    }
}
