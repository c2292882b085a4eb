//! The registry never holds a lane: an id the registry keeps failing for (7 s of asks) pauses
//! its own partition while the lane keeps polling and counting the others, and the paused
//! partition's later events are counted after the refused one, exactly once. And the compiled
//! schemas a lane keeps are bounded (`decode.max_schemas`): ids forgotten are fetched again and
//! their events counted exactly.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;

use crate::common::registry::Registry;
use crate::common::{counter, wait_for, Harness};

/// One string field, `route`.
fn route_schema() -> serde_json::Value {
    json!({"type": "record", "name": "E", "fields": [{"name": "route", "type": "string"}]})
}

/// The Confluent frame of `{"route": route}` written with schema `id`.
fn event(id: u32, route: &str) -> Vec<u8> {
    assert!(route.len() < 64, "one-byte zigzag length");
    let mut p = vec![0];
    p.extend(id.to_be_bytes());
    p.push((route.len() * 2) as u8);
    p.extend(route.as_bytes());
    p
}

fn config(h: &Harness, group: &str, registry: &Registry) -> tally::config::Config {
    let routes = counter(
        "routes",
        &["route"],
        "sw:{route}:{yyyyMMddHH}",
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(86_400),
    );
    let mut config = h.config(group, vec![routes]);
    // One lane for both partitions: a lane waiting on the registry would starve the other.
    config.kafka.consumers = tally::config::Consumers::Count(1);
    config.decode.format = tally::config::Format::Avro;
    config.decode.schema_registry = Some(registry.config(None));
    config
}

/// Redis' count of `route` (0 before its first flush).
fn count(h: &Harness, route: &str) -> i64 {
    h.dump(&format!("sw:{route}:*")).values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_schema_id_pauses_its_partition_only_and_the_lane_keeps_counting() {
    let registry = Registry::start(None);
    registry.add(1, &route_schema());
    registry.fail(300, 500, r#"{"error_code":50001,"message":"store"}"#.into());
    let mut h = Harness::new("registry-wait", 2);
    let now = Utc::now().timestamp_millis();
    // Partition 0: 5 events; once the lane counts partition 1 too, one of the failing id and
    // 5 more.
    for _ in 0..5 {
        h.produce(0, &event(1, "/p0"), Some(now));
    }
    h.flush_producer();
    let running = h.start(config(&h, "g-wait", &registry));
    let m = running.metrics.clone();
    let counted = || crate::common::events_counted(&m, "routes");
    let failed = || crate::common::decode_errors(&m, "registry_error");

    // Partition 1 gets an event every 25 ms while the failing id is asked about; the time
    // between two rises of the events counted is the lane's longest pause in counting.
    let (mut sent, mut last, mut rose_at) = (0i64, 0, Instant::now());
    let mut longest = Duration::ZERO;
    let mut early_p0 = 0;
    let began = Instant::now();
    let (mut failing_sent, mut refused_at) = (None, None);
    while refused_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(1)) {
        assert!(began.elapsed() < Duration::from_secs(40), "never refused");
        h.produce(1, &event(1, "/p1"), Some(now));
        h.flush_producer();
        sent += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
        let c = counted();
        if c != last {
            if last > 0 {
                longest = longest.max(rose_at.elapsed());
            }
            (last, rose_at) = (c, Instant::now());
        }
        if failing_sent.is_none() && c > 5 {
            for id in [300, 1, 1, 1, 1, 1] {
                h.produce(0, &event(id, "/p0"), Some(now));
            }
            h.flush_producer();
            failing_sent = Some(Instant::now());
        }
        if refused_at.is_none() && failed() == 1 {
            refused_at = Some(Instant::now());
        }
        if failing_sent.is_some() && refused_at.is_none() && sent % 20 == 0 {
            // Waiting: nothing of partition 0 after the failing event is counted yet.
            early_p0 = early_p0.max(count(&h, "/p0"));
        }
    }
    let waited = refused_at.unwrap() - failing_sent.unwrap();
    h.wait_applied("g-wait", Duration::from_secs(30)).await;
    running.stop().await;
    eprintln!(
        "the failing id refused after {waited:?}; longest pause in counting {longest:?}; \
         partition 0 at {early_p0} of 5 before it"
    );
    assert!(early_p0 <= 5, "partition 0 counted past the waiting event");
    assert!(
        waited > Duration::from_secs(5),
        "the failing id was asked for its 7 s"
    );
    assert!(
        longest < Duration::from_secs(2),
        "the lane paused counting for {longest:?} while the registry was asked"
    );
    let got: BTreeMap<String, i64> = ["/p0", "/p1"]
        .into_iter()
        .map(|r| (r.to_string(), count(&h, r)))
        .collect();
    let want = BTreeMap::from([("/p0".to_string(), 10), ("/p1".to_string(), sent)]);
    assert_eq!(got, want, "every event counted exactly once");
    assert_eq!(failed(), 1);
    assert_eq!(registry.asked(300), 4, "asked a bounded number of times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schemas_a_lane_keeps_are_bounded_and_forgotten_ids_fetched_again() {
    let registry = Registry::start(None);
    let ids: Vec<u32> = (10..20).collect();
    for &id in &ids {
        registry.add(id, &route_schema());
    }
    let mut h = Harness::new("registry-bounded", 1);
    let now = Utc::now().timestamp_millis();
    // Ten ids, cycled through three times: a cache of three forgets each before it comes back.
    let rounds = 3;
    for _ in 0..rounds {
        for &id in &ids {
            h.produce(0, &event(id, &format!("/id{id}")), Some(now));
        }
    }
    h.flush_producer();
    let mut config = config(&h, "g-bounded", &registry);
    config.decode.max_schemas = 3;
    let running = h.start(config);
    let m = running.metrics.clone();
    let total = (rounds * ids.len()) as u64;
    wait_for("every event counted", Duration::from_secs(30), || {
        crate::common::events_counted(&m, "routes") == total
    })
    .await;
    h.wait_applied("g-bounded", Duration::from_secs(30)).await;
    let evicted = m.decode.schema_evictions.get();
    running.stop().await;
    for &id in &ids {
        assert_eq!(count(&h, &format!("/id{id}")), rounds as i64, "id {id}");
        assert_eq!(
            registry.asked(id),
            rounds,
            "id {id}: forgotten, fetched again"
        );
    }
    let fetched: usize = ids.iter().map(|&id| registry.asked(id)).sum();
    assert_eq!(
        fetched as u64 - evicted,
        3,
        "held at the end: every schema fetched but those forgotten, at most decode.max_schemas"
    );
}
