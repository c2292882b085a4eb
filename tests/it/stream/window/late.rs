//! `late = "drop"`: once a window is published its records are final. Late events into it
//! (within retention) are counted in Redis, and the publisher produces no correction: it counts
//! the changed keys (`tally_publish_late_dropped_total`) once, and writes each to the late topic
//! as the correction it would have been, with headers saying why. With `late = "correct"` (the
//! default, what main did) the same events produce corrections in the output topic, which this
//! test refuses. tally in-process on librdkafka's mock cluster and a real `redis-server`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use tally::config::{OutputConfig, OutputLate};

use crate::common::{counter, wait_for, Harness};

const MIN: i64 = 60_000;
const OUT: &str = "wl-out";
const LATE: &str = "wl-late";

/// One record: key, JSON value (None: a tombstone), headers.
pub(crate) struct Rec {
    pub key: String,
    pub value: Option<Value>,
    pub headers: BTreeMap<String, String>,
}

/// Every record of partition 0 of `topic`, in order.
pub(crate) fn read_all(bootstrap: &str, topic: &str) -> Vec<Rec> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "wl-reader")
        .create()
        .unwrap();
    let (_, high) = c
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (got.len() as i64) < high && Instant::now() < deadline {
        let Some(Ok(m)) = c.poll(Duration::from_millis(100)) else {
            continue;
        };
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let v = String::from_utf8_lossy(h.value.unwrap_or_default());
                        (h.key.to_string(), v.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        got.push(Rec {
            key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
            value: m.payload().map(|p| serde_json::from_slice(p).unwrap()),
            headers,
        });
    }
    got
}

fn value(conn: &mut redis::Connection, key: &str) -> Option<i64> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

