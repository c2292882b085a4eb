//! Protobuf topics end to end: events written by Google's protobuf package (the runtime
//! confluent-kafka's ProtobufSerializer uses) in the Confluent wire format with two versions of
//! a schema that imports a referenced one, read through a schema registry stand-in
//! (`common/registry.rs`), counted exactly by a plain counter and a filtered one on a nested
//! field. The registry is down when tally starts: nothing is counted or skipped until it
//! answers. Unknown ids and corrupt frames are skipped by reason, and dead-lettered. Without a
//! registry: bare messages of a descriptor set file.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::json;

use crate::common::registry::Registry;
use crate::common::schemas::{
    descriptor_set, hex, proto_versions, protobuf_writer as write, routes_and_errors,
    PROTO_COMMON as COMMON, PROTO_V1 as V1, PROTO_V2 as V2,
};
use crate::common::{counter, wait_for, Harness};

/// The hour `now` falls in, as the keys write it.
fn hour_of(now: i64) -> String {
    Utc.timestamp_millis_opt(now)
        .unwrap()
        .format("%Y%m%d%H")
        .to_string()
}

/// Event `i` in version 1 or 2 (alternately) at `now`, and the keys it adds one to.
fn event(i: usize, now: i64, hh: &str) -> (serde_json::Value, Vec<String>) {
    let route = format!("/r{}", i % 4);
    let method = ["GET", "POST", "PUT"][i % 3];
    let status = [200, 404, 500, 503][(i / 4) % 4];
    let item = match i % 2 {
        0 => json!({"schema": "v1", "id": 1, "message": "shop.Request", "indexes": [0],
            "record": {"route": route, "status": status, "http": {"method": method}, "at": now}}),
        _ => json!({"schema": "v2", "id": 2, "message": "shop.Request", "indexes": [1],
            "record": {"tenant": "t", "http": {"method": method, "path": "/x"}, "route": route,
                "status": status, "at": now, "client": {"region": "eu"},
                "items": [{"sku": "a"}, {"sku": "b"}]}}),
    };
    let mut keys = vec![format!("pr:{route}:{hh}")];
    if status >= 500 {
        keys.push(format!("pe:{route}:{method}:{hh}"));
    }
    (item, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_events_through_a_schema_registry_count_exactly() {
    let mut h = Harness::new("protobuf", 3);
    h.mock.create_topic("protobuf-dlq", 1, 1).unwrap();
    let registry = Registry::start(Some("tally:s3cret"));
    let common = [("shop/common.proto", "shop-common", 1)];
    registry.add_protobuf(1, V1, &common);
    registry.add_protobuf(2, V2, &common);
    registry.add_subject("shop-common", 1, COMMON);
    registry.set_up(false);

    let config = routes_and_errors(
        &h,
        "g-protobuf",
        "p",
        tally::config::Format::Protobuf,
        registry.config(Some(("tally", "s3cret"))),
        "protobuf-dlq",
    );

    let now = Utc::now().timestamp_millis();
    let (items, want) = events(now);
    let total = produce(&mut h, &items, now);

    let running = h.start(config);
    let m = running.metrics.clone();
    let errors = |reason: &str| crate::common::decode_errors(&m, reason);
    // The registry is down: tally asks again and again, and counts nothing, skips nothing.
    wait_for("registry asked while down", Duration::from_secs(30), || {
        registry.refused.load(Ordering::Relaxed) >= 2
    })
    .await;
    let skipped: u64 = tally::stream::decode::DecodeError::ALL
        .iter()
        .map(|e| errors(e.reason()))
        .sum();
    assert_eq!(skipped, 0, "a registry outage skips nothing");
    let counted = m.aggregate.events_counted.with_label_values(&["routes"]);
    assert_eq!(counted.get(), 0);

    registry.set_up(true);
    h.wait_applied("g-protobuf", Duration::from_secs(60)).await;
    wait_for("every message consumed", Duration::from_secs(20), || {
        m.consumer.messages_consumed.get() >= total && errors("not_protobuf") == 9
    })
    .await;
    assert_eq!(errors("unknown_schema"), 3);
    assert_eq!(errors("missing_field") + errors("wrong_type"), 0);
    assert_eq!(
        registry.served.load(Ordering::Relaxed),
        4,
        "each schema fetched once, at its first event, with its reference"
    );
    running.stop().await;

    let mut got = h.dump("pr:*");
    got.extend(h.dump("pe:*"));
    assert_eq!(
        got, want,
        "every key equals the truth computed from what was written"
    );
    let letters =
        crate::common::dead_letters::read(&h, "protobuf-dlq", 12, Duration::from_secs(20));
    let reasons: Vec<&str> = letters
        .iter()
        .filter_map(|l| l.header("tally-reason"))
        .collect();
    let count = |r: &str| reasons.iter().filter(|x| **x == r).count();
    assert_eq!(count("unknown_schema"), 3, "{reasons:?}");
    assert_eq!(count("not_protobuf"), 9, "{reasons:?}");
}

/// 1,500 events alternating the two schema versions, and the counts they make.
fn events(now: i64) -> (Vec<serde_json::Value>, BTreeMap<String, i64>) {
    let hh = hour_of(now);
    let mut items = Vec::new();
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..1_500usize {
        let (item, keys) = event(i, now, &hh);
        items.push(item);
        for k in keys {
            *want.entry(k).or_default() += 1;
        }
    }
    (items, want)
}

/// Produces the events, with bad input among the good: an id the registry does not know; a
/// message cut inside a field; an index past the schema's messages; a JSON event. Returns how
/// many messages were produced.
fn produce(h: &mut Harness, items: &[serde_json::Value], now: i64) -> u64 {
    let payloads = write(proto_versions(), None, items);
    let unknown = {
        let mut p = payloads[0].clone();
        p[1..5].copy_from_slice(&99u32.to_be_bytes());
        p
    };
    let mut cut = payloads[1].clone();
    cut.extend([0x0a, 0x7f]);
    let mut no_such_message = payloads[0][..5].to_vec();
    no_such_message.extend([2, 40]);
    let bad: Vec<Vec<u8>> = vec![
        unknown,
        cut,
        no_such_message,
        br#"{"route":"/r0"}"#.to_vec(),
    ];
    for (i, p) in payloads.iter().enumerate() {
        h.produce((i % 3) as i32, p, Some(now));
        if i % 500 == 250 {
            for b in &bad {
                h.produce((i % 3) as i32, b, Some(now));
            }
        }
    }
    h.flush_producer();
    (payloads.len() + 3 * bad.len()) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_bare_messages_of_a_descriptor_file_count_exactly() {
    let mut h = Harness::new("protobuf-file", 2);
    let dir = std::env::temp_dir().join(format!("tally-protobuf-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("events.pb");

    let hour = Duration::from_secs(3600);
    let day = Duration::from_secs(86_400);
    let mut regions = counter(
        "regions",
        &["region", "sku"],
        "pf:{region}:{sku}:{yyyyMMddHH}",
        hour,
        "UTC",
        day,
    );
    regions.value_field = Some("status".into());
    let mut config = h.config("g-protobuf-file", vec![regions]);
    config.decode.format = tally::config::Format::Protobuf;
    config.decode.time_field = Some("at".into());
    for (name, path) in [("region", "client.region"), ("sku", "items[1].sku")] {
        config.decode.fields.insert(name.into(), path.into());
    }

    let now = Utc::now().timestamp_millis();
    let hh = hour_of(now);
    let mut items = Vec::new();
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..600usize {
        let (region, sku, status) = (["eu", "us"][i % 2], ["a", "b", "c"][i % 3], i as i64);
        items.push(
            json!({"schema": "v2", "id": null, "message": "shop.Request",
            "record": {"route": "/r", "status": status, "at": now, "client": {"region": region},
                "items": [{"sku": "x"}, {"sku": sku}]}}),
        );
        *want.entry(format!("pf:{region}:{sku}:{hh}")).or_default() += status;
    }
    let schemas = json!({"v2": hex(&descriptor_set(V2))});
    let payloads = write(schemas, Some(("v2", &file)), &items);

    // `tally check` refuses a missing file, an unknown message, a file that is no descriptor set.
    config.decode.descriptor_file = Some(dir.join("missing.pb"));
    config.decode.message = Some("shop.Request".into());
    let e = config.validate().unwrap_err().to_string();
    assert!(
        e.contains("decode.descriptor_file") && e.contains("missing.pb"),
        "{e}"
    );
    config.decode.descriptor_file = Some(file.clone());
    config.decode.message = Some("shop.Nope".into());
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("no message `shop.Nope`"), "{e}");
    config.decode.descriptor_file = Some(dir.join("not.pb"));
    std::fs::write(dir.join("not.pb"), V2).unwrap();
    assert!(
        config.validate().is_err(),
        ".proto text is not a descriptor set"
    );
    config.decode.descriptor_file = Some(file.clone());
    config.decode.message = Some("shop.Request".into());
    config.validate().expect("valid");

    for (i, p) in payloads.iter().enumerate() {
        h.produce((i % 2) as i32, p, Some(now));
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-protobuf-file", Duration::from_secs(60))
        .await;
    let m = running.metrics.clone();
    wait_for("every message consumed", Duration::from_secs(20), || {
        m.consumer.messages_consumed.get() >= payloads.len() as u64
    })
    .await;
    running.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(h.dump("pf:*"), want);
}
