//! The limits file of the rate limit service, through `tally serve`'s gRPC port: a file rewritten
//! under a running server is applied whole once it holds still, the limits in force are gauges,
//! and a shared wildcard (`share_threshold`) counts all its values together.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tally_testkit::local_redis::LocalRedis;

use crate::common::rls::{ask, descriptor, limits_dir, unique, Rls, API};

/// A limits file rewritten in place is applied only once it holds still: after SIGHUP tally reads
/// it again shortly after, and on a change seen by the watch it waits for the next look, so a
/// half-written file (a truncated YAML can parse, with fewer limits) is never put in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_file_is_applied_only_once_it_holds_still() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("settle");
    let file = dir.join("api.yaml");
    std::fs::write(&file, API).unwrap();
    let rls = Rls::start(&redis, &dir, "rls-settle");
    let mut c = rls.client().await;
    let loads = || {
        rls.tally
            .metric("tally_rls_limits_loads_total{result=\"ok\"}")
            .unwrap_or(0.0)
    };
    assert_eq!(loads(), 1.0, "loaded once at start");
    // The limits in force are gauges: units a window and the window, per configured descriptor
    // (unlimited ones absent).
    let gauge = |family: &str, descriptor: &str| {
        rls.tally.metric(&format!(
            "{family}{{descriptor=\"{descriptor}\",domain=\"api\"}}"
        ))
    };
    assert_eq!(gauge("tally_rls_limit", "per_user"), Some(3.0));
    assert_eq!(gauge("tally_rls_limit", "api.route"), Some(100.0));
    assert_eq!(
        gauge("tally_rls_limit_window_seconds", "per_user"),
        Some(86_400.0)
    );
    assert_eq!(gauge("tally_rls_limit", "api.internal"), None);
    assert_eq!(gauge("tally_rls_limit", "api.extra"), None);
    let full = format!(
        "{API}  - key: extra\n    rate_limit:\n      unit: day\n      requests_per_unit: 7\n"
    );
    // The writer has written the first descriptor when SIGHUP comes, the rest 20 ms later.
    let partial = &API[..API.find("  - key: route").unwrap()];
    std::fs::write(&file, partial).unwrap();
    rls.tally.signal(libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&file, &full).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while loads() < 2.0 {
        assert!(
            Instant::now() < deadline,
            "the full file never loaded:\n{}",
            rls.tally.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Three more looks at the (unchanged) file.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        loads(),
        2.0,
        "one load, of the whole file, never of its first half"
    );
    let extra = unique("x");
    let r = ask(
        &mut c,
        "api",
        vec![descriptor(&[("extra", &extra)], Some(0))],
    )
    .await;
    let limit = r.statuses[0].current_limit.as_ref().expect("the new limit");
    assert_eq!(limit.requests_per_unit, 7);
    assert_eq!(
        gauge("tally_rls_limit", "api.extra"),
        Some(7.0),
        "the new file's gauges"
    );
}

/// `share_threshold` (envoyproxy/ratelimit's shared wildcard thresholds): every value a shared
/// wildcard matches counts in one state, so `files/a`, `files/b` and `files/c` share 3 a
/// minute; a wildcard without it counts each value apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_wildcard_counts_its_values_together() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("share");
    let tag = unique("s");
    std::fs::write(
        dir.join("paths.yaml"),
        format!(
            "domain: paths
descriptors:
  - key: path
    value: files-{tag}/*
    share_threshold: true
    rate_limit: {{unit: minute, requests_per_unit: 3}}
  - key: path
    value: docs-{tag}/*
    rate_limit: {{unit: minute, requests_per_unit: 3}}
"
        ),
    )
    .unwrap();
    let rls = Rls::start(&redis, &dir, "rls-share");
    let mut c = rls.client().await;
    let mut codes = Vec::new();
    for file in ["a", "a", "b", "c", "d"] {
        let path = format!("files-{tag}/{file}");
        let r = ask(&mut c, "paths", vec![descriptor(&[("path", &path)], None)]).await;
        codes.push(r.overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        codes,
        [ok, ok, ok, over, over],
        "3 a minute for all files together"
    );
    // Not shared: each value has its own 3.
    for doc in ["a", "a", "a", "b", "c"] {
        let path = format!("docs-{tag}/{doc}");
        let r = ask(&mut c, "paths", vec![descriptor(&[("path", &path)], None)]).await;
        assert_eq!(r.overall_code, ok, "{path}");
    }
}
