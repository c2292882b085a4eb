//! One `ShouldRateLimit` call, in three steps: parse the request ([`super::call`]), decide
//! ([`super::decide`]: the limits matched, one atomic limiter call, the answer), render
//! ([`super::render`]); with the call's metrics around them.

use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tally_counters::clock::unix_secs;
use tally_counters::request::{Client, Settled};
use tonic::Status;

use super::call::RlsCall;
use super::decide::{self, Matched, Ruling};
use super::error::RlsError;
use super::{render, reserve};
use crate::config::limits::Limits;
use crate::config::Spread;
use crate::ops::metrics::Metrics;

/// Decide one request against `limits`.
pub async fn should_rate_limit(
    limits: &Limits,
    client: &Client,
    metrics: &Metrics,
    spread: Spread,
    req: &RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let started = Instant::now();
    let result = answer(limits, client, metrics, spread, req).await;
    let m = &metrics.rls;
    m.duration.observe(started.elapsed().as_secs_f64());
    result.map_err(|e| {
        m.errors.with_label_values(&[e.kind().label()]).inc();
        render::status(&e)
    })
}

async fn answer(
    limits: &Limits,
    client: &Client,
    metrics: &Metrics,
    spread: Spread,
    req: &RateLimitRequest,
) -> Result<RateLimitResponse, RlsError> {
    let call = RlsCall::from_pb(req)?;
    let matched = decide::resolve(limits, &call)?;
    let asks = matched.asks(&call);
    let decision = if asks.is_empty() {
        None
    } else {
        let (d, settled) =
            super::spread::decide(client, &asks, call.domain, matched.blocked, spread).await?;
        count_settles(limits, metrics, call.domain, &matched, &settled);
        Some(d)
    };
    if decision.as_ref().is_some_and(|d| d.without_redis) && matched.needs_redis() {
        return Err(RlsError::RedisUnavailable);
    }
    let ruling = decide::rule(&matched, decision, unix_secs());
    count(limits, metrics, call.domain, &ruling);
    Ok(render::response(
        req,
        ruling,
        limits.returns_metadata(call.domain),
    ))
}

/// The domain's metric label: the domain when configured, else `unknown` (what a client sends
/// cannot grow `/metrics`).
fn domain_label<'a>(limits: &Limits, domain: &'a str) -> &'a str {
    if limits.has_domain(domain) {
        domain
    } else {
        "unknown"
    }
}

/// Count each settle by what it did (`reserve::count`).
fn count_settles(
    limits: &Limits,
    metrics: &Metrics,
    domain: &str,
    matched: &Matched,
    settled: &[Option<Settled>],
) {
    let domain = domain_label(limits, domain);
    for ((rule, cost), s) in matched.limited().zip(settled) {
        if let Some(s) = s {
            reserve::count(metrics, domain, rule, cost, *s);
        }
    }
}

/// Count each descriptor's status, and each decision taken without Redis.
fn count(limits: &Limits, metrics: &Metrics, domain: &str, ruling: &Ruling) {
    let domain = domain_label(limits, domain);
    for d in &ruling.descriptors {
        let label = d.rule.map_or("none", |r| r.label.as_str());
        metrics
            .rls
            .descriptors
            .with_label_values(&[domain, label, d.code.label()])
            .inc();
        if let Some(allowed) = d.without_redis {
            let decided = if allowed { "allowed" } else { "denied" };
            metrics
                .request
                .without_redis
                .with_label_values(&[label, decided])
                .inc();
        }
    }
}
