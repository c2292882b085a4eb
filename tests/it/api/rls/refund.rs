//! Envoy's `is_negative_hits`: a descriptor that gives its addend back to its limit, for each
//! algorithm; never below empty; applied even when another descriptor of the call denies;
//! refused on a reserving limit (a settle refunds there).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::common::rls::{ask, descriptor, unique, Client, RlsServer};

const LIMITS: &str = "domain: r
descriptors:
  - {key: fixed, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: sliding_log, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log}}
  - {key: sliding_counter, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_counter}}
  - {key: gcra, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}}
  - {key: wall, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: reserving, rate_limit: {unit: hour, requests_per_unit: 10, reserve: {}}}
";

fn refund(entries: &[(&str, &str)], units: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: true,
        ..descriptor(entries, Some(units))
    }
}

/// (overall OK, the first descriptor's `limit_remaining`).
async fn call(c: &mut Client, descriptors: Vec<RateLimitDescriptor>) -> (bool, u32) {
    let r = ask(c, "r", descriptors).await;
    (
        r.overall_code == Code::Ok as i32,
        r.statuses[0].limit_remaining,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_give_units_back_for_every_algorithm() {
    let server = RlsServer::start("refund", &[("r.yaml", LIMITS)]);
    let rls = &server.rls;
    let mut c = rls.client().await;
    for algo in ["fixed", "sliding_log", "sliding_counter", "gcra"] {
        let who = unique(algo);
        let e = [(algo, who.as_str())];
        assert!(
            call(&mut c, vec![descriptor(&e, Some(7))]).await.0,
            "{algo}"
        );
        assert!(
            !call(&mut c, vec![descriptor(&e, Some(4))]).await.0,
            "{algo}: 7 + 4 > 10"
        );
        // 5 back: 2 used, 8 left.
        assert_eq!(call(&mut c, vec![refund(&e, 5)]).await, (true, 8), "{algo}");
        assert!(
            call(&mut c, vec![descriptor(&e, Some(8))]).await.0,
            "{algo}: 2 + 8"
        );
        assert!(
            !call(&mut c, vec![descriptor(&e, Some(1))]).await.0,
            "{algo}: full"
        );
        // More back than was used: empty, not below.
        assert_eq!(
            call(&mut c, vec![refund(&e, 50)]).await,
            (true, 10),
            "{algo}"
        );
        assert!(
            call(&mut c, vec![descriptor(&e, Some(10))]).await.0,
            "{algo}"
        );
        assert!(
            !call(&mut c, vec![descriptor(&e, Some(1))]).await.0,
            "{algo}: not 50 extra"
        );
    }
    // A refund is applied even when another descriptor of the call denies it.
    let who = unique("with-wall");
    let e = [("fixed", who.as_str())];
    assert!(call(&mut c, vec![descriptor(&e, Some(10))]).await.0);
    let wall = descriptor(&[("wall", "x")], Some(2));
    let denied = call(&mut c, vec![refund(&e, 4), wall]).await;
    assert_eq!(denied, (false, 4), "6 used, 4 left");
    assert!(
        call(&mut c, vec![descriptor(&e, Some(4))]).await.0,
        "the 4 came back"
    );
    // A reserving limit refunds by its settle.
    let e = c
        .should_rate_limit(RateLimitRequest {
            domain: "r".into(),
            descriptors: vec![refund(&[("reserving", "u")], 1)],
            hits_addend: 0,
        })
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("refunds by its settle"), "{e:?}");
}
