//! A closed window's re-publish carries the values of its first attempt (the write-ahead
//! snapshot), even when a late event lands between a failed attempt and the retry: the output
//! topic has two partitions on two brokers, the second broker is down while the window closes
//! (its records time out: the attempt fails after the first partition stored some), a late event
//! changes a key whose final record is already stored, then the broker comes back. Every final
//! record of a key must carry one value, the one of the first attempt, and the late change comes
//! as a correction. tally in-process on librdkafka's mock cluster and a real `redis-server`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCoordinator;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use tally::config::OutputConfig;

use crate::common::{counter, wait_for, Harness};

const MIN: i64 = 60_000;
const OUT: &str = "wr-out";
const APPS: i64 = 24;

/// Every record of `partitions` of `topic` (partition, key, JSON value), per partition in order.
pub(crate) fn read(bootstrap: &str, topic: &str, partitions: &[i32]) -> Vec<(i32, String, Value)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "wr-reader")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut want = 0;
    for &p in partitions {
        let (_, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        want += high;
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (got.len() as i64) < want && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap();
            got.push((m.partition(), key, value));
        }
    }
    got
}

fn value(conn: &mut redis::Connection, key: &str) -> Option<i64> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_failed_publish_produces_the_first_attempts_values_then_corrects() {
    let mut h = Harness::with_brokers("wr-in", 1, &[], 2);
    let bootstrap = h.mock.bootstrap_servers();
    h.mock.partition_leader("wr-in", 0, Some(1)).unwrap();
    h.mock.create_topic(OUT, 2, 1).unwrap();
    h.mock.partition_leader(OUT, 0, Some(1)).unwrap();
    h.mock.partition_leader(OUT, 1, Some(2)).unwrap();
    h.mock
        .coordinator(MockCoordinator::Group("wr".into()), 1)
        .unwrap();
    let config = config(&h);
    let tally = h.start(config);

    // Minute 0: app i gets i + 1 events.
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 30 * MIN;
    for i in 0..APPS {
        for j in 0..=i {
            let payload = format!(r#"{{"app":"a{i}"}}"#);
            h.produce(0, payload.as_bytes(), Some(base + j * 100));
        }
    }
    h.flush_producer();
    h.wait_applied("wr", Duration::from_secs(30)).await;

    // Broker 2 down, then an event in minute 1 closes minute 0: the records of output
    // partition 0 are stored, those of partition 1 time out, the attempt fails.
    h.mock.broker_down(2).unwrap();
    h.produce(0, br#"{"app":"closer"}"#, Some(base + MIN + 1));
    h.flush_producer();
    wait_for("a final record stored", Duration::from_secs(30), || {
        !read(&bootstrap, OUT, &[0]).is_empty()
    })
    .await;
    let (_, late_key, first) = read(&bootstrap, OUT, &[0]).remove(0);
    let v0 = first["value"].as_i64().unwrap();

    // A late event to that key, applied by the stream before the retry can succeed.
    let app = first["dimensions"]["app"].as_str().unwrap().to_string();
    let payload = format!(r#"{{"app":"{app}"}}"#);
    h.produce(0, payload.as_bytes(), Some(base + 30_000));
    h.flush_producer();
    let mut conn = h.conn();
    wait_for("the late event applied", Duration::from_secs(30), || {
        value(&mut conn, &late_key) == Some(v0 + 1)
    })
    .await;
    // The first attempt failed (a retry started) before the broker comes back.
    let again = tally
        .metrics
        .publish
        .republished
        .with_label_values(&["hits"]);
    wait_for("a retry", Duration::from_secs(30), || again.get() >= 1).await;
    h.mock.broker_up(2).unwrap();

    // Every key of minute 0 published; the late key's last record is the new truth.
    let minute = late_key.rsplit(':').next().unwrap().to_string();
    let mut records = Vec::new();
    wait_for("every key published", Duration::from_secs(60), || {
        records = read(&bootstrap, OUT, &[0, 1]);
        let keys: BTreeMap<&str, i64> = records
            .iter()
            .map(|(_, k, v)| (k.as_str(), v["value"].as_i64().unwrap()))
            .collect();
        keys.len() as i64 == APPS && keys.get(late_key.as_str()) == Some(&(v0 + 1))
    })
    .await;
    assert!(
        records.iter().any(|(p, _, _)| *p == 1),
        "some records went to the partition that was down"
    );
    finals_carry_the_first_attempt_and_the_late_key_is_corrected(&records, &late_key, &minute, v0);
    the_snapshot_expires_with_the_window(&mut conn, &late_key);
    tally.stop().await;
}

/// `hits` per app and minute, published to `OUT` (records closed after 2 s idle), the publisher
/// passing every 100 ms with a 1 s send timeout.
fn config(h: &Harness) -> tally::config::Config {
    let mut hits = counter(
        "hits",
        &["app"],
        // Record keys that start with `@`, as the publisher's own fields in its hash do.
        "@wr:{app}:{yyyyMMddHHmm}",
        Duration::from_secs(60),
        "UTC",
        Duration::from_secs(86_400),
    );
    hits.output = Some(OutputConfig {
        idle_timeout: Duration::from_secs(2),
        ..OutputConfig::to(OUT)
    });
    let mut config = h.config("wr", vec![hits]);
    config.jobs.publish.interval = Duration::from_millis(100);
    config.jobs.publish.send_timeout = Duration::from_secs(1);
    config
}

/// Every final record carries the first attempt's value (app i: i + 1); the late key's last
/// record is a correction with the new value.
fn finals_carry_the_first_attempt_and_the_late_key_is_corrected(
    records: &[(i32, String, Value)],
    late_key: &str,
    minute: &str,
    v0: i64,
) {
    let mut finals: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (_, key, v) in records {
        if v["correction"] == Value::Bool(false) {
            finals
                .entry(key)
                .or_default()
                .push(v["value"].as_i64().unwrap());
        }
    }
    for i in 0..APPS {
        let key = format!("@wr:a{i}:{minute}");
        let values = finals.get(key.as_str()).cloned().unwrap_or_default();
        assert!(
            !values.is_empty() && values.iter().all(|&v| v == i + 1),
            "{key}: every final record carries the first attempt's value {}: {values:?}",
            i + 1
        );
    }
    let late: Vec<&Value> = records
        .iter()
        .filter(|(_, k, _)| *k == late_key)
        .map(|(_, _, v)| v)
        .collect();
    let last = late.last().unwrap();
    assert_eq!(last["value"], v0 + 1, "{late:#?}");
    assert_eq!(
        last["correction"], true,
        "the late change is a correction: {late:#?}"
    );
}

/// The window's snapshot (its published values) expires with the window's keys.
fn the_snapshot_expires_with_the_window(conn: &mut redis::Connection, late_key: &str) {
    let hashes: Vec<String> = redis::cmd("KEYS")
        .arg("tally:values:*")
        .query(conn)
        .unwrap();
    assert_eq!(hashes.len(), 1, "{hashes:?}");
    let ttl: i64 = redis::cmd("PTTL").arg(&hashes[0]).query(conn).unwrap();
    let stored: i64 = redis::cmd("PTTL").arg(late_key).query(conn).unwrap();
    assert!(
        ttl > 0 && ttl + 5_000 >= stored,
        "{ttl} ms, the key {stored} ms"
    );
}
