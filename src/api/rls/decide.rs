//! Decide: the pure middle of a `ShouldRateLimit` call, on domain types only (no protobuf, no
//! gRPC status, no I/O).
//!
//! * [`resolve`]: every descriptor of a [`RlsCall`] matched to its limit (the limits file's tree,
//!   a reserving limit's phase entry, or the descriptor's own override), `replaces` applied,
//!   each limit's subject and addend: a [`Matched`], whose [`Matched::asks`] go to the limiter
//!   in one atomic call (`super::spread`): a denial charges none;
//! * [`rule`]: the limiter's [`Decision`] (none when nothing was asked) turned into one
//!   [`DescriptorRuling`] per descriptor and the overall answer ([`Ruling`]), which
//!   `super::render` writes as Envoy's response.

use std::borrow::Cow;

use smallvec::SmallVec;
use tally_counters::request::{Ask, Decision, PolicyVerdict, Reservation};

use super::call::{Descriptor, RlsCall};
use super::error::RlsError;
use super::reserve;
use crate::config::limits::{Limits, Rule};

/// What a descriptor resolved to before Redis is asked.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per descriptor of a call, on the stack; boxing would allocate per override
pub enum Resolved<'a> {
    /// No configured limit (or replaced): OK, no `current_limit`.
    Nothing,
    /// `unlimited: true`: OK, `limit_remaining` 4294967295.
    Unlimited(&'a Rule),
    /// `requests_per_unit: 0`: over the limit, decided here.
    Blocked(&'a Rule),
    /// Asked of the limiter: the rule, the subject (domain and values) and the addend.
    Limited(Cow<'a, Rule>, String, u64),
}

/// A call's descriptors, each resolved, ready for the limiter.
#[derive(Debug)]
pub struct Matched<'a> {
    /// One per descriptor, in order.
    pub resolved: Vec<Resolved<'a>>,
    /// Beside each, its reservation (a limit with `reserve`: see `reserve.rs`).
    reservations: Vec<Option<Reservation<'a>>>,
    /// An enforced block list entry matched: the request is denied, the others only read.
    pub blocked: bool,
}

/// Each descriptor of `call` resolved against `limits`, after `replaces` (a descriptor's entry
/// becomes [`Resolved::Nothing`] once every limit is known and one of them replaces it).
pub fn resolve<'a>(limits: &'a Limits, call: &RlsCall<'a>) -> Result<Matched<'a>, RlsError> {
    let n = call.descriptors.len();
    let mut resolved = Vec::with_capacity(n);
    let mut reservations = Vec::with_capacity(n);
    for d in &call.descriptors {
        let (r, reservation) = resolve_one(limits, call, d)?;
        resolved.push(r);
        reservations.push(reservation);
    }
    drop_replaced(&mut resolved);
    // A block list entry denies the request: the others are read, not charged. (A quota is
    // never a block list entry: the loader refuses `quota_mode` with 0.)
    let blocked = resolved
        .iter()
        .any(|r| matches!(r, Resolved::Blocked(rule) if !rule.policy.shadow));
    Ok(Matched {
        resolved,
        reservations,
        blocked,
    })
}

/// One descriptor's limit (its override, the tree's, or a reserving limit's by its phase
/// entry) and its reservation.
fn resolve_one<'a>(
    limits: &'a Limits,
    call: &RlsCall<'a>,
    d: &Descriptor<'a>,
) -> Result<(Resolved<'a>, Option<Reservation<'a>>), RlsError> {
    let mut phase = None;
    let (rule, shared) = match &d.limit {
        Some(o) => {
            let rule = Rule::overridden(o.requests_per_unit, o.unit)
                .map_err(|reason| RlsError::Override { reason })?;
            (Some(Cow::Owned(rule)), Default::default())
        }
        None => match limits.lookup(call.domain, d.entries()) {
            Some(found) => (Some(Cow::Borrowed(found.rule)), found.shared),
            None => match reserve::lookup(limits, call.domain, d) {
                Some((found, p)) => {
                    phase = Some(p);
                    (Some(Cow::Borrowed(found.rule)), found.shared)
                }
                None => (None, Default::default()),
            },
        },
    };
    let reservation = match &rule {
        Some(Cow::Borrowed(r)) => reserve::reservation(r, d, phase),
        _ => None,
    };
    let resolved = match rule {
        None => Resolved::Nothing,
        Some(Cow::Borrowed(r)) if r.unlimited => Resolved::Unlimited(r),
        Some(Cow::Borrowed(r)) if r.blocked => Resolved::Blocked(r),
        Some(r) => {
            let entries = d.entries().take(reserve::subject_entries(d, phase));
            let cost = reserve::cost(&r, call.hits_addend, d, call.addend(d));
            Resolved::Limited(r, subject(call.domain, entries, &shared), cost)
        }
    };
    Ok((resolved, reservation))
}

