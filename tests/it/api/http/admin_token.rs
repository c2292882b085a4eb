//! `http.admin_token`: what destroys or hands out state (reset, quota release, pool fill, locks)
//! needs the second token; the caller token is answered 403, no token 401, both as problem
//! details; the admin token passes everywhere the caller token does. And a lock acquire waits no
//! longer than the request timeout allows.

use std::time::Duration;

use crate::common::{hourly, total, wait_for, Harness};
use tally::config::{PoolConfig, QuotaConfig};
use tally_testkit::http::{Answer, Client};

const CALLER: &str = "Bearer caller-t0ken";
const ADMIN: &str = "Bearer admin-t0ken";

fn post(port: u16, auth: Option<&str>, path: &str, body: &str) -> Answer {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(auth) = auth {
        headers.push(("Authorization", auth));
    }
    Client::default()
        .post_with(port, path, &headers, body)
        .expect("an answer")
}

fn problem(answer: &Answer, status: u16, slug: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json"),
        "{:?}",
        answer.headers
    );
    let p: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(p["status"], status, "{}", answer.body);
    assert!(
        p["type"].as_str().unwrap().ends_with(&format!("/{slug}")),
        "{}",
        answer.body
    );
}

const HIT: &str = r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"}}"#;
const RESET: &str =
    r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"},"action":"reset"}"#;
const RELEASE: &str = r#"{"quota":"flash","user":"u1","action":"release"}"#;
const FILL: &str = r#"{"pool":"codes","items":["c1"],"action":"fill"}"#;
const ACQUIRE: &str = r#"{"ttl_ms":1000}"#;
const LOCK: &str = "/v1/locks/nightly/acquire";
/// Taking counts away is destructive too: a value of 0 or less, not a positive one.
const TAKE: &str =
    r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"},"value":-1000}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_calls_need_the_admin_token() {
    let h = Harness::new("admin-token", 1);
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut config = h.config("g-admin", hourly("adm"));
    config.http.listen = format!("127.0.0.1:{port}");
    config.http.token = Some("caller-t0ken".into());
    config.http.admin_token = Some("admin-t0ken".into());
    config.request.quotas.push(QuotaConfig {
        name: "flash".into(),
        size: 10,
        once_per_user: true,
        ttl: Duration::from_secs(3600),
        durability: None,
    });
    config.request.pools.push(PoolConfig {
        name: "codes".into(),
        ttl: Duration::from_secs(3600),
        durability: None,
    });
    let running = h.start(config);
    wait_for("http answers", Duration::from_secs(30), || {
        tally_testkit::http::get(port, "/health/live").is_some()
    })
    .await;

    tokio::task::spawn_blocking(move || {
        the_caller_token_counts_and_decides_but_destroys_nothing(port);
        a_caller_cannot_bring_a_counter_near_overflow(port);
        no_token_or_a_wrong_one_is_unauthorized(port);
        the_admin_token_does_all_of_it(port);
    })
    .await
    .unwrap();
    assert_eq!(
        total(&h, "adm:*"),
        0,
        "only the admin's reset cleared the key"
    );
    running.stop().await;
}

/// The caller token counts, decides and peeks, but does not reset, release, fill or lock: 403.
fn the_caller_token_counts_and_decides_but_destroys_nothing(port: u16) {
    let a = post(port, Some(CALLER), "/v1/hit", HIT);
    assert_eq!(a.status, 200, "{}", a.body);
    let q = post(
        port,
        Some(CALLER),
        "/v1/quota",
        r#"{"quota":"flash","user":"u1"}"#,
    );
    assert_eq!(q.status, 200, "{}", q.body);
    // ... but not reset, release, fill or locks: 403 with it, 401 without any token.
    problem(
        &post(port, Some(CALLER), "/v1/hit", RESET),
        403,
        "forbidden",
    );
    problem(
        &post(port, Some(CALLER), "/v1/quota", RELEASE),
        403,
        "forbidden",
    );
    problem(
        &post(port, Some(CALLER), "/v1/pool", FILL),
        403,
        "forbidden",
    );
    problem(&post(port, Some(CALLER), LOCK, ACQUIRE), 403, "forbidden");
    // Taking counts away is destructive too: a value of 0 or less, not a positive one.
    let zero = r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"},"value":0}"#;
    problem(&post(port, Some(CALLER), "/v1/hit", TAKE), 403, "forbidden");
    problem(&post(port, Some(CALLER), "/v1/hit", zero), 403, "forbidden");
    let peek =
        r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"},"action":"peek"}"#;
    let a = post(port, Some(CALLER), "/v1/hit", peek);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("\"value\":1"),
        "the refused -1000 took nothing: {}",
        a.body
    );
}

