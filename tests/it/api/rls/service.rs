//! Envoy's rate limit service, called directly with the generated stubs (the client Envoy
//! itself uses speaks the same protocol): `tally serve` with `[rls]` on a real redis-server.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tally_testkit::local_redis::LocalRedis;
use tonic_health::pb::health_check_response::ServingStatus::{NotServing, Serving};

use crate::common::rls::{ask, descriptor, health_watch, limits_dir, unique, Rls, RlsServer, API};

fn ok(s: &DescriptorStatus) -> bool {
    s.code == Code::Ok as i32
}

/// Envoy's per-descriptor `limit` overrides: each unit (and limit) counts in its own state, so a
/// descriptor limited per second and per minute in one call is held to both (they shared one
/// policy name, and the per-second window index reset the per-minute count). Oversized
/// descriptors are refused as INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_of_different_units_count_apart() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let server = RlsServer::start("overrides", &[("api.yaml", API)]);
    let rls = &server.rls;
    let mut c = rls.client().await;
    let user = unique("o");
    let with_limit = |requests_per_unit: u32, unit: i32| {
        let mut d = descriptor(&[("user", &user)], None);
        d.limit = Some(RateLimitOverride {
            requests_per_unit,
            unit,
        });
        d
    };
    // Unit codes of Envoy's enum: 1 second, 3 hour.
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = ask(&mut c, "api", vec![with_limit(1000, 1), with_limit(2, 3)]).await;
        codes.push((r.overall_code, r.statuses[1].limit_remaining));
    }
    let (ok_code, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        codes,
        vec![(ok_code, 1), (ok_code, 0), (over, 0), (over, 0)],
        "2 an hour holds while 1000 a second counts beside it"
    );

    let long = "v".repeat(513);
    let refused = c
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &long)], None)],
            hits_addend: 0,
        })
        .await
        .expect_err("a 513-byte value is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addends_statuses_and_a_denial_that_charges_nothing() {
    let server = RlsServer::start("fields", &[("api.yaml", API)]);
    let rls = &server.rls;
    let mut c = rls.client().await;
    let user = unique("u");
    let route = unique("r");

    // hits_addend 0: checked, nothing charged; every field filled.
    let r = ask(&mut c, "api", vec![descriptor(&[("user", &user)], Some(0))]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let s = &r.statuses[0];
    assert!(ok(s));
    let limit = s.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("per_user", 3, 4)
    );
    assert_eq!(s.limit_remaining, 3, "a check charges nothing");
    let reset = s
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset")
        .seconds;
    assert!((1..=86_400).contains(&reset), "{reset}");
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(
        headers.contains(&("RateLimit-Policy", "\"per_user\";q=3;w=86400")),
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .any(|(k, v)| *k == "RateLimit" && v.starts_with("\"per_user\";r=3;t=")),
        "{headers:?}"
    );

    // hits_addend N on the descriptor; the route's count rises with the request's addend.
    let r = ask(
        &mut c,
        "api",
        vec![
            descriptor(&[("user", &user)], Some(2)),
            descriptor(&[("route", &route)], None),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 99);
    assert_eq!(
        r.statuses[1].current_limit.as_ref().unwrap().name,
        "",
        "no name configured"
    );

    // 2 more for the user do not fit: the request is denied, and the route is not charged.
    let r = ask(
        &mut c,
        "api",
        vec![
            descriptor(&[("user", &user)], Some(2)),
            descriptor(&[("route", &route)], Some(5)),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert!(!ok(&r.statuses[0]));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert!(ok(&r.statuses[1]), "the route alone admits it");
    let r = ask(
        &mut c,
        "api",
        vec![descriptor(&[("route", &route)], Some(0))],
    )
    .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 99,
        "the denied request charged nothing"
    );

    // Unlimited, and a descriptor that matches nothing.
    let r = ask(
        &mut c,
        "api",
        vec![
            descriptor(&[("internal", "x")], None),
            descriptor(&[("nothing", "x")], None),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[1].current_limit.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_charge_overshoots_by_one_charge_at_most() {
    let server = RlsServer::start("usage", &[("api.yaml", API)]);
    let rls = &server.rls;
    let mut c = rls.client().await;
    let who = unique("t");
    let d = |n| descriptor(&[("tokens", &who)], Some(n));
    // Checks pass while something is left; each charge is recorded whatever is left.
    let mut charged = 0;
    loop {
        let check = ask(&mut c, "api", vec![d(0)]).await;
        if check.overall_code != Code::Ok as i32 {
            break;
        }
        let charge = ask(&mut c, "api", vec![d(30)]).await;
        assert_eq!(
            charge.overall_code,
            Code::Ok as i32,
            "a charge is never denied"
        );
        charged += 30;
        assert!(charged <= 130, "checks must stop once the limit is used");
    }
    assert_eq!(charged, 120, "100 + less than one charge");
    let r = ask(&mut c, "api", vec![d(0)]).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_unavailable_at_once_unless_the_policy_decides() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("down");
    std::fs::write(
        dir.join("api.yaml"),
        "domain: api
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: day, requests_per_unit: 5, on_redis_error: closed}
",
    )
    .unwrap();
    let rls = Rls::start(&redis, &dir, "rls-down");
    let mut c = rls.client().await;
    let r = ask(&mut c, "api", vec![descriptor(&[("open", "a")], None)]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let mut health = health_watch(rls.port).await;
    health.wait_for(Serving).await;
    redis.stop();
    // gRPC health follows Redis: a health-checking Envoy stops sending calls that would fail.
    health.wait_for(NotServing).await;
    for _ in 0..3 {
        let started = Instant::now();
        let e = c
            .should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("open", "a")], None)],
                hits_addend: 0,
            })
            .await
            .expect_err("no answer without redis");
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let r = ask(&mut c, "api", vec![descriptor(&[("closed", "a")], None)]).await;
        assert_eq!(
            r.overall_code,
            Code::OverLimit as i32,
            "on_redis_error: closed decides"
        );
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
    redis.restart().unwrap();
    health.wait_for(Serving).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = c
            .should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("open", "b")], None)],
                hits_addend: 0,
            })
            .await;
        if let Ok(r) = r {
            assert_eq!(r.into_inner().statuses[0].limit_remaining, 4);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rls answers again once redis is back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