/// Every limit another configured one `replaces` becomes [`Resolved::Nothing`] (only
/// configured limits replace others: an override has no `replaces`).
fn drop_replaced<'a>(resolved: &mut [Resolved<'a>]) {
    let replaced: Vec<&'a str> = resolved
        .iter()
        .filter_map(|r| match r {
            Resolved::Unlimited(r) | Resolved::Blocked(r) => Some(*r),
            Resolved::Limited(Cow::Borrowed(r), _, _) => Some(*r),
            _ => None,
        })
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    if replaced.is_empty() {
        return;
    }
    for r in resolved {
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

/// Whose counter: the domain and every entry (key and value), escaped so that two descriptors
/// never share one; an entry a shared wildcard matched (`shared`, by index) counts under the
/// wildcard's pattern, so all its values share the count.
fn subject<'e>(
    domain: &str,
    entries: impl Iterator<Item = (&'e str, &'e str)>,
    shared: &[(usize, &str)],
) -> String {
    let mut buf = Vec::with_capacity(64);
    tally_counters::key::escape_into(&mut buf, domain);
    for (i, (key, value)) in entries.enumerate() {
        buf.push(b':');
        tally_counters::key::escape_into(&mut buf, key);
        buf.push(b':');
        let value = shared
            .iter()
            .find(|(j, _)| *j == i)
            .map_or(value, |(_, pattern)| pattern);
        tally_counters::key::escape_into(&mut buf, value);
    }
    String::from_utf8(buf).unwrap_or_default()
}

impl<'a> Matched<'a> {
    /// The limiter's asks: one per [`Resolved::Limited`] of `call` (the call resolved), in
    /// descriptor order.
    pub fn asks(&self, call: &RlsCall) -> Vec<Ask<'_>> {
        self.resolved
            .iter()
            .zip(&self.reservations)
            .zip(&call.descriptors)
            .filter_map(|((r, reservation), d)| match r {
                Resolved::Limited(rule, subject, cost) => Some(Ask {
                    policy: &rule.policy,
                    subject,
                    cost: *cost,
                    usage: rule.usage,
                    quota: rule.quota,
                    reservation: *reservation,
                    // Envoy's `is_negative_hits`: the addend is given back.
                    refund: d.refund,
                }),
                _ => None,
            })
            .collect()
    }

    /// Without Redis, a limit with no `on_redis_error` has no answer (Envoy's
    /// `failure_mode_deny` decides).
    pub fn needs_redis(&self) -> bool {
        self.resolved
            .iter()
            .any(|r| matches!(r, Resolved::Limited(rule, _, _) if !rule.answers_without_redis))
    }

    /// The limited descriptors' rules and addends, in the order of their asks.
    pub fn limited(&self) -> impl Iterator<Item = (&Rule, u64)> {
        self.resolved.iter().filter_map(|r| match r {
            Resolved::Limited(rule, _, cost) => Some((rule.as_ref(), *cost)),
            _ => None,
        })
    }
}

/// What a descriptor's status says (`tally_rls_descriptors_total{code}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorCode {
    /// Within its limit, or no limit.
    Ok,
    /// `unlimited: true`.
    Unlimited,
    /// Over its limit (or a block list entry).
    OverLimit,
    /// Over a shadow limit: answered OK.
    ShadowOverLimit,
    /// A quota out of room while another quota of the request had some: OK.
    QuotaOverLimit,
    /// Within its limit, decided without Redis (`on_redis_error`).
    WithoutRedisOk,
    /// Over its limit, decided without Redis (`on_redis_error`).
    WithoutRedisOverLimit,
}

impl DescriptorCode {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            DescriptorCode::Ok => "ok",
            DescriptorCode::Unlimited => "unlimited",
            DescriptorCode::OverLimit => "over_limit",
            DescriptorCode::ShadowOverLimit => "shadow_over_limit",
            DescriptorCode::QuotaOverLimit => "quota_over_limit",
            DescriptorCode::WithoutRedisOk => "without_redis_ok",
            DescriptorCode::WithoutRedisOverLimit => "without_redis_over_limit",
        }
    }
}

/// One descriptor's answer.
#[derive(Debug, Clone)]
pub struct DescriptorRuling<'r> {
    /// Its limit (`None`: no limit, or replaced).
    pub rule: Option<&'r Rule>,
    /// What its status says.
    pub code: DescriptorCode,
    /// Its status is OK (Envoy's `OK`), else `OVER_LIMIT`.
    pub ok: bool,
    /// The `current_limit` shown: the requests per unit (0 for a block list entry).
    pub shown_limit: Option<u64>,
    /// `limit_remaining`.
    pub remaining: u32,
    /// `duration_until_reset`, whole seconds.
    pub reset_s: Option<u64>,
    /// Decided without Redis: whether its policy allowed (`tally_request_without_redis_total`).
    pub without_redis: Option<bool>,
}

