//! Reserve → settle, called directly (as Envoy calls it: see `envoy/reserve.rs` for the
//! real Envoy): a settle retried twice counts once, a refund leaves exactly the true usage, a
//! reservation never settled is released after its expiry, a reused request id is denied.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use tally_testkit::local_redis::LocalRedis;

use crate::common::rls::{ask, descriptor, unique, Client, RlsServer};

const LIMITS: &str = "domain: ai
descriptors:
  - key: out
    rate_limit:
      unit: day
      requests_per_unit: 100
      reserve: {expiry: 1s, max_extra: 5}
";

/// (settled `n`, reserved `t`) of `user`'s reserving state, read from Redis.
fn state(redis: &LocalRedis, user: &str) -> (i64, i64) {
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*limit.fixed.reserve:*{user}*"))
        .query(&mut con)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (n, t): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
        .arg(&keys[0])
        .arg("n")
        .arg("t")
        .query(&mut con)
        .unwrap();
    (n.unwrap_or(0), t.unwrap_or(0))
}

/// One call: `phase` (`reserve` or `settle`) of request `id` for `units`; true when OK.
async fn call(c: &mut Client, user: &str, phase: &str, id: &str, units: u64) -> bool {
    let d = descriptor(&[("out", user), (phase, id)], Some(units));
    ask(c, "ai", vec![d]).await.overall_code == Code::Ok as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_count_once_refunds_leave_the_true_usage_and_reservations_expire() {
    let server = RlsServer::start("reserve", &[("ai.yaml", LIMITS)]);
    let rls = &server.rls;
    let redis = &server.redis;
    let mut c = rls.client().await;

    // Admitted only while settled + reserved + this reservation ≤ 100.
    let user = unique("settle");
    assert!(call(&mut c, &user, "reserve", "a", 60).await);
    assert!(
        !call(&mut c, &user, "reserve", "b", 50).await,
        "60 + 50 > 100"
    );
    assert_eq!(state(redis, &user), (0, 60));
    // The true cost, 20: 40 refunded, the count is the true usage; a retried settle (twice)
    // changes nothing.
    for _ in 0..3 {
        assert!(call(&mut c, &user, "settle", "a", 20).await);
        assert_eq!(
            state(redis, &user),
            (20, 0),
            "settled once, at the true cost"
        );
    }
    assert!(
        call(&mut c, &user, "reserve", "b", 80).await,
        "20 + 80 = 100"
    );
    assert!(
        !call(&mut c, &user, "reserve", "c", 1).await,
        "nothing left"
    );
    // A true cost above the reservation is charged up to max_extra (5) above it.
    assert!(call(&mut c, &user, "settle", "b", 95).await);
    assert_eq!(state(redis, &user), (105, 0));
    // A reused request id (live or settled) is denied: it could otherwise pass unreserved.
    let user = unique("reuse");
    assert!(call(&mut c, &user, "reserve", "z", 10).await);
    assert!(!call(&mut c, &user, "reserve", "z", 10).await, "z is live");
    assert!(call(&mut c, &user, "settle", "z", 10).await);
    assert!(
        !call(&mut c, &user, "reserve", "z", 10).await,
        "z was settled"
    );
    assert_eq!(state(redis, &user), (10, 0));

    // A reservation never settled holds the budget until its expiry (1s), then is released.
    let user = unique("expire");
    assert!(call(&mut c, &user, "reserve", "x", 100).await);
    let held_at = Instant::now();
    assert!(!call(&mut c, &user, "reserve", "y", 100).await);
    loop {
        if call(&mut c, &user, "reserve", "y", 100).await {
            break;
        }
        assert!(
            held_at.elapsed() < Duration::from_secs(10),
            "never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        held_at.elapsed() >= Duration::from_millis(900),
        "released before its expiry: {:?}",
        held_at.elapsed()
    );
    assert_eq!(state(redis, &user), (0, 100), "x released, y held");
    // The late response of x: no reservation left, its true cost is charged as it is.
    assert!(call(&mut c, &user, "settle", "x", 30).await);
    assert_eq!(state(redis, &user), (30, 100));
    // A plain check (the limit's entries alone, addend 0) counts live reservations.
    let check = descriptor(&[("out", &user)], Some(0));
    let r = ask(&mut c, "ai", vec![check]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "30 + 100 held");

    // Every settle above is counted by what it did.
    for (result, want) in [
        ("settled", 2.0),
        ("already_settled", 2.0),
        ("capped", 1.0),
        ("unreserved", 1.0),
    ] {
        let name = format!(
            "tally_rls_settles_total{{domain=\"ai\",descriptor=\"ai.out\",result=\"{result}\"}}"
        );
        assert_eq!(rls.tally.metric(&name), Some(want), "{name}");
    }
}
