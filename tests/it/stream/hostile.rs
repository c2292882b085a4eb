//! Hostile values: sums that would overflow 64 bits and event times far in the future are bad
//! input — skipped, counted by reason, dead-lettered — never a key pinned at i64::MAX, a dropped
//! increment counted as counted, or a key that lives for centuries.

use crate::common;

use std::time::Duration;

use crate::common::{counter, wait_for, Harness};
use chrono::{TimeZone, Utc};

const WAIT: Duration = Duration::from_secs(60);

/// The reasons of the messages on the dead-letter topic `topic`, in order.
fn dead_letter_reasons(h: &Harness, topic: &str, n: usize) -> Vec<String> {
    common::dead_letters::read(h, topic, n, WAIT)
        .iter()
        .map(|d| d.header("tally-reason").unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflowing_sums_and_future_times_are_refused_and_reported() {
    let mut h = Harness::new("hostile", 1);
    h.mock.create_topic("hostile-dlq", 1, 1).unwrap();
    let g = "g-hostile";
    let hour = Duration::from_secs(3600);
    let mut bytes = counter("bytes", &["u"], "hb:{u}:{yyyyMMddHH}", hour, "UTC", hour);
    bytes.value_field = Some("n".into());
    let hits = counter("hits", &["u"], "hh:{u}:{yyyyMMddHH}", hour, "UTC", hour);
    let mut config = h.config(g, vec![bytes, hits]);
    config.decode.dead_letter_topic = Some("hostile-dlq".into());

    let now = Utc::now().timestamp_millis();
    let stamp = Utc
        .timestamp_millis_opt(now)
        .unwrap()
        .format("%Y%m%d%H")
        .to_string();
    // `c`'s sum already sits near the top in Redis (written by someone else, or a past run).
    let near_max = i64::MAX - 1;
    let _: () = redis::cmd("SET")
        .arg(format!("hb:c:{stamp}"))
        .arg(near_max)
        .query(&mut h.conn())
        .unwrap();
    let year_2200 = 7_258_118_400_000;
    let messages: Vec<(String, i64)> = vec![
        (format!(r#"{{"u":"a","n":{}}}"#, i64::MAX), now),
        // Overflows a's pending sum: refused in memory, for both counters.
        (r#"{"u":"a","n":5}"#.into(), now),
        (r#"{"u":"b","n":7}"#.into(), now),
        // Fits in memory but not in Redis: the increment is refused there and reported.
        (r#"{"u":"c","n":5}"#.into(), now),
        // A clock gone wrong: would create keys living until the year 2200.
        (r#"{"u":"d","n":1}"#.into(), year_2200),
        (r#"{"u":"b","n":-2}"#.into(), now),
    ];
    for (payload, ts) in &messages {
        h.produce(0, payload.as_bytes(), Some(*ts));
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied(g, WAIT).await;
    let m = running.metrics.clone();
    wait_for("dead letters delivered", WAIT, || {
        m.decode.dead_letters.get() == 2
    })
    .await;
    running.stop().await;

    let mut want = std::collections::BTreeMap::new();
    want.insert(format!("hb:a:{stamp}"), i64::MAX);
    want.insert(format!("hb:b:{stamp}"), 5);
    want.insert(format!("hb:c:{stamp}"), near_max);
    want.insert(format!("hh:a:{stamp}"), 1);
    want.insert(format!("hh:b:{stamp}"), 2);
    want.insert(format!("hh:c:{stamp}"), 1);
    let mut got = h.dump("hb:*");
    got.extend(h.dump("hh:*"));
    assert_eq!(got, want, "no key for d, a not pinned by a dropped add");

    let decode = |reason: &str| crate::common::decode_errors(&m, reason);
    assert_eq!(decode("overflow"), 1);
    assert_eq!(decode("future_time"), 1);
    assert_eq!(
        m.sink.keys_rejected.with_label_values(&["overflow"]).get(),
        1
    );
    let counted = |c: &str| crate::common::events_counted(&m, c);
    // The events refused as bad input are not counted. (c's increment was accepted in memory
    // and refused by Redis: it is reported by `tally_keys_rejected_total` and an ERROR line.)
    assert_eq!(counted("bytes"), 4);
    assert_eq!(counted("hits"), 4);
    assert_eq!(
        dead_letter_reasons(&h, "hostile-dlq", 2),
        vec!["overflow".to_string(), "future_time".to_string()]
    );
}
