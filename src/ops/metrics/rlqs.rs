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
    /// `too_many_buckets`, `redis`, `too_many_streams`, `no_domain`).
    pub skipped: IntCounterVec,
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
            "no_domain",
        ] {
            m.skipped.with_label_values(&[reason]);
        }
        m
    }
}
