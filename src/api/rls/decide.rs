//! One `ShouldRateLimit` call: every descriptor matched to its limit, then all of them decided
//! in one atomic limiter call (`tally_counters::request::decide`): a denial charges none.

use std::borrow::Cow;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tally_counters::request::{Ask, Client, Decision, PolicyVerdict, Reservation};
use tonic::Status;

use super::reserve;
use super::sizes::check_sizes;
pub use super::sizes::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE_BYTES};
use crate::config::limits::{Limits, Rule, Unit};
use crate::config::Spread;
use crate::ops::metrics::Metrics;

/// What a descriptor resolved to before Redis is asked.
#[allow(clippy::large_enum_variant)] // one per descriptor of a call, on the stack; boxing would allocate per override
enum Resolved<'a> {
    /// No configured limit (or replaced): OK, no `current_limit`.
    Nothing,
    /// `unlimited: true`: OK, `limit_remaining` 4294967295.
    Unlimited(&'a Rule),
    /// `requests_per_unit: 0`: over the limit, decided here.
    Blocked(&'a Rule),
    /// Asked of the limiter: the rule, the subject (domain and values) and the addend.
    Limited(Cow<'a, Rule>, String, u64),
}

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
    if let Err(status) = &result {
        let kind = match status.code() {
            tonic::Code::Unavailable => "unavailable",
            tonic::Code::InvalidArgument => "invalid",
            _ => "internal",
        };
        m.errors.with_label_values(&[kind]).inc();
    }
    result
}

async fn answer(
    limits: &Limits,
    client: &Client,
    metrics: &Metrics,
    spread: Spread,
    req: &RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    if req.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    check_sizes(req)?;
    let (resolved, reservations) = resolve(limits, req)?;
    let asks: Vec<Ask> = resolved
        .iter()
        .zip(&reservations)
        .zip(&req.descriptors)
        .filter_map(|((r, reservation), d)| match r {
            Resolved::Limited(rule, subject, cost) => Some(Ask {
                policy: &rule.policy,
                subject,
                cost: *cost,
                usage: rule.usage,
                quota: rule.quota,
                reservation: *reservation,
                // Envoy's `is_negative_hits`: the addend is given back.
                refund: d.is_negative_hits,
            }),
            _ => None,
        })
        .collect();
    // A block list entry denies the request: the others are read, not charged. (A quota is
    // never a block list entry: the loader refuses `quota_mode` with 0.)
    let blocked = resolved
        .iter()
        .any(|r| matches!(r, Resolved::Blocked(rule) if !rule.policy.shadow));
    let decision = if asks.is_empty() {
        None
    } else {
        let (d, settled) = super::spread::decide(client, &asks, &req.domain, blocked, spread)
            .await
            .map_err(|e| match e {
                tally_counters::request::RequestError::Invalid(m) => Status::invalid_argument(m),
                e @ tally_counters::request::RequestError::NotReplicated { .. } => {
                    Status::unavailable(e.to_string())
                }
                e @ tally_counters::request::RequestError::InvalidField { .. } => {
                    Status::invalid_argument(e.to_string())
                }
                other => Status::internal(other.to_string()),
            })?;
        count_settles(limits, metrics, &req.domain, &resolved, &settled);
        Some(d)
    };
    if let Some(d) = &decision {
        if d.without_redis && resolved.iter().any(redis_must_answer) {
            return Err(Status::unavailable("redis is unavailable"));
        }
    }
    let mut response = respond(limits, metrics, &req.domain, &resolved, decision, blocked);
    if limits.returns_metadata(&req.domain) {
        response.dynamic_metadata = Some(dynamic_metadata(req, &resolved, &response.statuses));
    }
    Ok(response)
}

/// envoyproxy/ratelimit's dynamic metadata ([`super::metadata`]): the configured metadata of
/// every descriptor whose status is OK, in order.
fn dynamic_metadata(
    req: &RateLimitRequest,
    resolved: &[Resolved],
    statuses: &[DescriptorStatus],
) -> envoy_types::pb::google::protobuf::Struct {
    let passed = resolved.iter().zip(statuses).filter_map(|(r, s)| {
        let rule = match r {
            Resolved::Blocked(rule) => *rule,
            Resolved::Limited(rule, _, _) => rule.as_ref(),
            _ => return None,
        };
        (s.code == Code::Ok as i32).then_some(rule.metadata.as_deref()?)
    });
    super::metadata::build(req, passed)
}

/// Without Redis, a limit with no `on_redis_error` has no answer (Envoy's `failure_mode_deny`
/// decides).
fn redis_must_answer(r: &Resolved) -> bool {
    matches!(r, Resolved::Limited(rule, _, _) if !rule.answers_without_redis)
}

/// Count each settle by what it did (`reserve::count`).
fn count_settles(
    limits: &Limits,
    metrics: &Metrics,
    domain: &str,
    resolved: &[Resolved],
    settled: &[Option<tally_counters::request::Settled>],
) {
    let domain = if limits.has_domain(domain) {
        domain
    } else {
        "unknown"
    };
    let limited = resolved.iter().filter_map(|r| match r {
        Resolved::Limited(rule, _, cost) => Some((rule, *cost)),
        _ => None,
    });
    for ((rule, cost), s) in limited.zip(settled) {
        if let Some(s) = s {
            reserve::count(metrics, domain, rule, cost, *s);
        }
    }
}

/// Each descriptor's limit, after `replaces` (one vector: a descriptor's entry becomes
/// [`Resolved::Nothing`] once every limit is known and one of them replaces it), and beside it
/// each descriptor's reservation (a limit with `reserve`: see `reserve.rs`).
#[allow(clippy::type_complexity)]
fn resolve<'a>(
    limits: &'a Limits,
    req: &'a RateLimitRequest,
) -> Result<(Vec<Resolved<'a>>, Vec<Option<Reservation<'a>>>), Status> {
    let mut out = Vec::with_capacity(req.descriptors.len());
    let mut reservations = Vec::with_capacity(req.descriptors.len());
    for d in &req.descriptors {
        let mut phase = None;
        let (rule, shared) = match &d.limit {
            Some(o) => (Some(Cow::Owned(overridden(o)?)), Default::default()),
            None => match limits.lookup(
                &req.domain,
                d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
            ) {
                Some(found) => (Some(Cow::Borrowed(found.rule)), found.shared),
                None => match reserve::lookup(limits, &req.domain, d) {
                    Some((found, p)) => {
                        phase = Some(p);
                        (Some(Cow::Borrowed(found.rule)), found.shared)
                    }
                    None => (None, Default::default()),
                },
            },
        };
        reservations.push(match &rule {
            Some(Cow::Borrowed(r)) => reserve::reservation(r, d, phase),
            _ => None,
        });
        out.push(match rule {
            None => Resolved::Nothing,
            Some(Cow::Borrowed(r)) if r.unlimited => Resolved::Unlimited(r),
            Some(Cow::Borrowed(r)) if r.blocked => Resolved::Blocked(r),
            Some(r) => {
                let entries = reserve::subject_entries(d, phase);
                let cost = reserve::cost(&r, req, d, addend(req, d));
                Resolved::Limited(r, subject(&req.domain, entries, &shared), cost)
            }
        });
    }
    // Only configured limits replace others (an override has no `replaces`).
    let replaced: Vec<&'a str> = out
        .iter()
        .filter_map(|r| match r {
            Resolved::Unlimited(r) | Resolved::Blocked(r) => Some(*r),
            Resolved::Limited(Cow::Borrowed(r), _, _) => Some(*r),
            _ => None,
        })
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    if !replaced.is_empty() {
        for r in &mut out {
            let name = match r {
                Resolved::Unlimited(rule) | Resolved::Blocked(rule) => rule.name.as_deref(),
                Resolved::Limited(rule, _, _) => rule.name.as_deref(),
                Resolved::Nothing => None,
            };
            if name.is_some_and(|n| replaced.contains(&n)) {
                *r = Resolved::Nothing;
            }
        }
    }
    Ok((out, reservations))
}

