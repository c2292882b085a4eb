//! Envoy's rate limit quota service (on the RLS port): open streams, the requests the Envoys
//! report, the assignments sent, and the reports skipped, by domain and configured limit.

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

super::labels::labels!(
    /// Why a bucket report or a stream was not answered (`tally_rlqs_skipped_total{reason}`).
    QuotaSkip {
        /// No `[[rlqs.buckets]]` limit matches the bucket.
        NoLimit => "no_limit",
        /// A bucket id that is missing, empty, or past the caps.
        InvalidBucket => "invalid_bucket",
        /// The stream reports more buckets than `rlqs.max_buckets_per_stream`.
        TooManyBuckets => "too_many_buckets",
        /// Redis did not take the report or the grant.
        Redis => "redis",
        /// Stream refused: `rlqs.max_streams` are open.
        TooManyStreams => "too_many_streams",
        /// Stream refused: `rlqs.max_streams_per_peer` are open from the peer.
        TooManyStreamsPerPeer => "too_many_streams_per_peer",
        /// Stream refused: `rlqs.max_streams_per_connection` are open on the connection.
        TooManyStreamsPerConnection => "too_many_streams_per_connection",
        /// Stream closed: no report within `rlqs.assignment_ttl`.
        ReportTimeout => "report_timeout",
        /// The stream's first report names no domain.
        NoDomain => "no_domain",
    }
);

super::labels::labels!(
    /// What an Envoy reported of its requests (`tally_rlqs_reported_requests_total{outcome}`).
    ReportedOutcome {
        /// Admitted by the Envoy.
        Allowed => "allowed",
        /// Denied by the Envoy.
        Denied => "denied",
    }
);

super::labels::labels!(
    /// A bucket action sent (`tally_rlqs_actions_total{action}`).
    QuotaAction {
        /// A token bucket of the grant.
        Grant => "grant",
        /// `DENY_ALL`: nothing granted.
        DenyAll => "deny_all",
        /// `AbandonAction`: the bucket was idle for `rlqs.abandon_after`.
        Abandon => "abandon",
    }
);

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
        for reason in QuotaSkip::ALL {
            m.skipped.with_label_values(&[reason.label()]);
        }
        m
    }

    /// Count a report or stream not answered.
    pub fn skip(&self, reason: QuotaSkip) {
        self.skipped.with_label_values(&[reason.label()]).inc();
    }

    /// Count `n` requests reported by `outcome` for `[domain, limit]`.
    pub fn report(&self, labels: [&str; 2], outcome: ReportedOutcome, n: u64) {
        self.reported
            .with_label_values(&[labels[0], labels[1], outcome.label()])
            .inc_by(n);
    }

    /// Count a bucket action sent for `[domain, limit]`.
    pub fn act(&self, labels: [&str; 2], action: QuotaAction) {
        self.actions
            .with_label_values(&[labels[0], labels[1], action.label()])
            .inc();
    }
}
