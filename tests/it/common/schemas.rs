//! The shop schemas the format tests write events with (Avro in two versions; Protobuf in two
//! versions importing a referenced schema), and the Python writers that frame events exactly as
//! Confluent producers do (`stream/decode/avro/write_events.py` with fastavro,
//! `stream/decode/protobuf/write_events.py` with Google's protobuf).

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::json;

/// Avro v1 of `shop.Request`: `method` an enum, `at` in epoch milliseconds.
pub fn avro_v1() -> serde_json::Value {
    json!({"type": "record", "name": "Request", "namespace": "shop", "fields": [
        {"name": "route", "type": "string"},
        {"name": "status", "type": "int"},
        {"name": "http", "type": {"type": "record", "name": "Http", "fields": [
            {"name": "method", "type": {"type": "enum", "name": "Method", "symbols": ["GET", "POST", "PUT"]}}]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]})
}

/// Avro v2: a field added in front, `status` now a long, a nullable region, `at` in
/// microseconds: the same fields found.
pub fn avro_v2() -> serde_json::Value {
    json!({"type": "record", "name": "Request", "namespace": "shop", "fields": [
        {"name": "tenant", "type": "string"},
        {"name": "http", "type": {"type": "record", "name": "Http", "fields": [
            {"name": "method", "type": "string"}, {"name": "path", "type": ["null", "string"], "default": null}]}},
        {"name": "route", "type": "string"},
        {"name": "region", "type": ["null", "string"], "default": null},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "status", "type": "long"}]})
}

/// Framed Avro payloads from fastavro, in input order; each item is `{"id", "schema",
/// "record"}`.
pub fn fastavro(items: &[serde_json::Value]) -> Vec<Vec<u8>> {
    let lines: String = items.iter().map(|i| format!("{i}\n")).collect();
    let payloads = python_writer("stream/decode/avro/write_events.py", lines);
    assert_eq!(payloads.len(), items.len());
    payloads
}

/// A referenced Protobuf schema (subject `shop-common`, version 1), imported by both versions.
pub const PROTO_COMMON: &str = r#"syntax = "proto3";
package shop;
enum Method { GET = 0; POST = 1; PUT = 2; }
"#;

pub const PROTO_V1: &str = r#"syntax = "proto3";
package shop;
import "shop/common.proto";
message Request {
  string route = 1;
  int32 status = 2;
  Http http = 3;
  int64 at = 4;
  message Http { Method method = 1; }
}
"#;

/// v2: a message declared in front (the events' type is now at index [1]), a field added,
/// `status` widened to int64, a nested message and a repeated one added.
pub const PROTO_V2: &str = r#"syntax = "proto3";
package shop;
import "shop/common.proto";
message Audit { string who = 1; }
message Request {
  string tenant = 5;
  Http http = 3;
  string route = 1;
  int64 status = 2;
  int64 at = 4;
  Client client = 6;
  repeated Item items = 7;
  message Http { Method method = 1; string path = 2; }
  message Client { string region = 1; }
}
message Item { string sku = 1; }
"#;

/// The descriptor set of `schema` (with its import), compiled from the same text the registry
/// serves: the Python writer builds its message classes from it.
pub fn descriptor_set(schema: &str) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "tally-proto-{}-{}-{}",
        std::process::id(),
        schema.len(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(dir.join("shop")).unwrap();
    std::fs::write(dir.join("shop/common.proto"), PROTO_COMMON).unwrap();
    std::fs::write(dir.join("event.proto"), schema).unwrap();
    let mut c = protox::Compiler::new([&dir]).unwrap();
    c.include_imports(true);
    c.open_file("event.proto").unwrap();
    let set = c.encode_file_descriptor_set();
    let _ = std::fs::remove_dir_all(dir);
    set
}

/// `{"v1": …, "v2": …}`: the descriptor sets of both versions, hex-encoded, as
/// [`protobuf_writer`] takes them.
pub fn proto_versions() -> serde_json::Value {
    json!({"v1": hex(&descriptor_set(PROTO_V1)), "v2": hex(&descriptor_set(PROTO_V2))})
}

/// Payloads from Google's protobuf (`stream/decode/protobuf/write_events.py`), in input order.
/// `schemas`: the descriptor set of each schema name the items use; `descriptor_set_out`: write that
/// schema's set to that file too.
pub fn protobuf_writer(
    schemas: serde_json::Value,
    descriptor_set_out: Option<(&str, &std::path::Path)>,
    items: &[serde_json::Value],
) -> Vec<Vec<u8>> {
    let out = descriptor_set_out.map(|(s, p)| json!({"schema": s, "path": p}));
    let head = json!({"schemas": schemas, "descriptor_set_out": out});
    let mut lines = format!("{head}\n");
    lines.extend(items.iter().map(|i| format!("{i}\n")));
    let payloads = python_writer("stream/decode/protobuf/write_events.py", lines);
    assert_eq!(payloads.len(), items.len());
    payloads
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the Python event writer `script` (under `tests/it/`) on the JSON `lines`; its output
/// is each payload as a 4-byte big-endian length and the bytes, returned in order.
fn python_writer(script: &str, lines: String) -> Vec<Vec<u8>> {
    let path = format!("{}/tests/it/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new("python3")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/setup.sh installs fastavro and protobuf)");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(lines.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{script} failed");
    let (mut payloads, mut rest) = (Vec::new(), &out.stdout[..]);
    while rest.len() >= 4 {
        let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        payloads.push(rest[4..4 + n].to_vec());
        rest = &rest[4 + n..];
    }
    payloads
}

/// `tally check` (and so a start) on a configuration of `decode` (a `[decode]` table naming a
/// schema file) passes within the default budget and, with `over` (a smaller
/// `max_schema_nodes`) added, exits 64 naming `key` and the budget. `dir` holds the file.
pub fn check_refuses_over_budget(dir: &std::path::Path, decode: &str, over: &str, key: &str) {
    let check = |budget: &str| {
        let config = dir.join("tally.toml");
        std::fs::write(&config, format!("{decode}{budget}")).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(["check", "--config", &config.display().to_string()])
            .env_remove("TALLY_CONFIG")
            .output()
            .unwrap()
    };
    let fits = check("");
    assert!(
        fits.status.success(),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );
    let over = check(over);
    let stderr = String::from_utf8_lossy(&over.stderr);
    assert_eq!(over.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(key) && stderr.contains("max_schema_nodes"),
        "{stderr}"
    );
}

/// The format tests' counters: `routes` per route (keys `{p}r:…`) and `errors` (status >= 500)
/// per route and method (`{p}e:…`), hourly, on one lane (each schema is then fetched exactly
/// once: every lane keeps its own cache), decoded as `format` through `registry`, timed by
/// `at`, the method read from `http.method`, dead letters to `dlq`.
pub fn routes_and_errors(
    h: &crate::common::Harness,
    group: &str,
    p: &str,
    format: tally::config::Format,
    registry: tally::config::RegistryConfig,
    dlq: &str,
) -> tally::config::Config {
    use crate::common::counter;
    use std::time::Duration;
    let hour = Duration::from_secs(3600);
    let day = Duration::from_secs(86_400);
    let routes = counter(
        "routes",
        &["route"],
        &format!("{p}r:{{route}}:{{yyyyMMddHH}}"),
        hour,
        "UTC",
        day,
    );
    let mut errors = counter(
        "errors",
        &["route", "method"],
        &format!("{p}e:{{route}}:{{method}}:{{yyyyMMddHH}}"),
        hour,
        "UTC",
        day,
    );
    errors.filter = Some("status >= 500".into());
    let mut config = h.config(group, vec![routes, errors]);
    config.kafka.consumers = tally::config::Consumers::Count(1);
    config.decode.format = format;
    config.decode.schema_registry = Some(registry);
    config.decode.time_field = Some("at".into());
    config.decode.dead_letter_topic = Some(dlq.into());
    config
        .decode
        .fields
        .insert("method".into(), "http.method".into());
    config.validate().expect("valid");
    config
}
