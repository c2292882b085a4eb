//! A hit that Redis cannot take, deferred by its caller, becomes an event on the topic and is
//! counted exactly once by the stream path when Redis is back.

use std::time::Duration;

use crate::common::{accuracy, hourly, produce_batch, total, wait_for, Harness};
use tally_testkit::http;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_hits_are_counted_once_when_redis_returns() {
    let mut h = Harness::with_redis(
        "defer",
        2,
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut config = h.config("g-defer", hourly("df"));
    config.http.listen = format!("127.0.0.1:{port}");
    let running = h.start(config);
    produce_batch(&mut h, 0, 100);
    h.wait_applied("g-defer", Duration::from_secs(60)).await;
    assert_eq!(total(&h, "df:*"), 100);

    let hit = r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"},"on_redis_error":"defer"}"#;
    // With Redis up, a hit is counted in Redis at once.
    let a = http::post_json(port, "/v1/hit", hit).unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    h.redis.stop();
    let refused = http::post_json(
        port,
        "/v1/hit",
        r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"}}"#,
    )
    .unwrap();
    assert_eq!(
        refused.status, 503,
        "without defer, an error: {}",
        refused.body
    );
    for _ in 0..10 {
        let a = http::post_json(port, "/v1/hit", hit).unwrap();
        assert_eq!(a.status, 202, "{}", a.body);
        assert!(a.body.contains("\"deferred\":true"), "{}", a.body);
    }
    assert!(running.metrics.request.deferred.get() == 10);
    h.redis.restart().unwrap();
    wait_for("the deferred hits counted", Duration::from_secs(60), || {
        total(&h, "df:*") >= 111
    })
    .await;
    // Settled: nothing counted twice.
    running.stop().await;
    assert_eq!(total(&h, "df:*"), 111);
    let one: i64 = redis::cmd("GET")
        .arg(format!(
            "df:a1:d1:{}",
            chrono::Utc::now().format("%Y%m%d%H")
        ))
        .query(&mut h.conn())
        .unwrap();
    // 5 produced events (i = 1, 21, 41, 61, 81), the hit counted in Redis, the 10 deferred.
    assert_eq!(one, 16);
}

/// A hit whose answer times out may have run (here: Redis is stopped with SIGSTOP and runs it
/// when continued). It must not be deferred too (that counted it twice): the caller gets a 503
/// "outcome unknown", and the hit is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_that_timed_out_is_not_deferred_and_counts_once() {
    let mut h = Harness::new("defer-slow", 1);
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut config = h.config("g-defer-slow", hourly("ds"));
    config.http.listen = format!("127.0.0.1:{port}");
    config.redis.response_timeout = Duration::from_millis(300);
    let running = h.start(config);
    produce_batch(&mut h, 0, 20);
    h.wait_applied("g-defer-slow", Duration::from_secs(60))
        .await;

    let hit = r#"{"counter":"flow","dimensions":{"app_id":"a9","device_id":"slow"},"on_redis_error":"defer"}"#;
    let first = http::post_json(port, "/v1/hit", hit).unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    // Redis stops answering (the hit waits in its socket) for longer than the 300 ms response
    // timeout, then runs what it was sent.
    let pid = h.redis.pid().expect("redis-server runs").to_string();
    let signal = |s: &str| {
        let ok = std::process::Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    signal("-STOP");
    let slow = tokio::task::spawn_blocking(move || http::post_json(port, "/v1/hit", hit));
    let slow = slow.await.unwrap();
    signal("-CONT");
    let slow = slow.unwrap();
    wait_for("the delayed hit runs", Duration::from_secs(30), || {
        total(&h, "ds:a9:slow:*") >= 2
    })
    .await;
    // A marker after anything the hit may have put on the topic: once it is counted, the stream
    // path has applied everything before it.
    h.produce(0, br#"{"app_id":"marker","device_id":"m"}"#, None);
    h.flush_producer();
    wait_for("the marker counted", Duration::from_secs(60), || {
        total(&h, "ds:marker:*") == 1
    })
    .await;
    running.stop().await;
    assert_eq!(total(&h, "ds:a9:slow:*"), 2, "counted once: {}", slow.body);
    assert_eq!(slow.status, 503, "{}", slow.body);
    assert!(slow.body.contains("outcome-unknown"), "{}", slow.body);
    assert!(
        slow.body
            .contains("did not answer within redis.response_timeout"),
        "{}",
        slow.body
    );
    assert!(slow.body.contains("idempotency_key"), "{}", slow.body);
}

/// A hit whose reply is lost after Redis ran it (the fault proxy swallows the reply and resets
/// the connection): the client never retries the script and the hit is not deferred to Kafka
/// either; the caller gets a 503 "outcome unknown" naming the lost connection, and Redis holds
/// the hit exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_whose_reply_is_lost_runs_once_and_is_not_deferred() {
    let mut h = Harness::new("defer-lost", 1);
    let upstream: std::net::SocketAddr = h.redis.url()["redis://".len()..].parse().unwrap();
    let proxy = tally_testkit::proxy::Proxy::start(upstream).unwrap();
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut config = h.config("g-defer-lost", hourly("dl"));
    config.http.listen = format!("127.0.0.1:{port}");
    config.redis.url = proxy.url("redis");
    let running = h.start(config);
    produce_batch(&mut h, 0, 20);
    h.wait_applied("g-defer-lost", Duration::from_secs(60))
        .await;

    let hit = r#"{"counter":"flow","dimensions":{"app_id":"a9","device_id":"lost"},"on_redis_error":"defer"}"#;
    let post =
        move || tokio::task::spawn_blocking(move || http::post_json(port, "/v1/hit", hit).unwrap());
    let first = post().await.unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    let mut ran = 1;
    // The next reply from Redis on any connection is swallowed. The stream path shares the
    // proxy (a probe's PING may take the fault instead): then the hit answered normally, and
    // the fault is armed again.
    let lost = loop {
        proxy.drop_next_reply();
        let answer = post().await.unwrap();
        ran += 1;
        if answer.status != 200 {
            break answer;
        }
        assert!(ran < 6, "the lost reply never fell on a hit");
    };
    assert_eq!(lost.status, 503, "{}", lost.body);
    assert!(lost.body.contains("outcome-unknown"), "{}", lost.body);
    assert!(
        lost.body.contains("connection to Redis was lost"),
        "{}",
        lost.body
    );
    // The next hit is answered on a new connection.
    let after = post().await.unwrap();
    assert_eq!(after.status, 200, "{}", after.body);
    ran += 1;
    // A marker after anything a hit may have put on the topic: once it is counted, the stream
    // path has applied everything before it.
    h.produce(0, br#"{"app_id":"marker","device_id":"m"}"#, None);
    h.flush_producer();
    wait_for("the marker counted", Duration::from_secs(60), || {
        total(&h, "dl:marker:*") == 1
    })
    .await;
    assert_eq!(
        running.metrics.request.deferred.get(),
        0,
        "nothing deferred"
    );
    running.stop().await;
    assert_eq!(
        total(&h, "dl:a9:lost:*"),
        ran,
        "every hit that reached Redis counted once, the lost reply's included"
    );
    accuracy(
        "hit (on_redis_error = defer)",
        "reply lost after the script ran (connection reset)",
        "none",
        format!("{ran} hits sent, {ran} counted, answered 503 outcome-unknown"),
        format!("{ran}"),
        0,
        0,
    );
}
