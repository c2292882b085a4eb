//! `[decode.fields]` end to end: counters keyed by nested JSON fields, the record key, a header
//! and the partition, summing a nested value, timed by a nested field — every key equal to the
//! truth computed from what was produced; events missing a nested field are counted by reason.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use rdkafka::message::{Header, OwnedHeaders};

use crate::common::{counter, wait_for, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_read_nested_fields_the_key_headers_and_the_partition() {
    let mut h = Harness::new("fields", 3);
    let config = config(&h);

    let (want, good, missing) = produce(&mut h);
    h.flush_producer();

    let running = h.start(config);
    h.wait_applied("g-fields", Duration::from_secs(60)).await;
    let m = running.metrics.clone();
    wait_for("every message consumed", Duration::from_secs(10), || {
        m.consumer.messages_consumed.get() == good + missing
    })
    .await;
    let skipped = crate::common::decode_errors(&m, "missing_field");
    running.stop().await;

    assert_eq!(
        skipped, missing,
        "events without the nested field, counted by reason"
    );
    let mut got = BTreeMap::new();
    for pattern in ["r:*", "g:*", "b:*"] {
        got.extend(h.dump(pattern));
    }
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty(),
        "keys differ from the truth, e.g. {wrong:?}"
    );
    assert_eq!(got.len(), want.len(), "no key beyond the truth");
}

/// Counters keyed by nested fields, the record key, a header and the partition, one summing a
/// nested value, timed by a nested field.
fn config(h: &Harness) -> tally::config::Config {
    let day = Duration::from_secs(86_400);
    let hour = Duration::from_secs(3600);
    let mut bytes = counter(
        "bytes",
        &["tenant", "method"],
        "b:{tenant}:{method}:{yyyyMMddHH}",
        hour,
        "UTC",
        day,
    );
    bytes.value_field = Some("size".into());
    let counters = vec![
        counter(
            "by_route",
            &["method", "route", "sku"],
            "r:{method}:{route}:{sku}:{yyyyMMddHH}",
            hour,
            "UTC",
            day,
        ),
        counter(
            "by_region",
            &["region", "part"],
            "g:{region}:{part}:{yyyyMMddHH}",
            hour,
            "UTC",
            day,
        ),
        bytes,
    ];
    let mut config = h.config("g-fields", counters);
    config.decode.time_field = Some("at".into());
    for (name, source) in [
        ("method", "request.method"),
        ("route", "/request/route"),
        ("sku", "items[1].sku"),
        ("size", "response.bytes"),
        ("at", "meta.time"),
        ("tenant", "$key"),
        ("region", "$header.x-region"),
        ("part", "$partition"),
    ] {
        config.decode.fields.insert(name.into(), source.into());
    }
    config.validate().expect("valid");
    config
}

/// 3,000 events over two hours (every 10th lacks the nested sku); the counts they make, and how
/// many have every field and how many lack one.
fn produce(h: &mut Harness) -> (BTreeMap<String, i64>, u64, u64) {
    let now = Utc::now().timestamp_millis();
    let hour_ms = 3_600_000;
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    let (mut good, mut missing) = (0u64, 0u64);
    for i in 0..3_000i64 {
        let ts = now - now.rem_euclid(hour_ms) - (i % 2) * hour_ms + (i * 7_919) % hour_ms;
        let ts = ts.min(now);
        let hh = Utc.timestamp_millis_opt(ts).unwrap().format("%Y%m%d%H");
        let (method, route, sku) = (
            ["GET", "POST"][(i % 2) as usize],
            format!("/v{}", i % 3),
            format!("s{}", i % 5),
        );
        let (tenant, region, part, size) = (
            format!("t{}", i % 4),
            ["eu", "us"][(i % 3 % 2) as usize],
            (i % 3) as i32,
            1 + i % 50,
        );
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "x-region",
            value: Some("stale"),
        });
        headers = headers.insert(Header {
            key: "x-region",
            value: Some(region),
        });
        // Every 10th event lacks the nested sku: skipped as missing_field, counted nowhere.
        let items = if i % 10 == 9 {
            "[]".to_string()
        } else {
            format!(r#"[{{"sku":"x"}},{{"sku":"{sku}"}}]"#)
        };
        let payload = format!(
            r#"{{"request":{{"route":"{route}","method":"{method}","h":{{"a":[1,2]}}}},"items":{items},"response":{{"bytes":{size}}},"meta":{{"time":{ts}}}}}"#
        );
        h.produce_record(part, Some(tenant.as_bytes()), headers, payload.as_bytes());
        if i % 10 == 9 {
            missing += 1;
            continue;
        }
        good += 1;
        *want
            .entry(format!("r:{method}:{route}:{sku}:{hh}"))
            .or_default() += 1;
        *want.entry(format!("g:{region}:{part}:{hh}")).or_default() += 1;
        *want.entry(format!("b:{tenant}:{method}:{hh}")).or_default() += size;
    }
    (want, good, missing)
}

