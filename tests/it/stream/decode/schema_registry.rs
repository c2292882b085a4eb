//! The schema registry connection: over TLS with a private CA (`decode.schema_registry.ca_file`),
//! and an id the registry did not know, asked again on a later event once it is registered.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tally_testkit::certs::Pki;

use crate::common::registry::Registry;
use crate::common::schemas::{avro_v1, fastavro};
use crate::common::{counter, wait_for, Harness};

/// An Avro v1 event of `route`, framed with schema `id`, at `now`.
fn event(id: u32, route: &str, now: i64) -> serde_json::Value {
    json!({"id": id, "schema": avro_v1(), "record":
        {"route": route, "status": 200, "http": {"method": "GET"}, "at": now}})
}

fn avro_config(
    h: &Harness,
    group: &str,
    registry: tally::config::RegistryConfig,
) -> tally::config::Config {
    let routes = counter(
        "routes",
        &["route"],
        "sr:{route}:{yyyyMMddHH}",
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(86_400),
    );
    let mut config = h.config(group, vec![routes]);
    config.kafka.consumers = tally::config::Consumers::Count(1);
    config.decode.format = tally::config::Format::Avro;
    config.decode.schema_registry = Some(registry);
    config.decode.time_field = Some("at".into());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_over_tls_is_trusted_through_its_ca_file() {
    let dir = std::env::temp_dir().join(format!("tally-registry-tls-{}", std::process::id()));
    let pki = Pki::create(&dir, "registry").unwrap();
    let registry = Registry::start_tls(None, &pki);
    registry.add(1, &avro_v1());
    let mut h = Harness::new("registry-tls", 1);
    let now = Utc::now().timestamp_millis();
    let payloads = fastavro(
        &(0..20)
            .map(|i| event(1, &format!("/t{}", i % 2), now))
            .collect::<Vec<_>>(),
    );
    for p in &payloads {
        h.produce(0, p, Some(now));
    }
    h.flush_producer();

    // Without the CA: the certificate is not trusted, which is an outage, not bad input.
    let untrusted = avro_config(&h, "g-tls-none", registry.config(None));
    untrusted.validate().expect("valid");
    let running = h.start(untrusted.clone());
    let m = running.metrics.clone();
    wait_for(
        "the handshake refused twice",
        Duration::from_secs(20),
        || registry.failed.load(Ordering::Relaxed) >= 2,
    )
    .await;
    let skipped: u64 = tally::stream::decode::DecodeError::ALL
        .iter()
        .map(|e| crate::common::decode_errors(&m, e.reason()))
        .sum();
    assert_eq!(skipped, 0, "an untrusted certificate skips nothing");
    assert_eq!(registry.served.load(Ordering::Relaxed), 0);
    running.stop().await;
    assert!(h.dump("sr:*").is_empty());

    // `tally check`: a CA file is for https://, and must hold a certificate.
    let mut wrong = untrusted.clone();
    let mut r = registry.config(None);
    r.ca_file = Some(pki.server.key.clone());
    wrong.decode.schema_registry = Some(r);
    let e = wrong.validate().unwrap_err().to_string();
    assert!(
        e.contains("decode.schema_registry.ca_file") && e.contains("no PEM certificate"),
        "{e}"
    );

    let mut trusted = avro_config(&h, "g-tls-ca", registry.config(None));
    let mut r = registry.config(None);
    r.ca_file = Some(pki.ca.clone());
    trusted.decode.schema_registry = Some(r);
    trusted.validate().expect("valid");
    let running = h.start(trusted);
    h.wait_applied("g-tls-ca", Duration::from_secs(30)).await;
    running.stop().await;
    let got: Vec<i64> = h.dump("sr:*").into_values().collect();
    assert_eq!(
        got,
        vec![10, 10],
        "every event counted through the TLS registry"
    );
    assert_eq!(registry.served.load(Ordering::Relaxed), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_the_registry_did_not_know_is_asked_again_on_a_later_event() {
    let registry = Registry::start(None);
    let mut h = Harness::new("registry-later", 1);
    let config = avro_config(&h, "g-later", registry.config(None));
    let running = h.start(config);
    let m = running.metrics.clone();
    let unknown = || crate::common::decode_errors(&m, "unknown_schema");
    let counted = || crate::common::events_counted(&m, "routes");
    let now = Utc::now().timestamp_millis();
    let payload = fastavro(&[event(7, "/late", now)]).remove(0);

    // Not registered yet: the event is unknown_schema.
    h.produce(0, &payload, Some(now));
    h.flush_producer();
    wait_for("the first event refused", Duration::from_secs(20), || {
        unknown() == 1
    })
    .await;

    // Registered now: a later event of that id is counted, once the answer is no longer
    // remembered (`unknown_schema` until then), not refused forever.
    registry.add(7, &avro_v1());
    let started = std::time::Instant::now();
    let mut sent = 1;
    while counted() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "never asked again: {} unknown",
            unknown()
        );
        h.produce(0, &payload, Some(now));
        h.flush_producer();
        sent += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    h.wait_applied("g-later", Duration::from_secs(20)).await;
    running.stop().await;
    let total: i64 = h.dump("sr:*").values().sum();
    assert_eq!(
        total as u64 + unknown(),
        sent,
        "each event counted or refused as unknown_schema"
    );
    assert!(total >= 1 && unknown() >= 1);
    eprintln!(
        "asked again after {:?}: {} refused, {total} counted",
        started.elapsed(),
        unknown()
    );
}

/// Ids the registry answers with a failure for ever while it answers everything else: a 500,
/// an answer over 1 MiB, a 200 that is not a schema. Each is asked a few times, then its event
/// is dead-lettered as `registry_error` and its partition moves on: the events around it are
/// counted exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_the_registry_keeps_failing_for_is_dead_lettered_and_the_partition_moves_on() {
    let registry = Registry::start(None);
    registry.add(1, &avro_v1());
    registry.fail(200, 500, r#"{"error_code":50001,"message":"store"}"#.into());
    registry.fail(
        201,
        200,
        format!(r#"{{"schema":"{}"}}"#, "x".repeat(2 << 20)),
    );
    registry.fail(202, 200, r#"{"error_code":0}"#.into());
    let mut h = Harness::new("registry-failing", 3);
    h.mock.create_topic("registry-failing-dlq", 1, 1).unwrap();
    let mut config = avro_config(&h, "g-failing", registry.config(None));
    // A lane per partition: the three ids are waited out side by side.
    config.kafka.consumers = tally::config::Consumers::Count(3);
    config.decode.dead_letter_topic = Some("registry-failing-dlq".into());
    let now = Utc::now().timestamp_millis();
    let good = fastavro(&[event(1, "/ok", now)]).remove(0);
    for (partition, id) in [200u32, 201, 202].into_iter().enumerate() {
        let partition = partition as i32;
        let mut bad = good.clone();
        bad[1..5].copy_from_slice(&id.to_be_bytes());
        h.produce(partition, &good, Some(now));
        h.produce(partition, &bad, Some(now));
        h.produce(partition, &good, Some(now));
    }
    h.flush_producer();

    let running = h.start(config);
    let m = running.metrics.clone();
    let failed = || crate::common::decode_errors(&m, "registry_error");
    wait_for("the three ids refused", Duration::from_secs(60), || {
        failed() == 3
    })
    .await;
    h.wait_applied("g-failing", Duration::from_secs(30)).await;
    running.stop().await;
    let total: i64 = h.dump("sr:*").values().sum();
    assert_eq!(total, 6, "every event around the failing ids counted");
    for id in [200, 201, 202] {
        assert_eq!(
            registry.asked(id),
            4,
            "id {id}: asked a bounded number of times"
        );
    }
    let letters =
        crate::common::dead_letters::read(&h, "registry-failing-dlq", 3, Duration::from_secs(20));
    let reasons: Vec<&str> = letters
        .iter()
        .filter_map(|l| l.header("tally-reason"))
        .collect();
    assert_eq!(reasons, ["registry_error"; 3]);
}
