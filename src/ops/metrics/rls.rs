//! Envoy's rate limit service (`tally serve`'s gRPC port): decisions per domain and configured
//! descriptor (never per value), answer latency, refusals, and limits-file reloads.

use prometheus::{Histogram, IntCounterVec, IntGaugeVec, Registry};

/// Metrics of `ShouldRateLimit` and of the limits file.
#[derive(Clone)]
pub struct RlsMetrics {
    /// Descriptor decisions, by domain (`unknown` when not configured), configured descriptor
    /// (its `name`, else its path; `none` when nothing matched) and code (`ok`, `over_limit`,
    /// `shadow_over_limit`, `quota_over_limit` (a quota out of room while another had some),
    /// `unlimited`, `without_redis_ok`, `without_redis_over_limit`).
    pub descriptors: IntCounterVec,
    /// Calls answered with a gRPC error, by kind (`unavailable`, `invalid`, `internal`).
    pub errors: IntCounterVec,
    /// Time to answer one call (Redis round trip included).
    pub duration: Histogram,
    /// Loads of the limits file, by result (`ok`, `invalid`): an invalid file keeps the
    /// previous limits.
    pub reloads: IntCounterVec,
    /// The limits in force, by domain and configured descriptor: units per window, and the
    /// window in seconds (replaced whole at every load; unlimited descriptors are absent).
    pub limit: IntGaugeVec,
    pub limit_window: IntGaugeVec,
    /// Settles of reserving limits (`reserve` in the limits file), by domain, configured
    /// descriptor and result (`settled`, `capped`: the true cost was cut at the reservation +
    /// `max_extra`, `already_settled`: a retried settle, nothing changed, `unreserved`: no live
    /// reservation, the true cost was charged as it is).
    pub settles: IntCounterVec,
    /// Envoy's rate limit quota service, on the same port.
    pub quota: super::RlqsMetrics,
}

impl RlsMetrics {
    pub(super) fn new(registry: &Registry) -> RlsMetrics {
        let m = RlsMetrics {
            quota: super::RlqsMetrics::new(registry),
            descriptors: super::counter_vec(
                registry,
                "tally_rls_descriptors_total",
                "Envoy rate limit descriptors decided, by domain, configured descriptor and code.",
                &["domain", "descriptor", "code"],
            ),
            errors: super::counter_vec(
                registry,
                "tally_rls_errors_total",
                "ShouldRateLimit calls answered with a gRPC error, by kind.",
                &["kind"],
            ),
            duration: super::histogram(
                registry,
                "tally_rls_duration_seconds",
                "Time to answer one ShouldRateLimit call.",
                prometheus::exponential_buckets(0.0001, 2.0, 16).expect("valid buckets"),
            ),
            reloads: super::counter_vec(
                registry,
                "tally_rls_limits_loads_total",
                "Loads of the Envoy limits file, by result (invalid: the previous limits stay).",
                &["result"],
            ),
            limit: super::gauge_vec(
                registry,
                "tally_rls_limit",
                "The limits file in force: units a window, by domain and configured descriptor.",
                &["domain", "descriptor"],
            ),
            limit_window: super::gauge_vec(
                registry,
                "tally_rls_limit_window_seconds",
                "The limits file in force: each limit's window in seconds, by domain and configured descriptor.",
                &["domain", "descriptor"],
            ),
            settles: super::counter_vec(
                registry,
                "tally_rls_settles_total",
                "Settles of reserving limits, by domain, configured descriptor and result.",
                &["domain", "descriptor", "result"],
            ),
        };
        for kind in ["unavailable", "invalid", "internal"] {
            m.errors.with_label_values(&[kind]);
        }
        for result in ["ok", "invalid"] {
            m.reloads.with_label_values(&[result]);
        }
        // The one label set every instance can have (a call for a domain the file does not
        // define), so the family is exported, and charted, before Envoy's first call.
        m.descriptors.with_label_values(&["unknown", "none", "ok"]);
        m
    }
}
