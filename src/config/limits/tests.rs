//! The limits file and the lookup, on envoyproxy/ratelimit's README examples (its "Examples"
//! section, quoted) and on the files it refuses.

use std::time::Duration;

use super::*;

/// An example of envoyproxy/ratelimit's README, as quoted in `tests/data/envoy-ratelimit-examples`
/// (shared with the integration test `tests/it/api/rls/examples.rs`).
macro_rules! example {
    ($name:literal) => {
        include_str!(concat!(
            "../../../tests/data/envoy-ratelimit-examples/",
            $name,
            ".yaml"
        ))
    };
}

fn find<'a>(
    limits: &'a Limits,
    domain: &str,
    entries: &[(&'static str, &'static str)],
) -> Option<&'a Rule> {
    limits.find(domain, entries.iter().copied())
}

fn per(rule: Option<&Rule>) -> Option<(u64, Unit)> {
    rule.filter(|r| !r.unlimited)
        .map(|r| (if r.blocked { 0 } else { r.policy.limit }, r.unit))
}

#[test]
fn example_1_two_values_of_one_key() {
    let l = Limits::parse(example!("example1")).unwrap();
    let users = find(&l, "mongo_cps", &[("database", "users")]).unwrap();
    assert_eq!(per(Some(users)), Some((500, Unit::Second)));
    assert_eq!(users.policy.name, "mongo_cps.database_users");
    assert!(find(&l, "mongo_cps", &[("database", "other")]).is_none());
    assert!(find(&l, "other_domain", &[("database", "users")]).is_none());
}

const EXAMPLE_2: &str = example!("example2");

#[test]
fn example_2_nested_and_valueless_descriptors() {
    let l = Limits::parse(EXAMPLE_2).unwrap();
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    assert_eq!(per(find(&l, "messaging", &marketing)), Some((5, Unit::Day)));
    assert_eq!(
        per(find(&l, "messaging", &[("to_number", "2061111111")])),
        Some((100, Unit::Day))
    );
    // The placeholder has no limit of its own.
    assert!(find(&l, "messaging", &[("message_type", "marketing")]).is_none());
    assert!(find(
        &l,
        "messaging",
        &[("message_type", "other"), ("to_number", "1")]
    )
    .is_none());
}

#[test]
fn example_3_the_most_specific_match_wins_and_zero_blocks() {
    let l = Limits::parse(example!("example3")).unwrap();
    let any = find(&l, "edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]).unwrap();
    assert_eq!(per(Some(any)), Some((10, Unit::Second)));
    assert!(!any.blocked);
    let black = find(&l, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]).unwrap();
    assert!(black.blocked);
}

#[test]
fn example_4_descriptor_depth_must_match() {
    let flat = Limits::parse(example!("example4-flat")).unwrap();
    let two = [("key", "value"), ("subkey", "subvalue")];
    assert!(find(&flat, "example4", &two).is_none());
    let nested = Limits::parse(example!("example4-nested")).unwrap();
    assert_eq!(
        per(find(&nested, "example4", &two)),
        Some((300, Unit::Second))
    );
}

#[test]
fn example_5_unlimited() {
    let l = Limits::parse(example!("example5")).unwrap();
    assert!(find(&l, "internal", &[("ldap", "x")]).unwrap().unlimited);
    assert_eq!(
        per(find(&l, "internal", &[("azure", "x")])),
        Some((100, Unit::Minute))
    );
}

#[test]
fn example_6_shadow_mode() {
    let l = Limits::parse(example!("example6")).unwrap();
    let a = find(
        &l,
        "example6",
        &[("service", "auth-service"), ("user", "user-a")],
    )
    .unwrap();
    assert!(a.policy.shadow);
    let b = find(
        &l,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
    )
    .unwrap();
    assert!(!b.policy.shadow);
    assert_eq!(b.policy.limit, 20);
}