/// The answer to a call.
#[derive(Debug, Clone)]
pub struct Ruling<'r> {
    /// The request is over the limit.
    pub over: bool,
    /// One per descriptor, in order (inline up to four).
    pub descriptors: SmallVec<[DescriptorRuling<'r>; 4]>,
    /// The `RateLimit-Policy` field, when a limit was asked; and the `RateLimit` field, when
    /// Redis counted (without Redis nothing was counted: `r=0;t=0` would be a lie).
    pub headers: Option<(String, Option<String>)>,
}

impl Ruling<'_> {
    /// The configured metadata of every descriptor whose status is OK and that has a limit the
    /// limiter or the block list decided, in order (envoyproxy/ratelimit's dynamic metadata).
    pub fn passed_metadata(
        &self,
    ) -> impl Iterator<Item = &serde_json::Map<String, serde_json::Value>> {
        self.descriptors
            .iter()
            .filter(|d| d.ok && d.code != DescriptorCode::Unlimited)
            .filter_map(|d| d.rule?.metadata.as_deref())
    }
}

/// The answer to `matched` from the limiter's `decision` (none when nothing was asked), at
/// `now_s` (Unix seconds on this host: a block list entry's reset; nothing is counted by it).
pub fn rule<'r>(matched: &'r Matched, decision: Option<Decision>, now_s: u64) -> Ruling<'r> {
    let without_redis = decision.as_ref().is_some_and(|d| d.without_redis);
    // The limiter decided the whole set (quotas deny only all together).
    let over = matched.blocked || decision.as_ref().is_some_and(|d| !d.admitted);
    let mut verdicts = decision.map(|d| d.policies).unwrap_or_default().into_iter();
    let mut shown: Vec<PolicyVerdict> = Vec::new();
    let mut descriptors = SmallVec::with_capacity(matched.resolved.len());
    for r in &matched.resolved {
        let ruling = match r {
            Resolved::Nothing => DescriptorRuling::open(None, DescriptorCode::Ok, 0),
            Resolved::Unlimited(rule) => {
                DescriptorRuling::open(Some(rule), DescriptorCode::Unlimited, u32::MAX)
            }
            Resolved::Blocked(rule) => blocked(rule, now_s),
            Resolved::Limited(rule, _, _) => {
                let Some(mut v) = verdicts.next() else {
                    debug_assert!(false, "one verdict per asked descriptor");
                    continue;
                };
                let ruling = limited(rule, &v, over, without_redis);
                v.policy = rule.label.clone();
                shown.push(v);
                ruling
            }
        };
        descriptors.push(ruling);
    }
    let headers = (!shown.is_empty()).then(|| {
        let (policy, state) = Decision {
            admitted: !over,
            policies: shown,
            without_redis,
            now_ms: 0,
        }
        .headers();
        (policy, (!without_redis).then_some(state))
    });
    Ruling {
        over,
        descriptors,
        headers,
    }
}

impl<'r> DescriptorRuling<'r> {
    /// OK, with no `current_limit`.
    fn open(rule: Option<&'r Rule>, code: DescriptorCode, remaining: u32) -> Self {
        DescriptorRuling {
            rule,
            code,
            ok: true,
            shown_limit: None,
            remaining,
            reset_s: None,
            without_redis: None,
        }
    }
}

/// A block list entry: over the limit (OK in shadow mode), reset at the end of its window.
fn blocked(rule: &Rule, now_s: u64) -> DescriptorRuling<'_> {
    let shadow = rule.policy.shadow;
    let window = rule.policy.window.as_secs().max(1);
    DescriptorRuling {
        rule: Some(rule),
        code: if shadow {
            DescriptorCode::ShadowOverLimit
        } else {
            DescriptorCode::OverLimit
        },
        ok: shadow,
        shown_limit: Some(0),
        remaining: 0,
        reset_s: Some(window - now_s % window),
        without_redis: None,
    }
}

/// A limit the limiter decided (`v`), in a request that is `over` or not.
fn limited<'r>(
    rule: &'r Rule,
    v: &PolicyVerdict,
    over: bool,
    without_redis: bool,
) -> DescriptorRuling<'r> {
    let code = match (v.allowed, v.shadow, without_redis) {
        (true, _, false) => DescriptorCode::Ok,
        (false, true, _) => DescriptorCode::ShadowOverLimit,
        // Out of room, but another quota of the request had some.
        (false, false, false) if rule.quota && !over => DescriptorCode::QuotaOverLimit,
        (false, false, false) => DescriptorCode::OverLimit,
        (true, _, true) => DescriptorCode::WithoutRedisOk,
        (false, _, true) => DescriptorCode::WithoutRedisOverLimit,
    };
    DescriptorRuling {
        rule: Some(rule),
        code,
        ok: v.allowed || v.shadow,
        shown_limit: Some(rule.policy.limit),
        remaining: u32::try_from(v.remaining).unwrap_or(u32::MAX),
        // Envoy truncates the reset to whole seconds: round up, so a client that waits that
        // long finds the new window.
        reset_s: Some(v.reset_ms.div_ceil(1000)),
        without_redis: without_redis.then_some(v.allowed),
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
