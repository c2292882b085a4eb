//! The decision without gRPC and without Redis: matching, overrides, addends, `replaces`, and
//! the answer built from a limiter's decision.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use tally_counters::request::{Decision, Phase, PolicyVerdict};

use super::*;
use crate::api::rls::error::RlsErrorKind;
use crate::config::limits::Unit;

const LIMITS: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ip
    value: 10.0.0.2
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 100, reserve: {default: 40}}
  - key: key_1
    descriptors:
      - key: user
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    descriptors:
      - key: user
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
";

fn limits() -> Limits {
    Limits::parse(LIMITS).unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend,
    }
}

/// Each descriptor as `(label, subject, addend)`; `none`, `unlimited:…`, `blocked:…` for the
/// others.
fn shape(m: &Matched) -> Vec<String> {
    m.resolved
        .iter()
        .map(|r| match r {
            Resolved::Nothing => "none".to_string(),
            Resolved::Unlimited(rule) => format!("unlimited:{}", rule.label),
            Resolved::Blocked(rule) => format!("blocked:{}", rule.label),
            Resolved::Limited(rule, subject, cost) => {
                format!("{}|{subject}|{cost}", rule.label)
            }
        })
        .collect()
}

#[test]
fn descriptors_match_their_limits_by_entries() {
    let limits = limits();
    let req = request(
        vec![
            descriptor(&[("user", "alice")]),
            descriptor(&[("ip", "10.0.0.1")]),
            descriptor(&[("ldap", "x")]),
            descriptor(&[("nothing", "here")]),
            descriptor(&[("user", "alice"), ("extra", "deeper than the tree")]),
        ],
        0,
    );
    let call = RlsCall::from_pb(&req).unwrap();
    let m = resolve(&limits, &call).unwrap();
    assert_eq!(
        shape(&m),
        [
            "d.user|d:user:alice|1",
            "blocked:d.ip_10.0.0.1",
            "unlimited:d.ldap",
            "none",
            "none"
        ]
    );
    // An enforced block list entry denies the call; only the limited descriptor is asked.
    assert!(m.blocked);
    assert_eq!(m.asks(&call).len(), 1);
    assert!(m.needs_redis());
}

#[test]
fn a_shadow_block_list_entry_does_not_block() {
    let limits = limits();
    let req = request(vec![descriptor(&[("ip", "10.0.0.2")])], 0);
    let m = resolve(&limits, &RlsCall::from_pb(&req).unwrap()).unwrap();
    assert!(!m.blocked);
    let ruling = rule(&m, None, 1_000);
    let d = &ruling.descriptors[0];
    assert_eq!((d.code, d.ok), (DescriptorCode::ShadowOverLimit, true));
    assert!(!ruling.over);
}

#[test]
fn addends_are_the_descriptors_own_else_at_least_one_of_the_requests() {
    let limits = limits();
    let mut own = descriptor(&[("user", "a")]);
    own.hits_addend = Some(UInt64Value { value: 0 });
    let mut seven = descriptor(&[("user", "b")]);
    seven.hits_addend = Some(UInt64Value { value: 7 });
    let plain = descriptor(&[("user", "c")]);
    for (request_addend, plain_cost) in [(0, 1), (1, 1), (3, 3)] {
        let req = request(
            vec![own.clone(), seven.clone(), plain.clone()],
            request_addend,
        );
        let call = RlsCall::from_pb(&req).unwrap();
        let m = resolve(&limits, &call).unwrap();
        let costs: Vec<u64> = m.asks(&call).iter().map(|a| a.cost).collect();
        assert_eq!(costs, [0, 7, plain_cost], "request addend {request_addend}");
    }
}

#[test]
fn a_reservation_without_an_addend_reserves_the_limits_default() {
    let limits = limits();
    let req = request(
        vec![
            descriptor(&[("tokens", "u"), ("reserve", "req-1")]),
            descriptor(&[("tokens", "u"), ("settle", "req-1")]),
        ],
        0,
    );
    let call = RlsCall::from_pb(&req).unwrap();
    let m = resolve(&limits, &call).unwrap();
    // The phase entry is not part of the subject: reserve and settle count on one counter.
    assert_eq!(
        shape(&m),
        ["d.tokens|d:tokens:u|40", "d.tokens|d:tokens:u|40"]
    );
    let asks = m.asks(&call);
    let phases: Vec<_> = asks
        .iter()
        .map(|a| a.reservation.map(|r| (r.phase, r.id)))
        .collect();
    assert_eq!(
        phases,
        [
            Some((Phase::Reserve, "req-1")),
            Some((Phase::Settle, "req-1"))
        ]
    );
}

