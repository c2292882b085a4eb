//! Check, then charge, through a real Envoy: the README's `RateLimitPerRoute` snippet (the
//! descriptor checked with `hits_addend` 0 on the request, charged with `apply_on_stream_done`
//! from the upstream's `x-tokens-used` response header), taken from README.md itself, with
//! Envoy sending `http.token` as `initial_metadata`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitFilter};
use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalRedis;

use crate::common::envoy_side::{guide_yaml, read_head};
use crate::common::rls::{descriptor, limits_dir, Rls};

const TOKEN: &str = "charge-s3cret";
const LIMIT: u64 = 100;
const CHARGE: u64 = 30;

/// Envoy in front of `app`: the README's per-route config on the route, the filter sending the
/// token as gRPC metadata.
fn bootstrap_yaml(port: u16, admin: u16, app: u16, rls: u16) -> String {
    let snippet = guide_yaml("## Check, then charge", "typed_per_filter_config:");
    let route = ["route: {cluster: app, timeout: 30s}", snippet.as_str()];
    Bootstrap {
        app,
        rls,
        route: &route,
        rate_limit: Some(RateLimitFilter {
            domain: "edge",
            failure_mode_deny: true,
            settings: &["timeout: 1s"],
            token: Some(TOKEN),
        }),
        rls_tls: None,
    }
    .yaml(port, admin)
}

/// The app: answers every GET with `x-tokens-used` = the request's `x-charge`. A request with
/// `x-hold: N` is answered only once N such requests have arrived (so N are in flight at once).
fn start_app() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new((Mutex::new(0usize), Condvar::new()));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let held = held.clone();
            std::thread::spawn(move || serve_conn(conn, &held));
        }
    });
    port
}

fn serve_conn(conn: std::net::TcpStream, held: &(Mutex<usize>, Condvar)) {
    let mut out = conn.try_clone().unwrap();
    let mut lines = BufReader::new(conn).lines();
    loop {
        let Some(head) = read_head(&mut lines) else {
            return;
        };
        let charge = head.get("x-charge").cloned().unwrap_or_else(|| "0".into());
        let hold: usize = head.get("x-hold").and_then(|h| h.parse().ok()).unwrap_or(0);
        if hold > 0 {
            let (count, arrived) = held;
            let mut n = count.lock().unwrap();
            *n += 1;
            arrived.notify_all();
            let _ = arrived.wait_timeout_while(n, Duration::from_secs(10), |n| *n < hold);
        }
        let answer =
            format!("HTTP/1.1 200 OK\r\nx-tokens-used: {charge}\r\ncontent-length: 2\r\n\r\nok");
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// What is left of `user`'s tokens, asked directly (a check: charges nothing).
async fn remaining(port: u16, user: &str) -> u32 {
    let channel = tonic::transport::Endpoint::new(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = RateLimitServiceClient::with_interceptor(channel, |mut r: tonic::Request<()>| {
        let auth = format!("Bearer {TOKEN}").parse().unwrap();
        r.metadata_mut().insert("authorization", auth);
        Ok(r)
    });
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(&[("tokens", user)], Some(0))],
            hits_addend: 0,
        })
        .await
        .expect("answered")
        .into_inner();
    r.statuses[0].limit_remaining
}

/// The count of `user`'s window in Redis (its one fixed-window hash).
fn charged(redis: &LocalRedis, user: &str) -> u64 {
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{user}*"))
        .query(&mut con)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    // A fixed window is a hash: its window number `w` and its count `n`.
    redis::cmd("HGET")
        .arg(&keys[0])
        .arg("n")
        .query(&mut con)
        .unwrap()
}

/// Until the direct check shows `want` left (the charge is sent when the stream is done).
async fn wait_remaining(port: u16, user: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = remaining(port, user).await;
        if u64::from(left) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{user}: {left} left, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_checked_before_and_charged_after_the_response() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("envoy-charge");
    std::fs::write(
        dir.join("edge.yaml"),
        format!(
            "domain: edge\ndescriptors:\n  - key: tokens\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}, usage: true}}\n"
        ),
    )
    .unwrap();
    let rls = Rls::start_with_token(&redis, &dir, "rls-envoy-charge", Some(TOKEN));
    let _ = rls.client().await;
    let app = start_app();
    let envoy = Envoy::start(&dir, "charge", 1, |port, admin| {
        bootstrap_yaml(port, admin, app, rls.port)
    })
    .unwrap();
    let run = std::process::id();
    let charge = CHARGE.to_string();

    // One at a time: each response charges 30 after it is sent; the check lets a request through
    // while anything is left, so the window ends at 120 (overshoot < one charge).
    let user = format!("seq-{run}");
    let client = Client::new(Duration::from_secs(30));
    for (i, left) in [70, 40, 10, 0].into_iter().enumerate() {
        let a = client
            .get(envoy.port, "/", &[("x-user", &user), ("x-charge", &charge)])
            .unwrap();
        assert_eq!(a.status, 200, "request {i}: {}", envoy.log());
        wait_remaining(rls.port, &user, left).await;
    }
    let a = client
        .get(envoy.port, "/", &[("x-user", &user), ("x-charge", &charge)])
        .unwrap();
    assert_eq!(a.status, 429, "nothing left: the check denies");

    // Six in flight at once (the app answers none before all six arrived): all passed their
    // check before any was charged, so the window overshoots by up to concurrency × charge.
    let user = format!("burst-{run}");
    let port = envoy.port;
    let statuses: Vec<u16> = (0..6)
        .map(|_| {
            let (user, charge) = (user.clone(), charge.clone());
            std::thread::spawn(move || {
                let headers = [("x-user", &*user), ("x-charge", &*charge), ("x-hold", "6")];
                Client::new(Duration::from_secs(30))
                    .get(port, "/", &headers)
                    .unwrap()
                    .status
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(statuses, [200; 6], "{}", envoy.log());
    wait_remaining(rls.port, &user, 0).await;
    // All six charged: 180 = the limit + 80, within concurrency × largest charge (6 × 30).
    let deadline = Instant::now() + Duration::from_secs(10);
    while charged(&redis, &user) != 6 * CHARGE {
        assert!(
            Instant::now() < deadline,
            "charged {}",
            charged(&redis, &user)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = client
        .get(envoy.port, "/", &[("x-user", &user), ("x-charge", &charge)])
        .unwrap();
    assert_eq!(a.status, 429);
    assert_eq!(
        envoy.stat("cluster.app.ratelimit.error"),
        0,
        "{}",
        envoy.log()
    );
}
