//! The request path over HTTP: several `tally serve` processes on one real redis-server, 200
//! concurrent clients, checked against what each answer says and what Redis holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::process::TallyProcess;
use crate::common::request::PLAYS;
use crate::common::wait_for;
use serde_json::Value;
use tally_testkit::http;
use tally_testkit::local_redis::LocalRedis;

fn config(redis: &LocalRedis) -> String {
    format!(
        r#"
[redis]
url = "{}"
# Exactness is checked here, not latency: a debug build on a loaded 2-core machine can take
# seconds to answer 200 clients, and a timed-out decision is a 503 ("outcome unknown").
response_timeout = "30s"

{PLAYS}

[[request.limits]]
name = "fixed"
algorithm = "fixed"
limit = 30
window = "500ms"

[[request.limits]]
name = "hourly"
algorithm = "fixed"
limit = 1
window = "1h"

[[request.limits]]
name = "open"
algorithm = "gcra"
limit = 1000
window = "1s"

[[request.limits]]
name = "closed"
algorithm = "sliding_log"
limit = 1000
window = "1s"
on_redis_error = "closed"

[[request.quotas]]
name = "flash"
size = 100
once_per_user = true
ttl = "1h"
"#,
        redis.url()
    )
}

fn serve(redis: &LocalRedis, n: usize) -> Vec<TallyProcess> {
    (0..n)
        .map(|i| {
            let (config, name) = (config(redis), format!("serve{i}"));
            TallyProcess::start_command_with_http(
                "serve",
                &config,
                &name,
                "request_timeout = \"60s\"",
            )
        })
        .collect()
}

async fn wait_ready(procs: &[TallyProcess]) {
    for p in procs {
        wait_for("tally serve ready", Duration::from_secs(20), || {
            http::get(p.port, "/health/ready").is_some_and(|(code, _)| code == 200)
        })
        .await;
    }
}

fn post(port: u16, path: &str, body: &str) -> (u16, Value, String) {
    let a = http::post_json(port, path, body).expect("tally answers");
    let json = serde_json::from_str(&a.body).unwrap_or(Value::Null);
    (a.status, json, a.head())
}