#[test]
fn an_override_is_its_own_limit_and_bad_ones_are_refused() {
    let limits = limits();
    let mut d = descriptor(&[("user", "alice")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: Unit::Hour.code(),
    });
    let req = request(vec![d.clone()], 0);
    let call = RlsCall::from_pb(&req).unwrap();
    let m = resolve(&limits, &call).unwrap();
    assert_eq!(shape(&m), ["override|d:user:alice|1"]);
    assert_eq!(m.asks(&call)[0].policy.limit, 3);
    for (unit, requests, says) in [
        (99, 3, "limit override: unknown unit 99"),
        (Unit::Hour.code(), 0, "limit override: requests_per_unit 0"),
    ] {
        d.limit = Some(RateLimitOverride {
            requests_per_unit: requests,
            unit,
        });
        let req = request(vec![d.clone()], 0);
        let e = RlsCall::from_pb(&req).unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (RlsErrorKind::Invalid, says.into())
        );
    }
}

#[test]
fn a_call_without_domain_or_descriptors_is_refused() {
    let mut req = request(vec![], 0);
    assert!(matches!(
        RlsCall::from_pb(&req),
        Err(RlsError::NoDescriptors)
    ));
    req.domain.clear();
    req.descriptors.push(descriptor(&[("user", "a")]));
    assert!(matches!(RlsCall::from_pb(&req), Err(RlsError::NoDomain)));
}

#[test]
fn a_limit_another_replaces_is_dropped() {
    let limits = limits();
    let both = request(
        vec![
            descriptor(&[("key_1", "x"), ("user", "u")]),
            descriptor(&[("key_2", "y"), ("user", "u")]),
        ],
        0,
    );
    let m = resolve(&limits, &RlsCall::from_pb(&both).unwrap()).unwrap();
    assert_eq!(shape(&m), ["none", "d.key_2.user|d:key_2:y:user:u|1"]);
    let alone = request(vec![descriptor(&[("key_1", "x"), ("user", "u")])], 0);
    let m = resolve(&limits, &RlsCall::from_pb(&alone).unwrap()).unwrap();
    assert_eq!(shape(&m), ["specific_limit|d:key_1:x:user:u|1"]);
}

fn verdict(allowed: bool, remaining: u64, reset_ms: u64) -> PolicyVerdict {
    PolicyVerdict {
        policy: "p".into(),
        allowed,
        remaining,
        reset_ms,
        retry_after_ms: None,
        shadow: false,
        limit: 5,
        window_ms: 60_000,
    }
}

#[test]
fn the_answer_follows_the_limiters_decision() {
    let limits = limits();
    let req = request(
        vec![
            descriptor(&[("nothing", "x")]),
            descriptor(&[("user", "a")]),
            descriptor(&[("ldap", "x")]),
        ],
        0,
    );
    let m = resolve(&limits, &RlsCall::from_pb(&req).unwrap()).unwrap();
    let admitted = Decision {
        admitted: true,
        policies: vec![verdict(true, 4, 1_500)],
        without_redis: false,
        now_ms: 0,
    };
    let ruling = rule(&m, Some(admitted), 0);
    assert!(!ruling.over);
    let codes: Vec<_> = ruling.descriptors.iter().map(|d| d.code).collect();
    assert_eq!(
        codes,
        [
            DescriptorCode::Ok,
            DescriptorCode::Ok,
            DescriptorCode::Unlimited
        ]
    );
    let user = &ruling.descriptors[1];
    // The reset is rounded up to whole seconds; the limit is shown as configured.
    assert_eq!(
        (user.remaining, user.reset_s, user.shown_limit),
        (4, Some(2), Some(5))
    );
    assert_eq!(ruling.descriptors[2].remaining, u32::MAX);
    let (policy, state) = ruling.headers.clone().unwrap();
    assert!(policy.contains("\"d.user\""), "{policy}");
    assert!(state.is_some());

    let without_redis = Decision {
        admitted: false,
        policies: vec![verdict(false, 0, 0)],
        without_redis: true,
        now_ms: 0,
    };
    let ruling = rule(&m, Some(without_redis), 0);
    assert!(ruling.over);
    let user = &ruling.descriptors[1];
    assert_eq!(user.code, DescriptorCode::WithoutRedisOverLimit);
    assert_eq!(user.without_redis, Some(false));
    // Nothing was counted: no `RateLimit` field.
    assert_eq!(ruling.headers.unwrap().1, None);
}

#[test]
fn a_block_list_entry_resets_at_the_end_of_its_window() {
    let limits = limits();
    let req = request(vec![descriptor(&[("ip", "10.0.0.1")])], 0);
    let m = resolve(&limits, &RlsCall::from_pb(&req).unwrap()).unwrap();
    let ruling = rule(&m, None, 1_000);
    let d = &ruling.descriptors[0];
    assert!(ruling.over);
    assert_eq!(
        (d.code, d.ok, d.shown_limit, d.reset_s),
        (DescriptorCode::OverLimit, false, Some(0), Some(1))
    );
    assert_eq!(ruling.headers, None);
}
