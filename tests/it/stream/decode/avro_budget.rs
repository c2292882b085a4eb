//! Avro schemas and events built to exhaust tally, through the registry stand-in, between
//! ordinary events on one partition: a schema of reused records that expands to 8^8 values
//! (2.7 KB of text; compiled as its text, its event refused as cut short), the same with null
//! leaves (a valid 2-byte event, counted at once), an array of 2^24 - 1 nulls in 10 bytes
//! (`too_complex`) and a schema over `decode.max_schema_nodes` (`schema_too_large`). Every
//! ordinary event is counted exactly, each bad one dead-lettered with its reason, and the
//! process's peak memory stays small.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::{json, Value};

use crate::common::registry::Registry;
use crate::common::{counter, wait_for, Harness};

/// 8 record types of 8 fields, each of the previous type; the first holds one `leaf`.
fn nested_eights(leaf: &str) -> Value {
    let mut fields = vec![
        json!({"name": "app", "type": "string"}),
        json!({"name": "t0", "type": {"type": "record", "name": "T0",
            "fields": [{"name": "x", "type": leaf}]}}),
    ];
    for i in 1..9 {
        let inner: Vec<Value> = (0..8)
            .map(|j| json!({"name": format!("f{j}"), "type": format!("T{}", i - 1)}))
            .collect();
        fields.push(json!({"name": format!("t{i}"),
            "type": {"type": "record", "name": format!("T{i}"), "fields": inner}}));
    }
    json!({"type": "record", "name": "Root", "fields": fields})
}

/// A Confluent frame: byte 0, the schema id, the datum.
fn framed(id: u32, datum: &[u8]) -> Vec<u8> {
    let mut p = vec![0];
    p.extend(id.to_be_bytes());
    p.extend(datum);
    p
}

/// The datum of `{"app": app}` (a zigzag length, then the bytes).
fn app(app: &str) -> Vec<u8> {
    let mut d = vec![(app.len() * 2) as u8];
    d.extend(app.as_bytes());
    d
}

/// The peak resident memory of this process (nextest runs each test in its own), in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_and_event_bombs_are_refused_and_the_partition_moves_on() {
    let mut h = Harness::new("avro-budget", 1);
    h.mock.create_topic("avro-budget-dlq", 1, 1).unwrap();
    let registry = Registry::start(None);
    registry.add(
        1,
        &json!({"type": "record", "name": "App",
        "fields": [{"name": "app", "type": "string"}]}),
    );
    registry.add(108, &nested_eights("int"));
    registry.add(109, &nested_eights("null"));
    registry.add(
        110,
        &json!({"type": "record", "name": "Ev", "fields": [
        {"name": "app", "type": "string"},
        {"name": "junk", "type": {"type": "array", "items": "null"}}]}),
    );
    let wide: Vec<Value> = std::iter::once(json!({"name": "app", "type": "string"}))
        .chain((0..2_000).map(|i| json!({"name": format!("f{i}"), "type": "int"})))
        .collect();
    registry.add(
        111,
        &json!({"type": "record", "name": "Wide", "fields": wide}),
    );

    let mut config = h.config(
        "g-avro-budget",
        vec![counter(
            "apps",
            &["app"],
            "ab:{app}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::from_secs(86_400),
        )],
    );
    config.decode.format = tally::config::Format::Avro;
    config.decode.schema_registry = Some(registry.config(None));
    config.decode.dead_letter_topic = Some("avro-budget-dlq".into());
    config.decode.max_schema_nodes = 1_000;
    config.validate().expect("valid");

    let now = Utc::now().timestamp_millis();
    let hh = Utc.timestamp_millis_opt(now).unwrap().format("%Y%m%d%H");
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    let mut good = |h: &mut Harness, name: &str, id: u32| {
        h.produce(0, &framed(id, &app(name)), Some(now));
        *want.entry(format!("ab:{name}:{hh}")).or_default() += 1;
    };
    for _ in 0..3 {
        good(&mut h, "before", 1);
    }
    // Its event as written to attack: `app`, nothing of the records.
    h.produce(0, &framed(108, &app("a")), Some(now));
    good(&mut h, "zero", 109);
    h.produce(
        0,
        &framed(110, &[0x02, b'a', 0xfe, 0xff, 0xff, 0x0f, 0x00]),
        Some(now),
    );
    h.produce(0, &framed(111, &app("a")), Some(now));
    for _ in 0..2 {
        good(&mut h, "after", 1);
    }
    h.flush_producer();

    let running = h.start(config);
    let m = running.metrics.clone();
    h.wait_applied("g-avro-budget", Duration::from_secs(60))
        .await;
    let errors = |reason: &str| crate::common::decode_errors(&m, reason);
    wait_for("the bad events counted", Duration::from_secs(20), || {
        errors("not_avro") + errors("too_complex") + errors("schema_too_large") == 3
    })
    .await;
    running.stop().await;
    assert_eq!(
        (
            errors("not_avro"),
            errors("too_complex"),
            errors("schema_too_large")
        ),
        (1, 1, 1)
    );
    assert_eq!(
        h.dump("ab:*"),
        want,
        "every ordinary event counted exactly, before and after the bombs"
    );
    let letters =
        crate::common::dead_letters::read(&h, "avro-budget-dlq", 3, Duration::from_secs(20));
    let reasons: Vec<&str> = letters
        .iter()
        .filter_map(|l| l.header("tally-reason"))
        .collect();
    assert_eq!(reasons, ["not_avro", "too_complex", "schema_too_large"]);
    // Expanded, the first schema's plan alone would take gigabytes.
    let peak = peak_rss_mib();
    eprintln!("peak RSS {peak} MiB");
    assert!(peak < 512, "peak RSS {peak} MiB");
}

/// `tally check` (and so a start) refuses a schema file over the budget, naming the key; the
/// same schema within the default budget passes.
#[test]
fn tally_check_refuses_a_schema_file_over_the_node_budget() {
    let dir = std::env::temp_dir().join(format!("tally-avro-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("bomb.avsc");
    std::fs::write(&schema, nested_eights("int").to_string()).unwrap();
    let decode = format!(
        "[decode]\nformat = \"avro\"\nschema_file = {:?}\n",
        schema.display().to_string()
    );
    crate::common::schemas::check_refuses_over_budget(
        &dir,
        &decode,
        "max_schema_nodes = 50\n",
        "decode.schema_file",
    );
    let _ = std::fs::remove_dir_all(dir);
}