/// App `a{i}` gets `i + 1` events at `at`.
fn produce_apps(h: &mut Harness, apps: i64, at: i64) {
    for i in 0..apps {
        for _ in 0..=i {
            let payload = format!(r#"{{"app":"a{i}"}}"#);
            h.produce(0, payload.as_bytes(), Some(at));
        }
    }
    h.flush_producer();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_late_changes_leave_the_published_window_final_and_go_to_the_late_topic() {
    let mut h = Harness::new("wl-in", 1);
    let bootstrap = h.mock.bootstrap_servers();
    h.mock.create_topic(OUT, 1, 1).unwrap();
    h.mock.create_topic(LATE, 1, 1).unwrap();
    let config = config(&h);
    let tally = h.start(config);

    // Minute 0: apps a0..a4; an event in minute 1 closes it.
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 30 * MIN;
    produce_apps(&mut h, 5, base + 10);
    h.produce(0, br#"{"app":"closer"}"#, Some(base + MIN + 1));
    h.flush_producer();
    wait_for("minute 0 published", Duration::from_secs(60), || {
        read_all(&bootstrap, OUT).len() >= 5
    })
    .await;
    let minute = chrono::DateTime::from_timestamp_millis(base)
        .unwrap()
        .format("%Y%m%d%H%M")
        .to_string();

    // Late events into minute 0: two keys change, one appears.
    let late = [r#"{"app":"a0"}"#, r#"{"app":"a0"}"#, r#"{"app":"a1"}"#];
    for payload in late.iter().chain([&r#"{"app":"anew"}"#]) {
        h.produce(0, payload.as_bytes(), Some(base + 20_000));
    }
    h.flush_producer();
    let mut conn = h.conn();
    wait_for(
        "the late events counted in redis",
        Duration::from_secs(30),
        || {
            value(&mut conn, &format!("wl:a0:{minute}")) == Some(3)
                && value(&mut conn, &format!("wl:anew:{minute}")) == Some(1)
        },
    )
    .await;
    let dropped = tally
        .metrics
        .publish
        .late_dropped
        .with_label_values(&["hits"]);
    wait_for("3 late keys dropped", Duration::from_secs(30), || {
        dropped.get() >= 3
    })
    .await;

    // Minute 1 closes (an event in minute 2): the pass that publishes it reads minute 0 again
    // first; once minute 1 is out, minute 0 has been looked at since the drop.
    h.produce(0, br#"{"app":"closer"}"#, Some(base + 2 * MIN + 1));
    h.flush_producer();
    let closer = format!("wl:closer:{}", next(&minute));
    let mut out = Vec::new();
    wait_for("minute 1 published", Duration::from_secs(60), || {
        out = read_all(&bootstrap, OUT);
        out.iter().any(|r| r.key == closer)
    })
    .await;
    assert_eq!(dropped.get(), 3, "each late change is dropped once");
    for r in &out {
        let v = r.value.as_ref().unwrap();
        assert_eq!(v["correction"], false, "{}: no correction: {v}", r.key);
    }
    let minute0: Vec<&Rec> = out.iter().filter(|r| r.key.ends_with(&minute)).collect();
    assert_eq!(minute0.len(), 5, "one final record per key of minute 0");
    let a0 = minute0.iter().find(|r| r.key == format!("wl:a0:{minute}"));
    assert_eq!(
        a0.unwrap().value.as_ref().unwrap()["value"],
        1,
        "final as published"
    );

    the_late_topic_has_each_dropped_change(&bootstrap, &minute, base);
    let kind = |k: &str| {
        let records = &tally.metrics.publish.records;
        records.with_label_values(&["hits", k]).get()
    };
    assert_eq!((kind("correction"), kind("late")), (0, 3));
    tally.stop().await;
}

/// `hits` per app and minute, published to `OUT` with `late = "drop"` and a late topic.
fn config(h: &Harness) -> tally::config::Config {
    let mut hits = counter(
        "hits",
        &["app"],
        "wl:{app}:{yyyyMMddHHmm}",
        Duration::from_secs(60),
        "UTC",
        Duration::from_secs(86_400),
    );
    hits.output = Some(OutputConfig {
        idle_timeout: Duration::from_secs(2),
        late: OutputLate::Drop,
        late_topic: Some(LATE.into()),
        ..OutputConfig::to(OUT)
    });
    let mut config = h.config("wl", vec![hits]);
    config.jobs.publish.interval = Duration::from_millis(100);
    config.jobs.publish.corrections_every = Duration::from_millis(200);
    config
}

/// The late topic: each dropped change, as the correction it would have been, once.
fn the_late_topic_has_each_dropped_change(bootstrap: &str, minute: &str, base: i64) {
    let late = read_all(bootstrap, LATE);
    let got: BTreeMap<&str, i64> = late
        .iter()
        .map(|r| {
            (
                r.key.as_str(),
                r.value.as_ref().unwrap()["value"].as_i64().unwrap(),
            )
        })
        .collect();
    let want: BTreeMap<String, i64> = [("a0", 3), ("a1", 3), ("anew", 1)]
        .into_iter()
        .map(|(app, v)| (format!("wl:{app}:{minute}"), v))
        .collect();
    let want: BTreeMap<&str, i64> = want.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(got, want);
    assert_eq!(late.len(), 3, "once each");
    for r in &late {
        assert_eq!(
            r.headers["tally-reason"], "late-after-final",
            "{:?}",
            r.headers
        );
        assert_eq!(r.headers["tally-counter"], "hits");
        assert_eq!(r.headers["tally-window-start"], base.to_string());
        assert_eq!(r.headers["tally-window-end"], (base + MIN).to_string());
        assert_eq!(r.value.as_ref().unwrap()["correction"], true);
    }
}

/// The `yyyyMMddHHmm` text of the minute after `minute`.
fn next(minute: &str) -> String {
    let t = chrono::NaiveDateTime::parse_from_str(&format!("{minute}00"), "%Y%m%d%H%M%S").unwrap();
    (t + chrono::Duration::minutes(1))
        .format("%Y%m%d%H%M")
        .to_string()
}