/// Nor may a plain caller bring a counter within reach of overflow: a value above
/// http.max_value (2^53 - 1 by default), or a sum past it. The admin is not bound.
fn a_caller_cannot_bring_a_counter_near_overflow(port: u16) {
    let big = |value: i64| {
        format!(
            r#"{{"counter":"flow","dimensions":{{"app_id":"big","device_id":"d1"}},"value":{value}}}"#
        )
    };
    let max = (1i64 << 53) - 1;
    problem(
        &post(port, Some(CALLER), "/v1/hit", &big(i64::MAX)),
        403,
        "forbidden",
    );
    problem(
        &post(port, Some(CALLER), "/v1/hit", &big(max + 1)),
        403,
        "forbidden",
    );
    let a = post(port, Some(CALLER), "/v1/hit", &big(max - 10));
    assert_eq!(a.status, 200, "{}", a.body);
    let past = post(port, Some(CALLER), "/v1/hit", &big(11));
    problem(&past, 403, "forbidden");
    assert!(past.body.contains("http.max_value"), "{}", past.body);
    let a = post(port, Some(CALLER), "/v1/hit", &big(10));
    assert!(
        a.status == 200 && a.body.contains(&format!("\"value\":{max}")),
        "up to the bound is fine, and the refused 11 added nothing: {}",
        a.body
    );
    let a = post(port, Some(ADMIN), "/v1/hit", &big(1));
    assert_eq!(a.status, 200, "the admin is not bound: {}", a.body);
    let clear =
        r#"{"counter":"flow","dimensions":{"app_id":"big","device_id":"d1"},"action":"reset"}"#;
    assert_eq!(post(port, Some(ADMIN), "/v1/hit", clear).status, 200);
}

fn no_token_or_a_wrong_one_is_unauthorized(port: u16) {
    let none = post(port, None, "/v1/hit", RESET);
    problem(&none, 401, "unauthorized");
    assert!(
        none.header("www-authenticate").is_some(),
        "{:?}",
        none.headers
    );
    problem(
        &post(port, Some("Bearer wrong"), "/v1/hit", HIT),
        401,
        "unauthorized",
    );
}

/// The admin token does all of it, and what the caller token may do as well.
fn the_admin_token_does_all_of_it(port: u16) {
    for (path, body) in [
        ("/v1/hit", HIT),
        ("/v1/hit", TAKE),
        ("/v1/quota", RELEASE),
        ("/v1/pool", FILL),
        (LOCK, ACQUIRE),
    ] {
        let a = post(port, Some(ADMIN), path, body);
        assert_eq!(a.status, 200, "{path}: {}", a.body);
    }
    let a = post(port, Some(ADMIN), "/v1/hit", RESET);
    assert_eq!(a.status, 200, "{}", a.body);
}

/// A lock acquire's wait ends before `http.request_timeout` less `redis.response_timeout`: the
/// caller gets "busy" instead of a 503 from a handler cut mid-wait (whose last try could have
/// taken a lease nobody knows the token of).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_wait_ends_before_the_request_timeout() {
    let h = Harness::new("lock-wait", 1);
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut config = h.config("g-lock-wait", hourly("lw"));
    config.http.listen = format!("127.0.0.1:{port}");
    config.http.request_timeout = Duration::from_millis(1500);
    config.redis.response_timeout = Duration::from_millis(500);
    let running = h.start(config);
    wait_for("http answers", Duration::from_secs(30), || {
        tally_testkit::http::get(port, "/health/live").is_some()
    })
    .await;
    tokio::task::spawn_blocking(move || {
        let lock = "/v1/locks/busy/acquire";
        let held = post(port, None, lock, r#"{"ttl_ms":20000}"#);
        assert_eq!(held.status, 200, "{}", held.body);
        assert!(held.body.contains(r#""acquired":true"#), "{}", held.body);
        let started = std::time::Instant::now();
        let waited = post(port, None, lock, r#"{"ttl_ms":20000,"wait_ms":5000}"#);
        assert_eq!(waited.status, 200, "{}", waited.body);
        assert!(
            waited.body.contains(r#""acquired":false"#),
            "{}",
            waited.body
        );
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    })
    .await
    .unwrap();
    running.stop().await;
}