/// A counter with a CEL filter and a derived dimension beside one without: each key equals the
/// truth, the filtered-out events are counted per counter and reason, and an event that lacks a
/// field only the filter reads is still counted by the unfiltered counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_and_derived_fields_count_exactly() {
    let mut h = Harness::new("filters", 2);
    let day = Duration::from_secs(86_400);
    let hour = Duration::from_secs(3600);
    let mut errors = counter(
        "errors",
        &["route", "class"],
        "e:{route}:{class}:{yyyyMMddHH}",
        hour,
        "UTC",
        day,
    );
    errors.filter = Some(r#"status >= 500 && request.method == "POST""#.into());
    let counters = vec![
        counter(
            "all",
            &["route"],
            "a:{route}:{yyyyMMddHH}",
            hour,
            "UTC",
            day,
        ),
        errors,
    ];
    let mut config = h.config("g-filters", counters);
    config
        .decode
        .derive
        .insert("class".into(), r#"string(status / 100) + "xx""#.into());
    config.validate().expect("valid");

    let now = Utc::now().timestamp_millis();
    let hh = Utc.timestamp_millis_opt(now).unwrap().format("%Y%m%d%H");
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    let (mut filtered, mut failed) = (0u64, 0u64);
    let statuses = [200, 201, 404, 500, 502, 503];
    for i in 0..2_000usize {
        let route = format!("/r{}", i % 3);
        let method = ["GET", "POST"][i % 2];
        let status = statuses[i % statuses.len()];
        // Every 7th event has no status: only the filter reads it.
        let payload = match i % 7 {
            6 => format!(r#"{{"route":"{route}","request":{{"method":"{method}"}}}}"#),
            _ => format!(
                r#"{{"route":"{route}","status":{status},"request":{{"method":"{method}"}}}}"#
            ),
        };
        h.produce((i % 2) as i32, payload.as_bytes(), Some(now));
        *want.entry(format!("a:{route}:{hh}")).or_default() += 1;
        if i % 7 == 6 {
            failed += 1; // `null >= 500` is an error in CEL, and `&&` cannot absorb it when POST
            if method == "GET" {
                failed -= 1;
                filtered += 1;
            }
        } else if status >= 500 && method == "POST" {
            *want
                .entry(format!("e:{route}:{}xx:{hh}", status / 100))
                .or_default() += 1;
        } else {
            filtered += 1;
        }
    }
    h.flush_producer();

    let running = h.start(config);
    h.wait_applied("g-filters", Duration::from_secs(60)).await;
    let m = running.metrics.clone();
    wait_for("every message consumed", Duration::from_secs(10), || {
        m.consumer.messages_consumed.get() == 2_000
    })
    .await;
    // Skips are published with the other per-batch counts.
    let skipped = |reason: &str| {
        m.aggregate
            .events_skipped
            .with_label_values(&["errors", reason])
            .get()
    };
    let published = tokio::time::timeout(Duration::from_secs(10), async {
        while skipped("filtered") != filtered {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert!(
        published.await.is_ok(),
        "filtered: {} of {filtered}, failed {} of {failed}",
        skipped("filtered"),
        skipped("expression_error")
    );
    assert_eq!(skipped("expression_error"), failed);
    assert_eq!(
        m.aggregate
            .events_skipped
            .with_label_values(&["all", "filtered"])
            .get(),
        0
    );
    running.stop().await;

    let mut got = h.dump("a:*");
    got.extend(h.dump("e:*"));
    assert_eq!(got, want, "every key equals the truth");
}
