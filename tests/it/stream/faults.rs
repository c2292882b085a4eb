//! Restarts, Redis outages, NOSCRIPT and bad input: nothing accepted is lost or counted twice.

use crate::common;
use tally_testkit::http;

use std::time::Duration;

use crate::common::{hourly, produce_batch, total, wait_for, Harness};
use chrono::Utc;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Kafka's committed offsets for `group`, read by a separate consumer.
fn committed(h: &Harness, group: &str) -> Vec<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", h.mock.bootstrap_servers())
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..h.partitions {
        tpl.add_partition(&h.topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    (0..h.partitions)
        .map(
            |p| match got.find_partition(&h.topic, p).unwrap().offset() {
                Offset::Offset(n) => n,
                _ => -1,
            },
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_consumer_resumes_and_loses_nothing() {
    let mut h = Harness::new("restart", 3);
    let config = h.config("g-restart", hourly("rs"));
    produce_batch(&mut h, 0, 3_000);
    let first = h.start(config.clone());
    h.wait_applied("g-restart", Duration::from_secs(60)).await;
    first.stop().await;
    assert_eq!(total(&h, "rs:*"), 3_000);
    assert_eq!(
        committed(&h, "g-restart"),
        h.produced,
        "kafka commit follows what landed"
    );

    produce_batch(&mut h, 3_000, 2_000);
    let second = h.start(config);
    h.wait_applied("g-restart", Duration::from_secs(60)).await;
    let consumed = second.metrics.consumer.messages_consumed.clone();
    second.stop().await;
    assert_eq!(total(&h, "rs:*"), 5_000, "every event counted exactly once");
    assert_eq!(
        consumed.get(),
        2_000,
        "the restart read only the new messages"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_loses_nothing_and_commits_nothing_unlanded() {
    // AOF with fsync always: what Redis acknowledged survives its restart.
    let mut h = Harness::with_redis(
        "outage",
        2,
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let config = h.config("g-outage", hourly("out"));
    let running = h.start(config);
    produce_batch(&mut h, 0, 2_000);
    h.wait_applied("g-outage", Duration::from_secs(60)).await;
    let landed = h.produced.clone();

    h.redis.stop();
    produce_batch(&mut h, 2_000, 3_000);
    let m = running.metrics.clone();
    wait_for("redis errors", Duration::from_secs(20), || {
        m.redis.redis_retries.get() >= 2
    })
    .await;
    // While Redis is down, nothing past what landed may be committed.
    let during = committed(&h, "g-outage");
    for (p, (&c, &l)) in during.iter().zip(&landed).enumerate() {
        assert!(c <= l, "partition {p}: committed {c} past landed {l}");
    }

    h.redis.restart().unwrap();
    h.wait_applied("g-outage", Duration::from_secs(60)).await;
    running.stop().await;
    assert_eq!(total(&h, "out:*"), 5_000);
    assert_eq!(committed(&h, "g-outage"), h.produced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_during_a_run_recovers() {
    let mut h = Harness::new("noscript", 2);
    let config = h.config("g-noscript", hourly("ns"));
    let running = h.start(config);
    produce_batch(&mut h, 0, 1_000);
    h.wait_applied("g-noscript", Duration::from_secs(60)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut h.conn())
        .unwrap();
    produce_batch(&mut h, 1_000, 1_000);
    h.wait_applied("g-noscript", Duration::from_secs(60)).await;
    let reloads = running.metrics.redis.noscript_reloads.get();
    running.stop().await;
    assert!(reloads >= 1, "NOSCRIPT was seen and the script reloaded");
    assert_eq!(total(&h, "ns:*"), 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_counted_by_reason_and_the_stream_continues() {
    let mut h = Harness::new("bad", 1);
    let mut config = h.config("g-bad", hourly("bad"));
    config.decode.max_message_bytes = 200;
    let now = Some(Utc::now().timestamp_millis());
    let big = format!(r#"{{"app_id":"{}","device_id":"d"}}"#, "x".repeat(300));
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("not_json", b"hello".to_vec()),
        ("not_json", b"[1,2,3]".to_vec()),
        (
            "not_utf8",
            b"{\"app_id\":\"\xc3\x28\",\"device_id\":\"d\"}".to_vec(),
        ),
        ("missing_field", br#"{"app_id":"a"}"#.to_vec()),
        (
            "wrong_type",
            br#"{"app_id":{"x":1},"device_id":"d"}"#.to_vec(),
        ),
        ("too_large", big.into_bytes()),
        ("empty", Vec::new()),
    ];
    for round in 0..3 {
        for (_, payload) in &bad {
            h.produce(0, payload, now);
        }
        for i in 0..10 {
            h.produce(
                0,
                format!(r#"{{"app_id":"ok","device_id":"d{round}{i}"}}"#).as_bytes(),
                now,
            );
        }
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-bad", Duration::from_secs(60)).await;
    let m = running.metrics.clone();
    running.stop().await;
    assert_eq!(total(&h, "bad:*"), 30);
    for reason in [
        "not_json",
        "not_utf8",
        "missing_field",
        "wrong_type",
        "too_large",
        "empty",
    ] {
        let want = 3 * bad.iter().filter(|(r, _)| *r == reason).count() as u64;
        assert_eq!(
            crate::common::decode_errors(&m, reason),
            want,
            "reason {reason}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_pauses_while_redis_is_down_and_readiness_follows() {
    let mut h = Harness::with_redis(
        "backpressure",
        2,
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let mut config = h.config("g-bp", hourly("bp"));
    // Tiny bounds: a stuck flush of a few hundred keys already passes them.
    config.flush.max_keys = 50;
    config.flush.max_pending_keys = 200;
    config.flush.max_keys_per_call = 50;
    // One lane: the bound checked below is a lane's (each lane may overshoot by one batch).
    config.kafka.consumers = tally::config::Consumers::Count(1);
    let port = tally_testkit::local_redis::free_port().unwrap();
    config.http.listen = format!("127.0.0.1:{port}");
    let running = h.start(config);
    let m = running.metrics.clone();
    wait_for("ready", Duration::from_secs(30), || {
        http::get(port, "/health/ready").is_some_and(|r| r.0 == 200)
    })
    .await;
    assert_eq!(http::get(port, "/health/live").map(|r| r.0), Some(200));

    h.redis.stop();
    let now = Utc::now().timestamp_millis();
    // Many distinct keys, so pending keys pass max_pending_keys while the flush cannot land.
    for i in 0..5_000 {
        h.produce(
            i % 2,
            format!(r#"{{"app_id":"a{i}","device_id":"d"}}"#).as_bytes(),
            Some(now),
        );
    }
    h.flush_producer();
    wait_for("backpressure engaged", Duration::from_secs(30), || {
        m.consumer.backpressure_paused.get() == 1
    })
    .await;
    wait_for(
        "not ready while redis is down",
        Duration::from_secs(30),
        || http::get(port, "/health/ready").is_some_and(|r| r.0 == 503),
    )
    .await;
    // Paused: consumption stops well short of the 5,000 messages produced.
    let consumed = m.consumer.messages_consumed.get();
    let pending = m.aggregate.pending_keys.get();
    assert!(consumed < 5_000, "consumed {consumed} while paused");
    assert!(
        pending as usize <= 200 + 50 + 2,
        "pending {pending} bounded by max_pending_keys + one batch"
    );

    h.redis.restart().unwrap();
    h.wait_applied("g-bp", Duration::from_secs(60)).await;
    wait_for("resumed", Duration::from_secs(30), || {
        m.consumer.backpressure_paused.get() == 0
    })
    .await;
    wait_for("ready again", Duration::from_secs(30), || {
        http::get(port, "/health/ready").is_some_and(|r| r.0 == 200)
    })
    .await;
    running.stop().await;
    assert_eq!(total(&h, "bp:*"), 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_messages_go_to_the_dead_letter_topic_with_reasons() {
    let mut h = Harness::new("dlq-src", 1);
    h.mock.create_topic("dlq", 1, 1).unwrap();
    let mut config = h.config("g-dlq", hourly("dlq"));
    config.decode.dead_letter_topic = Some("dlq".into());
    let now = Some(Utc::now().timestamp_millis());
    let bad: Vec<(&[u8], &str)> = vec![
        (b"nope", "not_json"),
        (br#"{"app_id":"a"}"#, "missing_field"),
        (b"\xff\xfe", "not_utf8"),
    ];
    let mut offsets = Vec::new();
    for (i, (payload, _)) in bad.iter().enumerate() {
        h.produce(0, br#"{"app_id":"a","device_id":"d"}"#, now);
        offsets.push(2 * i as i64 + 1);
        h.produce(0, payload, now);
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-dlq", Duration::from_secs(60)).await;
    let m = running.metrics.clone();
    wait_for("dead letters delivered", Duration::from_secs(30), || {
        m.decode.dead_letters.get() == 3
    })
    .await;
    running.stop().await;
    assert_eq!(total(&h, "dlq:*"), 3);

    let got = common::dead_letters::read(&h, "dlq", 3, Duration::from_secs(30));
    assert_eq!(got.len(), 3, "{got:?}");
    for (i, (payload, reason)) in bad.iter().enumerate() {
        let offset = offsets[i].to_string();
        assert_eq!(got[i].payload, payload.to_vec());
        assert_eq!(got[i].header("tally-reason"), Some(*reason));
        assert_eq!(got[i].header("tally-source-offset"), Some(offset.as_str()));
        assert_eq!(got[i].header("tally-source-topic"), Some("dlq-src"));
    }
}

/// Partitions assigned while Redis is down: their fences are read again and again until Redis
/// answers (within the connect + response timeouts), rather than the partitions being parked
/// after one failed read and retried only every 5 s. A rebalance during a cluster failover hit
/// this: counting resumed seconds after the new primary took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_read_again_until_redis_answers() {
    let mut h = Harness::with_redis("init-retry", 2, &[]);
    let mut config = h.config("g-init", hourly("ir"));
    // The fence read's deadline is connect + response timeout: long enough to outlast the stop.
    config.redis.connect_timeout = Duration::from_secs(1);
    config.redis.response_timeout = Duration::from_secs(9);
    // One lane: a second one joining later would add a rebalance to the measured time.
    config.kafka.consumers = tally::config::Consumers::Count(1);
    let now = Utc::now().timestamp_millis();
    for i in 0..10 {
        h.produce(i % 2, br#"{"app_id":"a","device_id":"d"}"#, Some(now));
    }
    h.flush_producer();
    h.redis.stop();
    let running = h.start(config);
    let refused = running
        .metrics
        .redis
        .redis_errors
        .with_label_values(&["connect"]);
    // Three refused reads: retried (a parked partition would be tried once per 5 s).
    wait_for("fence reads refused", Duration::from_secs(30), || {
        refused.get() >= 3
    })
    .await;
    h.redis.restart().unwrap();
    let restarted = std::time::Instant::now();
    h.wait_applied("g-init", Duration::from_secs(30)).await;
    let took = restarted.elapsed();
    eprintln!("counted {took:?} after redis came back");
    running.stop().await;
    assert_eq!(total(&h, "ir:*"), 10);
    assert!(
        took < Duration::from_millis(2500),
        "counted {took:?} after redis came back (parked partitions wait up to 5 s)"
    );
}
