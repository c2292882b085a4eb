//! Readiness follows Kafka: `/health/ready` turns 503 once no broker has been reachable for
//! `kafka.unreachable_after`, says why, and turns 200 again when the broker is back.

use std::time::{Duration, Instant};

use crate::common::{counter, wait_for, Harness};
use tally_testkit::http;

/// `/health/ready` off the blocking pool: status and body.
async fn ready(port: u16) -> Option<(u16, String)> {
    tokio::task::spawn_blocking(move || http::get(port, "/health/ready"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_the_only_broker_is_down() {
    let mut h = Harness::new("ready-kafka", 2);
    let mut config = h.config(
        "g-ready",
        vec![counter(
            "flow",
            &["app_id"],
            "rk:{app_id}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::ZERO,
        )],
    );
    // The harness reports statistics every 500 ms.
    let unreachable_after = Duration::from_secs(3);
    config.kafka.unreachable_after = unreachable_after;
    config
        .kafka
        .properties
        .insert("reconnect.backoff.max.ms".into(), "1000".into());
    let port = tally_testkit::local_redis::free_port().unwrap();
    config.http.listen = format!("127.0.0.1:{port}");
    let running = h.start(config);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = ready(port).await;
        if answer.as_ref().is_some_and(|r| r.0 == 200) {
            assert_eq!(answer.unwrap().1, "kafka=true redis=true\n");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {answer:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    h.mock.broker_down(1).expect("broker down");
    let down = Instant::now();
    let answer = loop {
        let answer = ready(port).await.expect("http answers");
        if answer.0 == 503 {
            break answer;
        }
        assert!(
            down.elapsed() < unreachable_after + Duration::from_secs(5),
            "still ready {:?} after the broker went down: {answer:?}",
            down.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = down.elapsed();
    // Not before the broker has been gone for unreachable_after (less one statistics report).
    assert!(
        took >= unreachable_after - Duration::from_millis(600),
        "not ready after only {took:?}"
    );
    assert!(
        answer
            .1
            .starts_with("kafka=false redis=true\nkafka: no broker reachable for"),
        "{answer:?}"
    );
    eprintln!("not ready {took:?} after the broker went down");

    h.mock.broker_up(1).expect("broker up");
    let up = Instant::now();
    wait_for("ready again", Duration::from_secs(30), || {
        http::get(port, "/health/ready").is_some_and(|r| r.0 == 200)
    })
    .await;
    eprintln!("ready {:?} after the broker came back", up.elapsed());

    // And counting goes on.
    let at = chrono::Utc::now().timestamp_millis();
    for i in 0..10 {
        h.produce(i % 2, br#"{"app_id":"a"}"#, Some(at));
    }
    h.flush_producer();
    h.wait_applied("g-ready", Duration::from_secs(60)).await;
    assert_eq!(h.dump("rk:*").values().sum::<i64>(), 10);
    running.stop().await;
}
