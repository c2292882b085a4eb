//! Window results from a Redis Cluster: the publisher finds a counter's keys with SCAN on every
//! primary, reads them where their slots live (string keys, hash storage's shard hashes, a
//! leaderboard's sorted sets) and keeps its progress, snapshots and published values in keys of
//! their own slots. Three primaries, keys spread over eight shards; every key of the closed
//! window is published once with its truth, then a late event is corrected. tally in-process on
//! librdkafka's mock broker.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use tally::config::{CounterConfig, CounterKind, OutputConfig, RedisMode, Storage};
use tally_testkit::local_redis::LocalCluster;

use crate::common::{counter, wait_for, Harness};
use crate::stream::window::results::minute_text;
use crate::stream::window::retry::read;

const MIN: i64 = 60_000;
const OUT: &str = "wc-out";
const APPS: i64 = 40;
const WAIT: Duration = Duration::from_secs(60);

fn with_output(mut c: CounterConfig) -> CounterConfig {
    c.output = Some(OutputConfig {
        idle_timeout: Duration::from_secs(2),
        ..OutputConfig::to(OUT)
    });
    c
}

/// A count in string keys, a count in hash storage, a leaderboard of devices per app.
fn counters() -> Vec<CounterConfig> {
    let c = |name: &str| {
        counter(
            name,
            &["app"],
            &format!("wc:{name}:{{app}}:{{yyyyMMddHHmm}}"),
            Duration::from_secs(60),
            "UTC",
            Duration::from_secs(86_400),
        )
    };
    let mut hashed = c("hashed");
    hashed.storage = Storage::Hash;
    hashed.hash_key = Some("wc:h:{yyyyMMddHHmm}".into());
    let mut board = c("board");
    board.kind = CounterKind::Leaderboard;
    board.member = Some("dev".into());
    [c("hits"), hashed, board]
        .into_iter()
        .map(with_output)
        .collect()
}

/// App `i` has `i + 1` events in minute 0 (`base`), from devices `d0`..`d2` (`d0` the most).
fn produce_minute(h: &mut Harness, base: i64) {
    for i in 0..APPS {
        for j in 0..=i {
            let payload = format!(r#"{{"app":"a{i}","dev":"d{}"}}"#, j % 3);
            h.produce((i % 2) as i32, payload.as_bytes(), Some(base + j * 100));
        }
    }
    h.flush_producer();
}

/// The truth of app `i`'s key of `counter` after `extra` more events of device `d1`.
fn truth(counter: &str, i: i64, extra: i64) -> (i64, Option<Value>) {
    let n = i + 1;
    if counter != "board" {
        return (n + extra, None);
    }
    let mut scores: Vec<(String, i64)> = (0..3.min(n))
        .map(|d| {
            (
                format!("d{d}"),
                (n - d + 2) / 3 + if d == 1 { extra } else { 0 },
            )
        })
        .collect();
    scores.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let top = scores
        .into_iter()
        .map(|(m, s)| json!({"member": m, "score": s}))
        .collect();
    (n.min(3), Some(Value::Array(top)))
}

/// Per record key: its records' (value, top, correction), in order.
type Seen = BTreeMap<String, Vec<(i64, Value, bool)>>;

fn seen(bootstrap: &str) -> Seen {
    let mut out = Seen::new();
    for (_, key, v) in read(bootstrap, OUT, &[0]) {
        let value = v["value"].as_i64().unwrap();
        let correction = v["correction"] == Value::Bool(true);
        out.entry(key)
            .or_default()
            .push((value, v["top"].clone(), correction));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_publishes_every_key_of_its_primaries_once_then_corrects() {
    let cluster = LocalCluster::start(3, 0).expect("cluster");
    let mut h = Harness::new("wc-in", 2);
    h.mock.create_topic(OUT, 1, 1).unwrap();
    let bootstrap = h.mock.bootstrap_servers();
    let mut config = h.config("wc", counters());
    config.redis.mode = RedisMode::Cluster;
    config.redis.nodes = cluster.urls();
    config.redis.cluster_shards = 8;
    config.jobs.publish.interval = Duration::from_millis(100);
    let tally = h.start(config);

    // Minute 0, then an event in minute 1 on both partitions: minute 0 closes.
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 30 * MIN;
    produce_minute(&mut h, base);
    for p in 0..2 {
        h.produce(p, br#"{"app":"closer","dev":"d0"}"#, Some(base + MIN + 1));
    }
    h.flush_producer();
    let minute = minute_text(base);
    let names = ["hits", "hashed", "board"];
    let key = |c: &str, i: i64| format!("wc:{c}:a{i}:{minute}");
    let mut got = Seen::new();
    wait_for("every key of minute 0 published", WAIT, || {
        got = seen(&bootstrap);
        got.len() as i64 == 3 * APPS
    })
    .await;
    for c in names {
        for i in 0..APPS {
            let (value, top) = truth(c, i, 0);
            let records = &got[&key(c, i)];
            assert!(
                records
                    .iter()
                    .all(|r| r.0 == value && r.1 == top.clone().unwrap_or(Value::Null) && !r.2),
                "{}: every record final with the truth {value} {top:?}: {records:?}",
                key(c, i)
            );
        }
    }
    // The keys live on more than one primary: the walk covered several.
    let holding = cluster
        .primaries()
        .into_iter()
        .filter(|port| {
            let url = format!("redis://127.0.0.1:{port}");
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let keys: Vec<String> = redis::cmd("KEYS").arg("wc:*").query(&mut conn).unwrap();
            !keys.is_empty()
        })
        .count();
    assert!(holding >= 2, "the counters' keys on {holding} primaries");

    // Late events of d1 in minute 0 for app a5, and a close of minute 1 (the publisher reads the
    // published windows again): a correction of each of the app's keys.
    for _ in 0..4 {
        h.produce(1, br#"{"app":"a5","dev":"d1"}"#, Some(base + 30_000));
    }
    for p in 0..2 {
        h.produce(
            p,
            br#"{"app":"closer","dev":"d0"}"#,
            Some(base + 2 * MIN + 1),
        );
    }
    h.flush_producer();
    wait_for("the late change corrected", WAIT, || {
        got = seen(&bootstrap);
        names.iter().all(|c| got[&key(c, 5)].iter().any(|r| r.2))
    })
    .await;
    for c in names {
        let (value, top) = truth(c, 5, 4);
        let last = got[&key(c, 5)].last().unwrap().clone();
        assert_eq!(
            last,
            (value, top.unwrap_or(Value::Null), true),
            "{c}: the correction is the new truth"
        );
    }
    tally.stop().await;
}