/// Run `f(i)` on 200 threads at once, spread over the processes' ports.
fn on_200_threads<T: Send + 'static>(
    ports: &[u16],
    f: impl Fn(u16, usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let threads: Vec<_> = (0..200)
        .map(|i| {
            let (f, port) = (f.clone(), ports[i % ports.len()]);
            std::thread::spawn(move || f(port, i))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_fixed_limit_are_exact_across_three_processes() {
    let redis = LocalRedis::start(&[]).unwrap();
    let procs = serve(&redis, 3);
    wait_ready(&procs).await;
    let ports: Vec<u16> = procs.iter().map(|p| p.port).collect();

    let takes = on_200_threads(&ports, |port, i| {
        let mut admitted = Vec::new();
        for user in [format!("u{i}"), format!("u{i}"), format!("v{i}")] {
            let body = format!(r#"{{"quota":"flash","user":"{user}"}}"#);
            let (code, answer, _) = post(port, "/v1/quota", &body);
            assert_eq!(code, 200, "{answer}");
            if answer["outcome"] == "admitted" {
                admitted.push(user);
            }
        }
        admitted
    });
    let admitted: Vec<String> = takes.into_iter().flatten().collect();
    assert_eq!(admitted.len(), 100, "exactly the quota's size");
    let users: std::collections::HashSet<_> = admitted.iter().collect();
    assert_eq!(users.len(), 100, "no user twice");

    let end = Instant::now() + Duration::from_millis(2300);
    let decided = on_200_threads(&ports, move |port, _| {
        let mut admitted = Vec::new();
        let mut denied_head = None;
        while Instant::now() < end {
            let (code, d, head) = post(port, "/v1/limit", r#"{"policy":"fixed","subject":"ip"}"#);
            assert_eq!(code, 200);
            if d["admitted"] == true {
                admitted.push(d["now_ms"].as_i64().unwrap());
            } else {
                denied_head = Some(head);
            }
        }
        (admitted, denied_head)
    });
    let mut per_window: BTreeMap<i64, usize> = BTreeMap::new();
    for t in decided.iter().flat_map(|(a, _)| a) {
        *per_window.entry(t / 500).or_default() += 1;
    }
    assert!(per_window.len() >= 4, "{per_window:?}");
    assert!(per_window.values().all(|&n| n <= 30), "{per_window:?}");
    let inner: Vec<usize> = per_window
        .values()
        .skip(1)
        .take(per_window.len() - 2)
        .copied()
        .collect();
    assert!(
        inner.iter().all(|&n| n == 30),
        "saturated windows admit exactly 30: {per_window:?}"
    );
    let head = decided
        .iter()
        .find_map(|(_, h)| h.clone())
        .expect("some requests were denied")
        .to_ascii_lowercase();
    assert!(
        head.contains("ratelimit-policy: \"fixed\";q=30;w=1"),
        "{head}"
    );
    assert!(head.contains("ratelimit: \"fixed\";r=0;t="), "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");

    // 429 on request, and the decisions are in the metrics of every process.
    let ask = r#"{"policy":"hourly","subject":"ip2","reject":true}"#;
    assert_eq!(
        post(ports[0], "/v1/limit", ask).0,
        200,
        "the first of one per hour"
    );
    assert_eq!(
        post(ports[1], "/v1/limit", ask).0,
        429,
        "denied requests answer 429 when asked to"
    );
    let total: f64 = procs
        .iter()
        .filter_map(|p| p.metric("tally_request_decisions_total{name=\"flash\",outcome=\"allowed\",primitive=\"quota\"}"))
        .sum();
    assert_eq!(total, 100.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_share_the_stream_keys_and_bad_input_is_refused() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let procs = serve(&redis, 1);
    wait_ready(&procs).await;
    let port = procs[0].port;
    a_hit_is_stored_as_the_stream_stores_it(port, &redis);
    bad_input_is_refused(port);
    locks_have_one_holder_and_release_with_its_token(port);
    // Without Redis: hits fail (503), each limit answers by its failure mode, and says so.
    redis.stop();
    without_redis_each_limit_answers_by_its_failure_mode(&procs[0]).await;
}

/// A hit is counted once per idempotency key, in the key the stream writes (dimension values
/// escaped), expiring with its window as the stream stores it.
fn a_hit_is_stored_as_the_stream_stores_it(port: u16, redis: &LocalRedis) {
    let body =
        r#"{"counter":"plays","dimensions":{"video":"v:1"},"value":3,"idempotency_key":"r1"}"#;
    let (code, first, _) = post(port, "/v1/hit", body);
    assert_eq!(code, 200, "{first}");
    let (_, again, _) = post(port, "/v1/hit", body);
    assert_eq!(
        (first["value"].as_i64(), again["value"].as_i64()),
        (Some(3), Some(3))
    );
    assert_eq!(again["duplicate"], true);
    let key = first["key"].as_str().unwrap().to_string();
    assert!(
        key.starts_with("plays:v%3A1:"),
        "dimension values are escaped: {key}"
    );
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let stored: i64 = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
    assert_eq!(stored, 3);
    assert!(
        ttl > 0 && ttl <= 3_600_000 + 300_000,
        "expires with its window (spread by at most 5 min): {ttl}"
    );
    // Stored as the stream stores it: window end (+ retention), spread by the key's hash.
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut conn)
        .unwrap();
    let window_expiry = first["expire_at_ms"].as_i64().unwrap();
    assert_eq!(
        at,
        tally::model::stored_expire_at(key.as_bytes(), window_expiry, 300_000)
    );
    // A key left without expiry (made outside tally) is repaired by the next hit.
    let _: () = redis::cmd("PERSIST").arg(&key).query(&mut conn).unwrap();
    post(
        port,
        "/v1/hit",
        r#"{"counter":"plays","dimensions":{"video":"v:1"}}"#,
    );
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
    assert!(ttl > 0, "expiry repaired");
}

/// Unknown counters and policies, missing or extra dimensions, bad times, oversized and
/// malformed bodies are refused as problems.
fn bad_input_is_refused(port: u16) {
    for (body, why) in [
        (r#"{"counter":"nope","dimensions":{}}"#, "unknown counter"),
        (
            r#"{"counter":"plays","dimensions":{}}"#,
            "missing dimension",
        ),
        (
            r#"{"counter":"plays","dimensions":{"video":"a","x":"b"}}"#,
            "not a dimension",
        ),
        (
            r#"{"counter":"plays","dimensions":{"video":"a"},"at":"yesterday"}"#,
            "bad time",
        ),
    ] {
        let (code, answer, _) = post(port, "/v1/hit", body);
        assert_eq!(code, 400, "{answer}");
        assert_eq!(answer["status"], 400, "{answer}");
        assert!(answer["detail"].as_str().unwrap().contains(why), "{answer}");
    }
    let (code, answer, _) = post(port, "/v1/limit", r#"{"policy":"nope","subject":"s"}"#);
    assert_eq!(code, 400, "{answer}");
    let big = format!(
        r#"{{"policy":"fixed","subject":"{}"}}"#,
        "x".repeat(100_000)
    );
    assert_eq!(
        http::post_json(port, "/v1/limit", &big).unwrap().status,
        413
    );
    assert!(
        http::post_json(port, "/v1/limit", "{not json")
            .unwrap()
            .status
            >= 400
    );
}

/// Locks over HTTP: one holder at a time, released only with its token.
fn locks_have_one_holder_and_release_with_its_token(port: u16) {
    let (code, first, _) = post(port, "/v1/locks/nightly/acquire", r#"{"ttl_ms":60000}"#);
    assert_eq!(
        (code, first["acquired"].as_bool()),
        (200, Some(true)),
        "{first}"
    );
    let (_, second, _) = post(port, "/v1/locks/nightly/acquire", r#"{"ttl_ms":60000}"#);
    assert_eq!(second["acquired"], false, "{second}");
    let token = first["lease"]["token"].as_str().unwrap();
    assert!(first["lease"]["fence"].as_u64().unwrap() >= 1);
    let wrong = post(port, "/v1/locks/nightly/release", r#"{"token":"not-mine"}"#).1;
    assert_eq!(wrong["released"], false);
    let body = format!(r#"{{"token":"{token}","ttl_ms":30000}}"#);
    assert_eq!(
        post(port, "/v1/locks/nightly/extend", &body).1["extended"],
        true
    );
    assert_eq!(
        post(port, "/v1/locks/nightly/release", &body).1["released"],
        true
    );
    assert_eq!(
        post(port, "/v1/locks/nightly/release", &body).1["released"],
        false
    );
}

/// With Redis stopped: hits fail (503), each limit answers by its failure mode, and says so.
async fn without_redis_each_limit_answers_by_its_failure_mode(tally: &TallyProcess) {
    let port = tally.port;
    let (code, problem, _) = post(
        port,
        "/v1/hit",
        r#"{"counter":"plays","dimensions":{"video":"a"}}"#,
    );
    assert_eq!(code, 503);
    // The detail names what happened: Redis closed the connection (or refused a new one); it did
    // not merely answer late.
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        !detail.contains("in time") && !detail.contains("within"),
        "{problem}"
    );
    let (_, open, head) = post(port, "/v1/limit", r#"{"policy":"open","subject":"s"}"#);
    assert_eq!(
        (open["admitted"].as_bool(), open["without_redis"].as_bool()),
        (Some(true), Some(true))
    );
    // Real times, and no remaining claimed for what was not counted.
    let now = chrono::Utc::now().timestamp_millis();
    let said = open["now_ms"].as_i64().unwrap_or(0);
    assert!(
        (said - now).abs() < 60_000,
        "now_ms {said} vs {now}: {open}"
    );
    let head = head.to_ascii_lowercase();
    assert!(
        head.lines().any(|l| l.starts_with("ratelimit-policy:")),
        "{head}"
    );
    assert!(
        !head.lines().any(|l| l.starts_with("ratelimit:")),
        "no RateLimit state without Redis: {head}"
    );
    let (_, both, _) = post(
        port,
        "/v1/limit",
        r#"{"policies":["open","closed"],"subject":"s"}"#,
    );
    assert_eq!(both["admitted"], false, "fail closed wins: {both}");
    let m = |d: &str| {
        tally
            .metric(&format!(
                "tally_limit_decisions_without_redis_total{{decision=\"{d}\",policy=\"open\"}}"
            ))
            .unwrap_or(0.0)
    };
    assert_eq!(m("allowed"), 2.0);
    wait_for("not ready without redis", Duration::from_secs(10), || {
        http::get(port, "/health/ready").is_some_and(|(code, _)| code == 503)
    })
    .await;
}
