//! `output.tombstones`: when a published window's keys expire (window end + retention), each
//! key the window published is produced again with a null value, after its final record, once;
//! a window not published gets none, and no correction follows a tombstone (a late change the
//! publisher had not looked at before the expiry stays out: the tombstone deletes the key
//! anyway). One-second windows kept 12 s, so that a window expires within the test. Without the
//! setting (what main did) no tombstone ever comes. tally in-process on librdkafka's mock
//! cluster and a real `redis-server`.

use std::collections::BTreeMap;
use std::time::Duration;

use tally::config::OutputConfig;

use crate::common::{counter, wait_for, Harness};
use crate::stream::window::late::{read_all, Rec};

const OUT: &str = "wt-out";
const APPS: usize = 6;
/// Seconds a window's keys are kept after its end.
const RETENTION: u64 = 12;

/// Per key, in the topic's order, what its records are: "final", "correction" or "tombstone".
fn kinds(records: &[Rec]) -> BTreeMap<&str, Vec<&'static str>> {
    let mut per_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in records {
        let what = match &r.value {
            None => "tombstone",
            Some(v) if v["correction"] == true => "correction",
            Some(_) => "final",
        };
        per_key.entry(&r.key).or_default().push(what);
    }
    per_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_windows_leave_a_tombstone_for_each_published_key() {
    let mut h = Harness::new("wt-in", 1);
    let bootstrap = h.mock.bootstrap_servers();
    h.mock.create_topic(OUT, 1, 1).unwrap();
    let mut hits = counter(
        "hits",
        &["app"],
        "wt:{app}:{yyyyMMddHHmmss}",
        Duration::from_secs(1),
        "UTC",
        Duration::from_secs(RETENTION),
    );
    // The keys outlive the window's expiry (the spread), so that the publisher still reads
    // them, and the late change, after the tombstones.
    hits.expiry_spread = Some(Duration::from_secs(30));
    hits.output = Some(OutputConfig {
        idle_timeout: Duration::from_secs(2),
        tombstones: true,
        ..OutputConfig::to(OUT)
    });
    let mut config = h.config("wt", vec![hits]);
    config.jobs.publish.interval = Duration::from_millis(100);
    // No look for corrections but at a window's close: the late change below is found only
    // once a window closes after the tombstones.
    config.jobs.publish.corrections_every = Duration::from_secs(600);
    let tally = h.start(config);

    // Consuming (the group joined) before the clock matters: a warm-up event, too old to count.
    let warm_up = chrono::Utc::now().timestamp_millis() - 3_600_000;
    h.produce(0, br#"{"app":"warm-up"}"#, Some(warm_up));
    h.flush_producer();
    h.wait_applied("wt", Duration::from_secs(30)).await;

    // The last whole second: APPS keys; an event in the current second closes it (and stays
    // open itself: no tombstone for its key).
    let now = chrono::Utc::now().timestamp_millis();
    let second = now - now.rem_euclid(1000) - 1000;
    for i in 0..APPS {
        let payload = format!(r#"{{"app":"a{i}"}}"#);
        h.produce(0, payload.as_bytes(), Some(second + 10));
    }
    h.produce(0, br#"{"app":"closer"}"#, Some(second + 1000));
    h.flush_producer();
    wait_for("the window published", Duration::from_secs(30), || {
        read_all(&bootstrap, OUT).len() >= APPS
    })
    .await;
    // A late change within retention, not looked at before the window expires.
    h.produce(0, br#"{"app":"a0"}"#, Some(second + 20));
    h.flush_producer();
    let mut conn = h.conn();
    let key = |app: &str| format!("wt:{app}:{}", second_text(second));
    wait_for("the late event counted", Duration::from_secs(30), || {
        redis::cmd("GET")
            .arg(key("a0"))
            .query::<Option<i64>>(&mut conn)
            .unwrap()
            == Some(2)
    })
    .await;

    let mut records: Vec<Rec> = Vec::new();
    wait_for("every key's tombstone", Duration::from_secs(30), || {
        records = read_all(&bootstrap, OUT);
        records.iter().filter(|r| r.value.is_none()).count() >= APPS
    })
    .await;
    let tombstones = tally
        .metrics
        .publish
        .records
        .with_label_values(&["hits", "tombstone"]);
    assert_eq!(tombstones.get(), APPS as u64);

    // Another window closes: the expired one's keys (still in Redis, a0 changed) are not
    // corrected after their tombstones.
    let now = chrono::Utc::now().timestamp_millis();
    h.produce(0, br#"{"app":"later"}"#, Some(now));
    h.flush_producer();
    let closer = format!("wt:closer:{}", second_text(second + 1000));
    wait_for(
        "the closer's window published",
        Duration::from_secs(30),
        || {
            records = read_all(&bootstrap, OUT);
            records.iter().any(|r| r.key == closer)
        },
    )
    .await;
    let per_key = kinds(&records);
    for i in 0..APPS {
        let k = key(&format!("a{i}"));
        assert_eq!(
            per_key.get(k.as_str()).unwrap(),
            &["final", "tombstone"],
            "{k}"
        );
    }
    assert_eq!(per_key[closer.as_str()][0], "final", "{per_key:?}");
    // The expired window is out of the index beside the counter's progress.
    let progress = "tally:published:wt:wt-in:hits";
    let published: Option<i64> = redis::cmd("GET").arg(progress).query(&mut conn).unwrap();
    assert!(published.is_some_and(|p| p > second + 1000));
    let index = format!("{progress}:tombstones");
    let zscore = |conn: &mut redis::Connection, start: i64| -> Option<i64> {
        redis::cmd("ZSCORE")
            .arg(&index)
            .arg(start)
            .query(conn)
            .unwrap()
    };
    assert_eq!(zscore(&mut conn, second), None);
    tally.stop().await;
}

/// The `yyyyMMddHHmmss` text of the second starting at `ms`.
fn second_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .format("%Y%m%d%H%M%S")
        .to_string()
}
