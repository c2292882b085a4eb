//! The HTTP interface as a contract: every error answer of every route is an RFC 9457 problem
//! (`application/problem+json`, a 4xx for bad input, never a 5xx, never internal text), and the
//! bodies `curl -d` sends (a form content type) are read as JSON. One `tally serve` on a real
//! redis-server.

use std::time::Duration;

use crate::common::process::TallyProcess;
use crate::common::request::{PLAYS, PRIMITIVES};
use crate::common::wait_for;
use tally_testkit::http::{self, Client};
use tally_testkit::local_redis::LocalRedis;

fn config(redis: &LocalRedis) -> String {
    format!(
        r#"
[redis]
url = "{}"

{PLAYS}

[[request.limits]]
name = "fixed"
algorithm = "fixed"
limit = 30
window = "1s"

[[request.limits]]
name = "gcra"
algorithm = "gcra"
limit = 100
window = "1s"

{PRIMITIVES}
"#,
        redis.url()
    )
}

/// A malformed request: (method, path, body).
type Hostile = (&'static str, String, String);

fn post(path: &str, body: &str) -> Hostile {
    ("POST", path.to_string(), body.to_string())
}

/// Malformed requests across every route.
fn hostile() -> Vec<Hostile> {
    let mut all = hostile_hits();
    all.extend(hostile_limits());
    all.extend(hostile_primitives());
    all.extend(hostile_locks_and_batches());
    all.extend(hostile_reads());
    all
}

fn hostile_hits() -> Vec<Hostile> {
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let p = post;
    vec![
        p("/v1/hit", "not json"),
        p("/v1/hit", "{}"),
        p("/v1/hit", "[]"),
        p("/v1/hit", &deep),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"}} trailing"#,
        ),
        p("/v1/hit", r#"{"counter":"","dimensions":{}}"#),
        p("/v1/hit", r#"{"counter":"nope","dimensions":{}}"#),
        p("/v1/hit", r#"{"counter":"plays","dimensions":{"video":5}}"#),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"value":1.5}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"value":"7"}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"value":99999999999999999999}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"action":"explode"}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"action":"fill"}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"at":"yesterday"}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"at":"99999999999999999"}"#,
        ),
        p(
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"surprise":1}"#,
        ),
    ]
}

fn hostile_limits() -> Vec<Hostile> {
    let huge_policies = format!(
        r#"{{"policies":[{}],"subject":"s"}}"#,
        vec![r#""fixed""#; 5000].join(",")
    );
    let p = post;
    vec![
        p("/v1/limit", r#"{"policy":"fixed","subject":"s","cost":-1}"#),
        p(
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s","cost":"x"}"#,
        ),
        p(
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s","cost":1e3}"#,
        ),
        p(
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s","cost":18446744073709551615}"#,
        ),
        p("/v1/limit", r#"{"policies":[],"subject":"s"}"#),
        p(
            "/v1/limit",
            r#"{"policies":["fixed","fixed"],"subject":"s"}"#,
        ),
        p("/v1/limit", &huge_policies),
        p("/v1/limit", r#"{"policy":"nope","subject":"s"}"#),
        p("/v1/limit", r#"{"policy":"","subject":"s"}"#),
        p("/v1/limit", r#"{"policy":"fixed"}"#),
        p("/v1/limit", r#"{"policy":["fixed"],"subject":"s"}"#),
        p(
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s","action":"release"}"#,
        ),
    ]
}

fn hostile_primitives() -> Vec<Hostile> {
    let p = post;
    vec![
        p("/v1/quota", r#"{"quota":"nope"}"#),
        // An array is not an object, even when its items would fill the fields by position.
        p("/v1/quota", r#"["flash","u-arr"]"#),
        p("/v1/hit", r#"["plays",{"video":"a"}]"#),
        p("/v1/quota", r#"{"quota":""}"#),
        p("/v1/quota", r#"{"quota":"flash","action":"fill"}"#),
        p("/v1/once", r#"{"name":"welcome"}"#),
        p("/v1/once", r#"{"name":"nope","subject":"u"}"#),
        p(
            "/v1/once",
            r#"{"name":"welcome","subject":"u","at":"never"}"#,
        ),
        p(
            "/v1/unique",
            r#"{"name":"visitors","subject":"s","item":7}"#,
        ),
        p("/v1/unique", r#"{"name":"","subject":"s"}"#),
        p("/v1/pool", r#"{"pool":"coupons","items":"a"}"#),
        p("/v1/pool", r#"{"pool":"nope"}"#),
    ]
}

fn hostile_locks_and_batches() -> Vec<Hostile> {
    let p = post;
    vec![
        p("/v1/locks//acquire", r#"{"ttl_ms":1000}"#),
        p("/v1/locks/job:ttl_audit/acquire", r#"{"ttl_ms":1000}"#),
        p("/v1/locks/a/acquire", r#"{"ttl_ms":9223372036854775807}"#),
        p("/v1/locks/a/acquire", r#"{"ttl_ms":18446744073709551615}"#),
        p(
            "/v1/locks/a/extend",
            r#"{"ttl_ms":9223372036854775807,"token":"t"}"#,
        ),
        p("/v1/locks/a/acquire", r#"{"ttl_ms":0}"#),
        p("/v1/locks/a/acquire", r#"{"ttl_ms":1000,"wait_ms":60000}"#),
        p("/v1/locks/a/release", r#"{}"#),
        p("/v1/locks/a/explode", r#"{}"#),
        p("/v1/counters/nope/batch", r#"{"tuples":[]}"#),
        p("/v1/counters/plays/batch", "nope"),
    ]
}

fn hostile_reads() -> Vec<Hostile> {
    vec![
        ("GET", "/v1/hit".into(), String::new()),
        ("GET", "/v1/nothing-here".into(), String::new()),
        (
            "GET",
            "/v1/count?counter=nope&video=a".into(),
            String::new(),
        ),
        ("GET", "/v1/count?counter=plays".into(), String::new()),
        (
            "GET",
            "/v1/count?counter=plays&video=a&at=soon".into(),
            String::new(),
        ),
        (
            "GET",
            "/v1/counters/plays?video=a&last=x".into(),
            String::new(),
        ),
        (
            "GET",
            "/v1/counters/plays?video=a&last=5&window=current".into(),
            String::new(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_a_problem_and_bad_input_is_never_a_5xx() {
    let redis = LocalRedis::start(&[]).unwrap();
    let p = TallyProcess::start_command("serve", &config(&redis), "contract");
    wait_for("tally serve ready", Duration::from_secs(20), || {
        http::get(p.port, "/health/ready").is_some_and(|(code, _)| code == 200)
    })
    .await;
    let client = Client::new(Duration::from_secs(10));
    let cases = hostile();
    assert!(cases.len() >= 40);
    let mut wrong = Vec::new();
    for (method, path, body) in &cases {
        let answer = match *method {
            "GET" => client.get(p.port, path, &[]),
            _ => client.post(p.port, path, Some("application/json"), body),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
        let problem: Option<serde_json::Value> = serde_json::from_str(&answer.body).ok();
        let ok = (400..500).contains(&answer.status)
            && answer.header("content-type") == Some("application/problem+json")
            && problem.as_ref().is_some_and(|p| {
                p["status"] == answer.status
                    && p["title"].is_string()
                    && p["detail"].is_string()
                    && p["type"].is_string()
                    && p["request_id"].is_string()
            })
            // No internal text: Rust types, Redis errors, script hashes.
            && !["Body", "u64", "i64", "ERR ", "redis:", "script", "sha"]
                .iter()
                .any(|w| answer.body.contains(w));
        if !ok {
            let shown: String = body.chars().take(80).collect();
            wrong.push(format!(
                "{method} {path} {shown} -> {} {}",
                answer.status, answer.body
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {}:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    assert!(
        !p.log().contains("panicked"),
        "tally panicked:\n{}",
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_json_whatever_the_content_type_says() {
    let redis = LocalRedis::start(&[]).unwrap();
    let p = TallyProcess::start_command("serve", &config(&redis), "contract-ct");
    wait_for("tally serve ready", Duration::from_secs(20), || {
        http::get(p.port, "/health/ready").is_some_and(|(code, _)| code == 200)
    })
    .await;
    let client = Client::new(Duration::from_secs(10));
    let body = r#"{"counter":"plays","dimensions":{"video":"a"}}"#;
    // What `curl -d` sends, no content type at all, and JSON.
    for (i, content_type) in [
        Some("application/x-www-form-urlencoded"),
        None,
        Some("application/json"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = client.post(p.port, "/v1/hit", content_type, body).unwrap();
        assert_eq!(answer.status, 200, "{content_type:?}: {}", answer.body);
        let value: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(value["value"], i as i64 + 1, "{}", answer.body);
    }
    // A quota's peek answers its state in the words of a take: taken, size and left.
    let take = client.post(
        p.port,
        "/v1/quota",
        None,
        r#"{"quota":"flash","user":"u1"}"#,
    );
    assert_eq!(take.unwrap().status, 200);
    let peek = client
        .post(
            p.port,
            "/v1/quota",
            None,
            r#"{"quota":"flash","action":"peek"}"#,
        )
        .unwrap();
    let state: serde_json::Value = serde_json::from_str(&peek.body).unwrap();
    assert_eq!(
        state,
        serde_json::json!({"taken": 1, "size": 100, "left": 99}),
        "{}",
        peek.body
    );
}

/// Every 400 about one input names it in `field`, so a client can point at it: a lock's name,
/// a unique item, a lease token, and the query parameters `last`, `top` and `from`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_its_field() {
    let redis = LocalRedis::start(&[]).unwrap();
    let p = TallyProcess::start_command("serve", &config(&redis), "contract-field");
    wait_for("tally serve ready", Duration::from_secs(20), || {
        http::get(p.port, "/health/ready").is_some_and(|(code, _)| code == 200)
    })
    .await;
    let client = Client::new(Duration::from_secs(10));
    let long_name = "n".repeat(300);
    let long_item = "i".repeat(2000);
    let cases = [
        (
            "POST",
            format!("/v1/locks/{long_name}/acquire"),
            r#"{"ttl_ms":1000}"#.to_string(),
            "name",
        ),
        (
            "POST",
            "/v1/unique".to_string(),
            format!(r#"{{"name":"visitors","subject":"s","item":"{long_item}"}}"#),
            "item",
        ),
        (
            "POST",
            "/v1/locks/nightly/release".to_string(),
            "{}".to_string(),
            "token",
        ),
        (
            "GET",
            "/v1/counters/plays?video=a&last=abc".to_string(),
            String::new(),
            "last",
        ),
        (
            "GET",
            "/v1/counters/plays?video=a&last=0".to_string(),
            String::new(),
            "last",
        ),
        (
            "GET",
            "/v1/counters/plays?video=a&top=x".to_string(),
            String::new(),
            "top",
        ),
        (
            "GET",
            "/v1/counters/plays?video=a&from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z"
                .to_string(),
            String::new(),
            "from",
        ),
    ];
    let mut wrong = Vec::new();
    for (method, path, body, field) in &cases {
        let answer = match *method {
            "GET" => client.get(p.port, path, &[]),
            _ => client.post(p.port, path, Some("application/json"), body),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
        let problem: serde_json::Value = serde_json::from_str(&answer.body).unwrap_or_default();
        if answer.status != 400 || problem["field"] != *field {
            let shown: String = path.chars().take(60).collect();
            wrong.push(format!(
                "{method} {shown}: {} {}",
                answer.status, answer.body
            ));
        }
    }
    assert!(wrong.is_empty(), "no `field`:\n{}", wrong.join("\n"));
}
