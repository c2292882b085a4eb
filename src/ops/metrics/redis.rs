//! The Redis connection of the stream path: failed requests, retries, script reloads, and a
//! server whose eviction policy could lose counts.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use super::{counter, counter_vec, gauge};

super::labels::labels!(
    /// Why a Redis request failed (`tally_redis_errors_total{kind}`).
    RedisErrorKind {
        /// No answer within `redis.response_timeout` (or the connect timeout).
        Timeout => "timeout",
        /// The connection was refused.
        Connect => "connect",
        /// The connection broke.
        Io => "io",
        /// Redis answered with an error, or something unexpected.
        Response => "response",
        /// Redis' maxmemory-policy may evict keys.
        EvictionPolicy => "eviction_policy",
    }
);

/// How the stream path's talks with Redis went.
#[derive(Clone)]
pub struct RedisMetrics {
    /// Failed Redis round trips, by kind.
    pub redis_errors: IntCounterVec,
    /// Flush attempts repeated after a failure.
    pub redis_retries: IntCounter,
    /// Times the flush script was loaded again after NOSCRIPT.
    pub noscript_reloads: IntCounter,
    /// 1 while Redis' maxmemory-policy may evict keys.
    pub eviction_policy_unsafe: IntGauge,
}

impl RedisMetrics {
    pub(super) fn new(registry: &Registry) -> RedisMetrics {
        let m = RedisMetrics {
            redis_errors: counter_vec(
                registry,
                "tally_redis_errors_total",
                "Failed Redis requests, by kind.",
                &["kind"],
            ),
            redis_retries: counter(
                registry,
                "tally_redis_retries_total",
                "Flush attempts repeated after a Redis failure.",
            ),
            noscript_reloads: counter(
                registry,
                "tally_noscript_reloads_total",
                "Flush script reloads after NOSCRIPT.",
            ),
            eviction_policy_unsafe: gauge(
                registry,
                "tally_redis_eviction_unsafe",
                "1 while Redis' maxmemory-policy may evict keys (tally then refuses to write unless redis.allow_eviction).",
            ),
        };
        for k in RedisErrorKind::ALL {
            m.redis_errors.with_label_values(&[k.label()]);
        }
        m
    }

    /// Count a failed Redis request.
    pub fn redis_error(&self, kind: RedisErrorKind) {
        self.redis_errors.with_label_values(&[kind.label()]).inc();
    }
}
