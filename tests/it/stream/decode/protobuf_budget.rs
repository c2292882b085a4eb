//! Protobuf schemas over `decode.max_schema_nodes`: a registry schema over it is refused
//! before any plan is made, its events dead-lettered as `schema_too_large` while the events
//! around them count exactly; `tally check` refuses a descriptor file over it (exit 64).

use std::time::Duration;

use chrono::Utc;

use crate::common::registry::Registry;
use crate::common::schemas::descriptor_set;
use crate::common::{counter, wait_for, Harness};

/// `messages` message types of `fields` int32 fields each, the first also holding `route`.
fn wide_schema(messages: usize, fields: usize) -> String {
    let mut text = String::from("syntax = \"proto3\";\npackage shop;\n");
    for m in 0..messages {
        text += &format!("message E{m} {{ string route = 1;");
        for f in 2..fields + 2 {
            text += &format!(" int32 f{f} = {f};");
        }
        text += " }\n";
    }
    text
}

/// A Confluent frame of the first message type with `route` (field 1, length-delimited).
fn event(id: u32, route: &str) -> Vec<u8> {
    let mut p = vec![0];
    p.extend(id.to_be_bytes());
    p.push(0); // message indexes: [0], the file's first message
    p.extend([0x0a, route.len() as u8]);
    p.extend(route.as_bytes());
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_schema_over_the_node_budget_is_dead_lettered() {
    let registry = Registry::start(None);
    // 1 message of 1 field: 2 nodes; 40 messages of 26 fields: 1,080 nodes.
    registry.add_protobuf(1, &wide_schema(1, 0), &[]);
    registry.add_protobuf(2, &wide_schema(40, 25), &[]);
    let mut h = Harness::new("protobuf-budget", 1);
    h.mock.create_topic("protobuf-budget-dlq", 1, 1).unwrap();
    let now = Utc::now().timestamp_millis();
    for id in [1, 2, 1, 2, 1] {
        h.produce(0, &event(id, "/a"), Some(now));
    }
    h.flush_producer();
    let routes = counter(
        "routes",
        &["route"],
        "pb:{route}:{yyyyMMddHH}",
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(86_400),
    );
    let mut config = h.config("g-pb-budget", vec![routes]);
    config.kafka.consumers = tally::config::Consumers::Count(1);
    config.decode.format = tally::config::Format::Protobuf;
    config.decode.schema_registry = Some(registry.config(None));
    config.decode.max_schema_nodes = 1_000;
    config.decode.dead_letter_topic = Some("protobuf-budget-dlq".into());
    let running = h.start(config);
    let m = running.metrics.clone();
    let too_large = || crate::common::decode_errors(&m, "schema_too_large");
    wait_for("both events refused", Duration::from_secs(30), || {
        too_large() == 2
    })
    .await;
    h.wait_applied("g-pb-budget", Duration::from_secs(30)).await;
    running.stop().await;
    let total: i64 = h.dump("pb:*").values().sum();
    assert_eq!(total, 3, "the events around the refused schema counted");
    assert_eq!(registry.asked(2), 1, "refused once, remembered");
    let letters =
        crate::common::dead_letters::read(&h, "protobuf-budget-dlq", 2, Duration::from_secs(20));
    let reasons: Vec<&str> = letters
        .iter()
        .filter_map(|l| l.header("tally-reason"))
        .collect();
    assert_eq!(reasons, ["schema_too_large"; 2]);
}

/// `tally check` (and so a start) refuses a descriptor file over the budget, naming the key;
/// the same file within the default budget passes.
#[test]
fn tally_check_refuses_a_descriptor_file_over_the_node_budget() {
    let dir = std::env::temp_dir().join(format!("tally-proto-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let descriptors = dir.join("wide.desc");
    std::fs::write(&descriptors, descriptor_set(&wide_schema(40, 25))).unwrap();
    let decode = format!(
        "[decode]\nformat = \"protobuf\"\ndescriptor_file = {:?}\nmessage = \"shop.E0\"\n",
        descriptors.display().to_string()
    );
    crate::common::schemas::check_refuses_over_budget(
        &dir,
        &decode,
        "max_schema_nodes = 1000\n",
        "decode.descriptor_file",
    );
    let _ = std::fs::remove_dir_all(dir);
}