#[test]
fn example_7_replaces_is_read() {
    let l = Limits::parse(example!("example7")).unwrap();
    let one = find(
        &l,
        "example7",
        &[("key_1", "value_1"), ("user", "bkthomps")],
    )
    .unwrap();
    assert_eq!(one.name.as_deref(), Some("specific_limit"));
    assert_eq!(one.label, "specific_limit");
    let two = find(
        &l,
        "example7",
        &[("key_2", "value_2"), ("user", "bkthomps")],
    )
    .unwrap();
    assert_eq!(two.replaces, vec!["specific_limit".to_string()]);
}

#[test]
fn examples_8_and_10_metric_flags_load() {
    let l = Limits::parse(example!("example8")).unwrap();
    assert_eq!(
        per(find(&l, "example8", &[("key1", "zzz")])),
        Some((10, Unit::Minute))
    );
    assert_eq!(
        per(find(&l, "example8", &[("key1", "value1")])),
        Some((20, Unit::Minute))
    );
}

#[test]
fn example_9_wildcards() {
    let l = Limits::parse(example!("example9")).unwrap();
    let limit =
        |k: &'static str, v: &'static str| per(find(&l, "example9", &[(k, v)])).map(|p| p.0);
    assert_eq!(limit("key1", "value1"), Some(20));
    assert_eq!(limit("key1", "valueXYZ"), Some(20));
    assert_eq!(limit("key1", "value"), Some(20));
    assert_eq!(limit("key1", "valu"), None);
    assert_eq!(limit("path", "/api/123/action"), Some(21));
    assert_eq!(limit("path", "/api/user-id/action"), Some(21));
    assert_eq!(limit("path", "/api/123/other"), None);
    assert_eq!(limit("route", "/api/v1/resource/123/action"), Some(22));
    assert_eq!(limit("route", "/api/v1/resource/action"), None);
}

#[test]
fn wildcard_matching_edge_cases() {
    let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
    assert!(wildcard_match(&parts("a*a"), "aa"));
    assert!(
        !wildcard_match(&parts("a*a"), "a"),
        "prefix and suffix may not overlap"
    );
    assert!(wildcard_match(&parts("*"), ""));
    assert!(wildcard_match(&parts("x*y*z"), "xyz"));
    assert!(!wildcard_match(&parts("x*y*z"), "xzy"));
    assert!(wildcard_match(&parts("exact"), "exact"));
    assert!(!wildcard_match(&parts("exact"), "exactly"));
}

#[test]
fn tally_extensions_are_read() {
    let l = Limits::parse(
        "domain: llm
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 1000
      algorithm: gcra
      burst: 50
      on_redis_error: closed
      usage: true
",
    )
    .unwrap();
    let r = find(&l, "llm", &[("user", "u1")]).unwrap();
    assert_eq!(r.policy.algorithm, Algorithm::Gcra);
    assert_eq!(r.policy.burst, Some(50));
    assert!(r.answers_without_redis && r.usage);
    assert_eq!(r.policy.window, Duration::from_secs(60));
}

