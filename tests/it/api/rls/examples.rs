//! envoyproxy/ratelimit's README examples (its "Examples" section, quoted as files in
//! `tests/data/envoy-ratelimit-examples`, which `src/config/limits/tests.rs` reads too) load in
//! `tally serve` and behave as that README says, over gRPC with the generated stubs.

use std::path::Path;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tally_testkit::local_redis::LocalRedis;

use crate::common::rls::{ask, descriptor, limits_dir, Rls};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_readme_examples_behave_as_documented() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("examples");
    let examples =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/envoy-ratelimit-examples");
    for name in ["example2", "example3", "example5", "example6", "example7"] {
        let file = format!("{name}.yaml");
        std::fs::copy(examples.join(&file), dir.join(file)).unwrap();
    }
    let rls = Rls::start(&redis, &dir, "rls-examples");
    let mut c = rls.client().await;
    let run = std::process::id().to_string();

    // 2: "("message_type", "marketing"),("to_number", "2061111111") ... get 5 requests per day";
    // "("to_number", "2061111111") ... 100 requests per day"; both in one request.
    let number = format!("206{run}");
    let both = || {
        vec![
            descriptor(
                &[("message_type", "marketing"), ("to_number", &number)],
                None,
            ),
            descriptor(&[("to_number", &number)], None),
        ]
    };
    for i in 0..5 {
        let r = ask(&mut c, "messaging", both()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "message {i}");
        assert_eq!(r.statuses[0].limit_remaining, 4 - i);
        assert_eq!(r.statuses[1].limit_remaining, 99 - i);
    }
    let r = ask(&mut c, "messaging", both()).await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "the 6th marketing message"
    );
    // Unlike envoyproxy/ratelimit, the denied request did not count against the 100.
    let r = ask(
        &mut c,
        "messaging",
        vec![descriptor(&[("to_number", &number)], Some(0))],
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 95);

    // 3: "the most specific match": 50.0.0.5 is blocked (requests_per_unit 0), others get 10/s.
    let r = ask(
        &mut c,
        "edge_proxy_per_ip",
        vec![descriptor(&[("remote_address", "50.0.0.5")], None)],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    let ip = format!("10.{}.0.1", std::process::id() % 250);
    within_one_window(&mut c, "edge_proxy_per_ip", &[("remote_address", &ip)], 10).await;

    // 5: "an OK status code with the LimitRemaining field set to MaxUint32".
    let r = ask(&mut c, "internal", vec![descriptor(&[("ldap", "x")], None)]).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, u32::MAX)
    );

    // 6: user-a is in shadow mode: never limited; user-b gets 20 per second.
    let a = [("service", "auth-service"), ("user", "user-a")];
    for _ in 0..15 {
        let r = ask(&mut c, "example6", vec![descriptor(&a, None)]).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    within_one_window(
        &mut c,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
        20,
    )
    .await;

    // 7: both descriptors: only the replacing limit (10/s) applies, and "the limit of the
    // original will not be changed": (key_1, value_1), (user, bkthomps) still has its 5.
    let one = [("key_1", "value_1"), ("user", "bkthomps")];
    let two = [("key_2", "value_2"), ("user", "bkthomps")];
    let r = ask(
        &mut c,
        "example7",
        vec![descriptor(&one, None), descriptor(&two, None)],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(
        r.statuses[0].current_limit.is_none(),
        "replaced: not evaluated"
    );
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        10
    );
    let r = ask(&mut c, "example7", vec![descriptor(&one, Some(0))]).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 5,
        "the replaced limit was not charged"
    );
}

/// `limit` requests pass and the next is over the limit, all within one window of a second
/// (retried when the sequence straddles a window boundary).
async fn within_one_window(
    c: &mut crate::common::rls::Client,
    domain: &str,
    entries: &[(&str, &str)],
    limit: u32,
) {
    for attempt in 0..5 {
        let mut codes = Vec::new();
        let mut resets = Vec::new();
        for _ in 0..=limit {
            let r = ask(c, domain, vec![descriptor(entries, None)]).await;
            codes.push(r.overall_code == Code::Ok as i32);
            resets.push(r.statuses[0].duration_until_reset.as_ref().unwrap().seconds);
        }
        let passed = codes.iter().filter(|ok| **ok).count() as u32;
        if passed == limit && !codes[limit as usize] {
            assert!(
                resets.iter().all(|s| *s == 1),
                "a second's window resets within 1 s"
            );
            return;
        }
        // A new second began midway; wait for the next one and try again.
        assert!(attempt < 4, "{domain}: {codes:?}");
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
}
