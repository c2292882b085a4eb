//! `output.tombstones`: when a published window's keys expire (window end + retention), each
//! key the window published is produced again with a null value, after its final record, once;
//! a window not published gets none. One-second windows kept 4 s, so that a window expires
//! within the test. Without the setting (what main did) no tombstone ever comes. tally
//! in-process on librdkafka's mock cluster and a real `redis-server`.

use std::collections::BTreeMap;
use std::time::Duration;

use tally::config::{OutputConfig, OutputWhen};

use crate::common::{counter, wait_for, Harness};
use crate::window_late::{read_all, Rec};

const OUT: &str = "wt-out";
const APPS: usize = 6;

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
        Duration::from_secs(4),
    );
    hits.expiry_spread = Some(Duration::ZERO);
    hits.output = Some(OutputConfig {
        topic: OUT.into(),
        when: OutputWhen::Final,
        allowed_lateness: Duration::ZERO,
        idle_timeout: Duration::from_secs(2),
        top: None,
        late: Default::default(),
        late_topic: None,
        tombstones: true,
    });
    let mut config = h.config("wt", vec![hits]);
    config.jobs.publish.interval = Duration::from_millis(100);
    let tally = h.start(config);

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

    let mut records: Vec<Rec> = Vec::new();
    wait_for("every key's tombstone", Duration::from_secs(30), || {
        records = read_all(&bootstrap, OUT);
        records.iter().filter(|r| r.value.is_none()).count() >= APPS
    })
    .await;
    // Per key, in the topic's order: its final record, then its tombstone.
    let mut per_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &records {
        let what = if r.value.is_some() {
            "final"
        } else {
            "tombstone"
        };
        per_key.entry(&r.key).or_default().push(what);
    }
    assert_eq!(
        per_key.len(),
        APPS,
        "only the published window's keys: {per_key:?}"
    );
    for (key, seq) in &per_key {
        assert!(key.starts_with("wt:a"), "{key}");
        assert_eq!(seq, &["final", "tombstone"], "{key}");
    }
    let tombstones = tally
        .metrics
        .publish
        .records
        .with_label_values(&["hits", "tombstone"]);
    assert_eq!(tombstones.get(), APPS as u64);
    // The window is out of the index (beside the counter's progress): three more passes
    // produce nothing again.
    let mut conn = h.conn();
    let progress = "tally:published:wt:wt-in:hits";
    let published: Option<i64> = redis::cmd("GET").arg(progress).query(&mut conn).unwrap();
    assert_eq!(published, Some(second + 1000));
    let waiting: i64 = redis::cmd("ZCARD")
        .arg(format!("{progress}:tombstones"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(waiting, 0);
    let runs = tally.metrics.jobs.runs.with_label_values(&["publish"]);
    let after = runs.get() + 3;
    wait_for("three more passes", Duration::from_secs(30), || {
        runs.get() >= after
    })
    .await;
    assert_eq!(
        read_all(&bootstrap, OUT).len(),
        records.len(),
        "tombstones once"
    );
    tally.stop().await;
}
