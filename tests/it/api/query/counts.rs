//! Reading counters back: `tally key`, `tally query` and `GET /v1/count` agree with Redis.

use std::process::Command;
use std::time::Duration;

use crate::common::{counter, Harness};
use tally_testkit::http;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_query_and_http_count_agree_with_redis() {
    let mut h = Harness::new("query", 2);
    let mut config = h.config(
        "g-query",
        vec![counter(
            "flow",
            &["app_id", "device_id", "ip"],
            "flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::ZERO,
        )],
    );
    let port = tally_testkit::local_redis::free_port().unwrap();
    config.http.listen = format!("127.0.0.1:{port}");
    let at = chrono::Utc::now().timestamp_millis();
    for i in 0..7 {
        h.produce(
            i % 2,
            br#"{"app_id":"a1","device_id":"d:1","ip":"::1"}"#,
            Some(at),
        );
    }
    h.produce(
        0,
        br#"{"app_id":"a2","device_id":"d","ip":"1.2.3.4"}"#,
        Some(at),
    );
    h.flush_producer();
    let running = h.start(config.clone());
    h.wait_applied("g-query", Duration::from_secs(60)).await;

    let hour = chrono::DateTime::from_timestamp_millis(at)
        .unwrap()
        .format("%Y%m%d%H");
    let want_key = format!("flow:count:a1:d%3A1:%3A%3A1:{hour}");
    assert_eq!(h.dump("flow:count:a1:*").get(&want_key), Some(&7));

    // HTTP.
    let (status, body) = http::get(
        port,
        &format!("/v1/count?counter=flow&app_id=a1&device_id=d%3A1&ip=%3A%3A1&at={at}"),
    )
    .expect("http answer");
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["key"], want_key.as_str());
    assert_eq!(json["value"], 7);
    let (status, body) = http::get(port, "/v1/count?counter=flow&app_id=a1").expect("http answer");
    assert_eq!(status, 400, "missing dimensions are a client error: {body}");
    assert!(body.contains("device_id"), "{body}");
    let (status, _) = http::get(port, "/v1/count?counter=nope&app_id=a1").expect("http answer");
    assert_eq!(status, 400);
    running.stop().await;

    // CLI.
    let path = std::env::temp_dir().join(format!("tally-query-{}.toml", std::process::id()));
    std::fs::write(&path, config.to_toml()).unwrap();
    let run = |cmd: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args([cmd, "--config", path.to_str().unwrap(), "--counter", "flow"])
            .args([
                "--dim",
                "app_id=a1",
                "--dim",
                "device_id=d:1",
                "--dim",
                "ip=::1",
                "--at",
                &at.to_string(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(run("key"), want_key);
    assert_eq!(run("query"), format!("{want_key}\t7"));
    let _ = std::fs::remove_file(&path);
}