/// The rule of a descriptor's own `limit` (Envoy's override).
fn overridden(o: &RateLimitOverride) -> Result<Rule, Status> {
    let unit = Unit::from_code(o.unit).ok_or_else(|| {
        Status::invalid_argument(format!("limit override: unknown unit {}", o.unit))
    })?;
    if o.requests_per_unit == 0 {
        return Err(Status::invalid_argument(
            "limit override: requests_per_unit 0",
        ));
    }
    Rule::overridden(o.requests_per_unit, unit).map_err(Status::invalid_argument)
}

/// The descriptor's addend: its own when set (0 = check only), else max(1, the request's), as
/// envoyproxy/ratelimit's `GetHitsAddends`.
fn addend(req: &RateLimitRequest, d: &RateLimitDescriptor) -> u64 {
    match &d.hits_addend {
        Some(v) => v.value,
        None => u64::from(req.hits_addend.max(1)),
    }
}

/// Whose counter: the domain and every entry (key and value), escaped so that two descriptors
/// never share one; an entry a shared wildcard matched (`shared`, by index) counts under the
/// wildcard's pattern, so all its values share the count.
fn subject(domain: &str, entries: &[Entry], shared: &[(usize, &str)]) -> String {
    let mut buf = Vec::with_capacity(64);
    tally_counters::key::escape_into(&mut buf, domain);
    for (i, e) in entries.iter().enumerate() {
        buf.push(b':');
        tally_counters::key::escape_into(&mut buf, &e.key);
        buf.push(b':');
        let value = shared
            .iter()
            .find(|(j, _)| *j == i)
            .map_or(e.value.as_str(), |(_, pattern)| pattern);
        tally_counters::key::escape_into(&mut buf, value);
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// The response: one status per descriptor, the overall code, the IETF headers.
fn respond(
    limits: &Limits,
    metrics: &Metrics,
    domain: &str,
    resolved: &[Resolved],
    decision: Option<Decision>,
    blocked: bool,
) -> RateLimitResponse {
    let domain_label = if limits.has_domain(domain) {
        domain
    } else {
        "unknown"
    };
    let count = |descriptor: &str, code: &str| {
        metrics
            .rls
            .descriptors
            .with_label_values(&[domain_label, descriptor, code])
            .inc();
    };
    let without_redis = decision.as_ref().is_some_and(|d| d.without_redis);
    // The limiter decided the whole set (quotas deny only all together).
    let over = blocked || decision.as_ref().is_some_and(|d| !d.admitted);
    let mut verdicts = decision.map(|d| d.policies).unwrap_or_default().into_iter();
    let mut shown: Vec<PolicyVerdict> = Vec::new();
    let mut statuses = Vec::with_capacity(resolved.len());
    for r in resolved {
        let status = match r {
            Resolved::Nothing => {
                count("none", "ok");
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                }
            }
            Resolved::Unlimited(rule) => {
                count(&rule.label, "unlimited");
                DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                }
            }
            Resolved::Blocked(rule) => {
                let shadow = rule.policy.shadow;
                count(
                    &rule.label,
                    if shadow {
                        "shadow_over_limit"
                    } else {
                        "over_limit"
                    },
                );
                let window = rule.policy.window.as_secs().max(1);
                let now = now_secs();
                DescriptorStatus {
                    code: if shadow { Code::Ok } else { Code::OverLimit } as i32,
                    current_limit: Some(current_limit(rule, 0)),
                    limit_remaining: 0,
                    duration_until_reset: Some(seconds((window - now % window) as i64)),
                    ..Default::default()
                }
            }
            Resolved::Limited(rule, _, _) => {
                let Some(mut v) = verdicts.next() else {
                    debug_assert!(false, "one verdict per asked descriptor");
                    continue;
                };
                let code = match (v.allowed, v.shadow, without_redis) {
                    (true, _, false) => "ok",
                    (false, true, _) => "shadow_over_limit",
                    // Out of room, but another quota of the request had some.
                    (false, false, false) if rule.quota && !over => "quota_over_limit",
                    (false, false, false) => "over_limit",
                    (true, _, true) => "without_redis_ok",
                    (false, _, true) => "without_redis_over_limit",
                };
                count(&rule.label, code);
                if without_redis {
                    let decided = if v.allowed { "allowed" } else { "denied" };
                    metrics
                        .request
                        .without_redis
                        .with_label_values(&[&rule.label, decided])
                        .inc();
                }
                let status = DescriptorStatus {
                    code: if v.allowed || v.shadow {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    } as i32,
                    current_limit: Some(current_limit(rule, rule.policy.limit)),
                    limit_remaining: u32::try_from(v.remaining).unwrap_or(u32::MAX),
                    // Envoy truncates the reset to whole seconds: round up, so a client that
                    // waits that long finds the new window.
                    duration_until_reset: Some(seconds(v.reset_ms.div_ceil(1000) as i64)),
                    ..Default::default()
                };
                v.policy = rule.label.clone();
                shown.push(v);
                status
            }
        };
        statuses.push(status);
    }
    let mut headers = Vec::new();
    if !shown.is_empty() {
        let (policy, state) = Decision {
            admitted: !over,
            policies: shown,
            without_redis,
            now_ms: 0,
        }
        .headers();
        headers.push(header("RateLimit-Policy", policy));
        // Without Redis nothing was counted: no remaining to tell (r=0;t=0 would be a lie).
        if !without_redis {
            headers.push(header("RateLimit", state));
        }
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
        ..Default::default()
    }
}

fn current_limit(rule: &Rule, requests_per_unit: u64) -> RateLimit {
    RateLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: u32::try_from(requests_per_unit).unwrap_or(u32::MAX),
        unit: rule.unit.code(),
    }
}

fn seconds(s: i64) -> PbDuration {
    PbDuration {
        seconds: s,
        nanos: 0,
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}

/// Unix seconds on this host (a block list entry's reset; nothing is counted by it).
use tally_counters::clock::unix_secs as now_secs;
