//! Request-path metrics: decisions by primitive, name and outcome, latency, Redis errors, and
//! every decision taken without Redis.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

super::labels::labels!(
    /// A request-path primitive (`tally_request_*{primitive}`).
    Primitive {
        /// `POST /v1/hit`.
        Hit => "hit",
        /// `POST /v1/limit`.
        Limit => "limit",
        /// `POST /v1/quota`.
        Quota => "quota",
        /// `POST /v1/once`.
        Once => "once",
        /// `POST /v1/unique`.
        Unique => "unique",
        /// `POST /v1/pool`.
        Pool => "pool",
    }
);

super::labels::labels!(
    /// What a request-path call decided (`tally_request_decisions_total{outcome}`).
    Outcome {
        /// Admitted, counted, first, given.
        Allowed => "allowed",
        /// Denied by a limit, sold out, not first, pool empty.
        Denied => "denied",
        /// Admitted although a shadow policy denied it.
        ShadowDenied => "shadow_denied",
        /// A retried hit (idempotency key seen) or a user served before.
        Duplicate => "duplicate",
        /// Read without changing anything.
        Peek => "peek",
        /// State cleared.
        Reset => "reset",
        /// No answer: Redis failed or the input was refused.
        Error => "error",
    }
);

/// Metrics of `/v1/hit`, `/v1/limit`, `/v1/quota`, `/v1/once`, `/v1/unique`, `/v1/pool`.
#[derive(Clone)]
pub struct RequestMetrics {
    /// Decisions, by primitive, configured name and outcome.
    pub decisions: IntCounterVec,
    /// Time to answer one call (Redis round trip included), by primitive.
    pub duration: HistogramVec,
    /// Calls Redis did not answer, by primitive.
    pub redis_errors: IntCounterVec,
    /// Rate-limit decisions taken without Redis (by each policy's `on_redis_error`), by policy
    /// and decision (`allowed`/`denied`).
    pub without_redis: IntCounterVec,
    /// Admitted rate-limit decisions that left less than 10% of the limit, by policy.
    pub near_limit: IntCounterVec,
    /// Hits written to Kafka because Redis was unreachable (counted by the stream path later).
    pub deferred: prometheus::IntCounter,
    /// Loads of a port's TLS certificate files, by port (`http`, `rls`) and result (`ok`,
    /// `error`: the certificate in force stays).
    pub tls_reloads: IntCounterVec,
    /// TLS handshakes that failed or did not finish in time, by port and reason (`handshake`:
    /// refused by either side, no or a wrong client certificate included; `timeout`).
    pub tls_handshake_failures: IntCounterVec,
    /// HTTP answers, by route (the template, e.g. `/v1/counters/{name}`), method and status code:
    /// queries, locks and the request path alike.
    pub http_answers: IntCounterVec,
    /// Time to answer one HTTP request, by route.
    pub http_duration: HistogramVec,
    /// The ports' connections: held, refused, closed to make room.
    pub connections: super::ConnectionMetrics,
}

impl RequestMetrics {
    pub(super) fn new(registry: &Registry) -> RequestMetrics {
        let vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric");
            super::register(registry, c, "counter")
        };
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "tally_request_duration_seconds",
                "Time to answer one request-path call, by primitive.",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 16).expect("valid buckets")),
            &["primitive"],
        )
        .expect("static metric");
        let duration = super::register(registry, duration, "histogram");
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                "tally_http_request_duration_seconds",
                "Time to answer one HTTP request, by route (its template).",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 18).expect("valid buckets")),
            &["route"],
        )
        .expect("static metric");
        let http_duration = super::register(registry, http_duration, "histogram");
        let deferred = prometheus::IntCounter::new(
            "tally_hits_deferred_total",
            "Hits written to the topic because Redis was unreachable; the stream path counts them.",
        )
        .expect("static metric");
        let deferred = super::register(registry, deferred, "counter");
        let m = RequestMetrics {
            connections: super::ConnectionMetrics::new(registry),
            deferred,
            http_duration,
            http_answers: vec(
                "tally_http_answers_total",
                "HTTP answers, by route (its template), method and status code.",
                &["route", "method", "code"],
            ),
            decisions: vec(
                "tally_request_decisions_total",
                "Request-path decisions, by primitive, name and outcome.",
                &["primitive", "name", "outcome"],
            ),
            duration,
            redis_errors: vec(
                "tally_request_redis_errors_total",
                "Request-path calls Redis did not answer, by primitive.",
                &["primitive"],
            ),
            without_redis: vec(
                "tally_limit_decisions_without_redis_total",
                "Rate-limit decisions taken without Redis, by policy and decision.",
                &["policy", "decision"],
            ),
            near_limit: vec(
                "tally_limit_near_total",
                "Admitted requests that left less than 10% of a policy's limit.",
                &["policy"],
            ),
            tls_reloads: vec(
                "tally_tls_reloads_total",
                "Loads of a port's TLS certificate files, by port and result (error: the certificate in force stays).",
                &["port", "result"],
            ),
            tls_handshake_failures: vec(
                "tally_tls_handshake_failures_total",
                "TLS handshakes on a port that failed or did not finish in time, by port and reason.",
                &["port", "reason"],
            ),
        };
        for p in Primitive::ALL {
            m.duration.with_label_values(&[p.label()]);
            m.redis_errors.with_label_values(&[p.label()]);
        }
        m
    }

    /// Count one decision.
    pub fn decided(&self, primitive: Primitive, name: &str, outcome: Outcome) {
        self.decisions
            .with_label_values(&[primitive.label(), name, outcome.label()])
            .inc();
    }
}
