//! Avro topics end to end: events written by fastavro in the Confluent wire format with two
//! versions of a schema, read through a schema registry (a stand-in serving its REST API on
//! loopback, see `common/registry.rs`), counted exactly by a plain counter and a filtered one
//! on a nested field. The registry is down when tally starts: nothing is counted or skipped
//! until it answers. Unknown ids and corrupt frames are skipped by reason, and dead-lettered.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::json;

use crate::common::registry::Registry;
use crate::common::schemas::{avro_v1 as v1, avro_v2 as v2, fastavro, routes_and_errors};
use crate::common::{wait_for, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_events_through_a_schema_registry_count_exactly() {
    let mut h = Harness::new("avro", 3);
    h.mock.create_topic("avro-dlq", 1, 1).unwrap();
    let registry = Registry::start(Some("tally:s3cret pass"));
    registry.add(1, &v1());
    registry.add(2, &v2());
    registry.set_up(false);
    let config = routes_and_errors(
        &h,
        "g-avro",
        "a",
        tally::config::Format::Avro,
        registry.config(Some(("tally", "s3cret pass"))),
        "avro-dlq",
    );
    let now = Utc::now().timestamp_millis();
    let (items, want) = events(now);
    let total = produce(&mut h, &items, now);

    let running = h.start(config);
    let m = running.metrics.clone();
    // The registry is down: tally asks again and again, and counts nothing, skips nothing.
    wait_for("registry asked while down", Duration::from_secs(30), || {
        registry.refused.load(std::sync::atomic::Ordering::Relaxed) >= 2
    })
    .await;
    let nothing_skipped = tally::stream::decode::DecodeError::ALL
        .iter()
        .all(|e| crate::common::decode_errors(&m, e.reason()) == 0);
    assert!(nothing_skipped, "a registry outage skips nothing");
    assert_eq!(crate::common::events_counted(&m, "routes"), 0);

    registry.set_up(true);
    h.wait_applied("g-avro", Duration::from_secs(60)).await;
    wait_for("every message consumed", Duration::from_secs(20), || {
        m.consumer.messages_consumed.get() >= total
            && crate::common::decode_errors(&m, "not_avro") == 6
    })
    .await;
    assert_eq!(crate::common::decode_errors(&m, "unknown_schema"), 3);
    assert_eq!(
        registry.served.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "each schema fetched once, at its first event"
    );
    running.stop().await;

    let mut got = h.dump("ar:*");
    got.extend(h.dump("ae:*"));
    assert_eq!(
        got, want,
        "every key equals the truth computed from what fastavro wrote"
    );
    let letters = crate::common::dead_letters::read(&h, "avro-dlq", 9, Duration::from_secs(20));
    let reasons: Vec<&str> = letters
        .iter()
        .filter_map(|l| l.header("tally-reason"))
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "unknown_schema").count(),
        3,
        "{reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| **r == "not_avro").count(),
        6,
        "{reasons:?}"
    );
}

/// 1,500 events alternating the two schema versions (for fastavro), and the counts they make.
fn events(now: i64) -> (Vec<serde_json::Value>, BTreeMap<String, i64>) {
    let hh = Utc.timestamp_millis_opt(now).unwrap().format("%Y%m%d%H");
    let methods = ["GET", "POST", "PUT"];
    let mut items = Vec::new();
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..1_500usize {
        let (route, method, status) = (
            format!("/r{}", i % 4),
            methods[i % 3],
            [200, 404, 500, 503][(i / 4) % 4] as i64,
        );
        let (id, schema, record) = match i % 2 {
            0 => (
                1,
                v1(),
                json!({"route": route, "status": status, "http": {"method": method}, "at": now}),
            ),
            _ => (
                2,
                v2(),
                json!({"tenant": "t", "http": {"method": method, "path": null}, "route": route,
                                  "region": if i % 3 == 0 { json!("eu") } else { json!(null) },
                                  "at": now * 1000 + 999, "status": status}),
            ),
        };
        items.push(json!({"id": id, "schema": schema, "record": record}));
        *want.entry(format!("ar:{route}:{hh}")).or_default() += 1;
        if status >= 500 {
            *want.entry(format!("ae:{route}:{method}:{hh}")).or_default() += 1;
        }
    }
    (items, want)
}

/// Produces the events, with bad input among the good: an id the registry does not know, a
/// cut datum, a JSON event. Returns how many messages were produced.
fn produce(h: &mut Harness, items: &[serde_json::Value], now: i64) -> u64 {
    let payloads = fastavro(items);
    let unknown = {
        let mut p = payloads[0].clone();
        p[1..5].copy_from_slice(&99u32.to_be_bytes());
        p
    };
    let cut = payloads[1][..payloads[1].len() - 3].to_vec();
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (unknown, "unknown_schema"),
        (cut, "not_avro"),
        (br#"{"route":"/r0"}"#.to_vec(), "not_avro"),
    ];
    for (i, p) in payloads.iter().enumerate() {
        h.produce((i % 3) as i32, p, Some(now));
        if i % 500 == 250 {
            for (b, _) in &bad {
                h.produce((i % 3) as i32, b, Some(now));
            }
        }
    }
    h.flush_producer();
    (payloads.len() + 3 * bad.len()) as u64
}