fn refused(text: &str) -> String {
    Limits::parse(text)
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn refusals_say_what_and_where() {
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n");
    assert!(e.contains("`d.a`: quota_mode and metadata apply"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    colour: red\n");
    assert!(e.contains("unknown field `colour`"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
    assert!(e.contains("d.a") && e.contains("fortnight"), "{e}");
    let e = refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
    );
    assert!(e.contains("unlimited"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - {key: a, value: b}\n  - {key: a, value: b}\n");
    assert!(
        e.contains("`d.a_b`: the descriptor is defined twice"),
        "{e}"
    );
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 2}\n");
    assert!(e.contains("burst"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: x, replaces: [{name: x}], unit: second, requests_per_unit: 5}\n");
    assert!(e.contains("replace itself"), "{e}");
    let e = refused("domain: ''\n");
    assert!(e.contains("domain"), "{e}");
}

const QUOTAS: &str = "domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: \"service_1\"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}, weight: 0.5, tags: [a, 1, true, null]}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
";

#[test]
fn quota_mode_and_metadata_load_as_envoyproxy_ratelimit_writes_them() {
    let l = Limits::parse(QUOTAS).unwrap();
    let s1 = find(&l, "rl", &[("service", "service_1")]).unwrap();
    assert!(s1.quota);
    let m = s1.metadata.as_deref().unwrap();
    assert_eq!(m["service_with_quota"]["name"], "service_1");
    let s2 = find(&l, "rl", &[("service", "service_2")]).unwrap();
    let m = s2.metadata.as_deref().unwrap();
    assert_eq!(m["weight"], 0.5);
    assert_eq!(m["tags"], serde_json::json!(["a", 1, true, null]));
    let user = find(&l, "rl", &[("user", "u")]).unwrap();
    assert!(!user.quota && user.metadata.is_none());
    assert!(l.returns_metadata("rl"));
    let plain = Limits::parse("domain: d\ndescriptors:\n  - key: a\n    quota_mode: false\n    metadata: {}\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    assert!(
        !plain.returns_metadata("d"),
        "an empty mapping returns nothing"
    );
}

#[test]
fn metadata_and_quota_mode_refusals_name_the_place() {
    let limited = |extra: &str| {
        format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n{extra}")
    };
    for (extra, says) in [
        ("    metadata: false\n", "`d.a.metadata`: must be a mapping"),
        ("    metadata: [x]\n", "`d.a.metadata`: must be a mapping"),
        (
            "    metadata: {1: x}\n",
            "`d.a.metadata`: key 1 is not a string",
        ),
        (
            "    metadata: {s: {n: 9007199254740993}}\n",
            "`d.a.metadata.s.n`: 9007199254740993 is beyond",
        ),
        (
            "    metadata: {s: [1, !tag x]}\n",
            "`d.a.metadata.s[1]`: the tagged value",
        ),
        ("    metadata: {n: .nan}\n", "is not a finite number"),
    ] {
        let e = refused(&limited(extra));
        assert!(e.contains(says), "{extra}: {e}");
    }
    assert!(Limits::parse(&limited("    metadata: {s: {n: 9007199254740992}}\n")).is_ok());
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    metadata: {x: 1}\n    descriptors: [{key: b, rate_limit: {unit: second, requests_per_unit: 1}}]\n");
    assert!(
        e.contains("`d.a`: quota_mode and metadata apply to the descriptor's rate_limit"),
        "{e}"
    );
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unlimited: true}\n");
    assert!(e.contains("`d.a`: an unlimited rate_limit"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    metadata: {x: 1}\n    rate_limit: {unlimited: true}\n");
    assert!(e.contains("`d.a`: an unlimited rate_limit"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 0}\n");
    assert!(
        e.contains("`d.a`: a quota_mode limit of 0 never has room"),
        "{e}"
    );
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    quota_mode: yes please\n");
    assert!(e.contains("quota_mode"), "{e}");
}

#[test]
fn overrides_count_apart_per_unit_and_limit() {
    let minute = Rule::overridden(10, Unit::Minute).unwrap();
    let second = Rule::overridden(10, Unit::Second).unwrap();
    let other = Rule::overridden(20, Unit::Minute).unwrap();
    assert_eq!(minute.policy.name, "override-minute-10");
    assert_ne!(minute.policy.name, second.policy.name);
    assert_ne!(minute.policy.name, other.policy.name);
    assert_eq!(
        minute.label, "override",
        "one metric label for every override"
    );
    assert!(Rule::overridden(0, Unit::Minute).is_err());
}

#[test]
fn unit_multiplier_makes_the_window_a_multiple_of_the_unit() {
    let l = Limits::parse(
        "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 10}
  - key: team
    rate_limit: {unit: second, requests_per_unit: 10}
",
    )
    .unwrap();
    let user = find(&l, "d", &[("user", "u")]).unwrap();
    assert_eq!(user.policy.window, std::time::Duration::from_secs(300));
    assert_eq!(user.unit, Unit::Minute, "Envoy is told the unit");
    let team = find(&l, "d", &[("team", "t")]).unwrap();
    assert_eq!(team.policy.window, std::time::Duration::from_secs(1));
    for bad in [
        "rate_limit: {unit: minute, unit_multiplier: 0, requests_per_unit: 1}",
        "rate_limit: {unlimited: true, unit_multiplier: 2}",
    ] {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    {bad}\n");
        assert!(Limits::parse(&text).is_err(), "{bad}");
    }
}

#[test]
fn share_threshold_makes_a_wildcards_values_share_one_count() {
    let l = Limits::parse(
        "domain: d
descriptors:
  - key: path
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: docs/*
    rate_limit: {unit: minute, requests_per_unit: 3}
",
    )
    .unwrap();
    let a = l.lookup("d", [("path", "files/a")]).unwrap();
    assert_eq!(a.shared.as_slice(), &[(0, "files/*")]);
    let b = l.lookup("d", [("path", "files/b")]).unwrap();
    assert_eq!(a.rule.policy.name, b.rule.policy.name);
    assert!(l
        .lookup("d", [("path", "docs/a")])
        .unwrap()
        .shared
        .is_empty());
    let e = Limits::parse(
        "domain: d\ndescriptors:\n  - key: path\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("share_threshold needs a wildcard"), "{e}");
}

/// `reserve` (tally's extension): compiled with its defaults; refused with the reason on any
/// algorithm but `fixed`, with `usage` or `shadow_mode`, and for out-of-range values.
#[test]
fn reserve_keys_compile_and_bad_ones_are_refused_with_the_reason() {
    let file = |rate_limit: &str, extra: &str| {
        format!("domain: ai\ndescriptors:\n  - key: tokens\n{extra}    rate_limit: {{unit: day, requests_per_unit: 100, {rate_limit}}}\n")
    };
    let l = Limits::parse(&file("reserve: {}", "")).unwrap();
    let r = find(&l, "ai", &[("tokens", "u")]).unwrap();
    assert_eq!(
        r.reserve,
        Some(reserve::Reserve {
            default: None,
            expiry: Duration::from_secs(600),
            max_extra: 0,
            reserve_key: "reserve".into(),
            settle_key: "settle".into(),
        })
    );
    let l = Limits::parse(&file(
        "reserve: {default: 40, expiry: 30s, max_extra: 5, reserve_key: r, settle_key: s}",
        "",
    ))
    .unwrap();
    let r = find(&l, "ai", &[("tokens", "u")]).unwrap().reserve.clone();
    let r = r.unwrap();
    assert_eq!(
        (r.default, r.expiry, r.max_extra),
        (Some(40), Duration::from_secs(30), 5)
    );
    assert_eq!(
        r.phase_of("r"),
        Some(tally_counters::request::Phase::Reserve)
    );
    assert_eq!(
        r.phase_of("s"),
        Some(tally_counters::request::Phase::Settle)
    );
    assert_eq!(r.phase_of("tokens"), None);
    for (rate_limit, extra, says) in [
        (
            "algorithm: gcra, reserve: {}",
            "",
            "reservations need the fixed algorithm (`gcra`",
        ),
        ("algorithm: sliding_log, reserve: {}", "", "(`sliding_log`"),
        (
            "algorithm: sliding_counter, reserve: {}",
            "",
            "(`sliding_counter`",
        ),
        ("usage: true, reserve: {}", "", "drop `usage`"),
        ("reserve: {}", "    shadow_mode: true\n", "shadow_mode"),
        (
            "reserve: {}",
            "    quota_mode: true\n",
            "quota_mode and reserve cannot be combined",
        ),
        (
            "reserve: {expiry: 2d}",
            "",
            "reserve.expiry: must be between 1ms and 1 day",
        ),
        (
            "reserve: {default: 0}",
            "",
            "reserve.default: must be at least 1",
        ),
        (
            "reserve: {default: 101}",
            "",
            "above requests_per_unit (100)",
        ),
        (
            "reserve: {reserve_key: x, settle_key: x}",
            "",
            "must differ",
        ),
        (
            "reserve: {settle_key: ''}",
            "",
            "reserve.settle_key: must not be empty",
        ),
        (
            "reserve: {expiry: 1m, refund: true}",
            "",
            "unknown field `refund`",
        ),
    ] {
        let e = Limits::parse(&file(rate_limit, extra))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{rate_limit}: {e}");
        assert!(e.contains("`ai.tokens`") || says.contains("unknown"), "{e}");
    }
}
