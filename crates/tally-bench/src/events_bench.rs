//! `tally-bench events`: what reading events the way users write them costs the consumer loop
//! (decode → aggregate → seal, one thread, no Redis), on the same generated events, rounds
//! alternating so the machine's noise hits every variant:
//!
//! * flat JSON (the reference counter) against the same events nested
//!   (`{"client":{"app_id":…,"device_id":…,"ip":…},…}` read through `[decode.fields]`);
//! * the same events as bare Avro datums (`decode.format = "avro"` with a schema file);
//! * the same events as bare Protobuf messages (`decode.format = "protobuf"` with a descriptor
//!   set file), encoded here by hand (fields 1–5 in order, as every protobuf writer orders them);
//! * a second counter without a filter, against the same counter with a CEL filter that keeps
//!   half the events (`bytes % 2 == 0`) and one that keeps all (`bytes >= 0`: the evaluator's
//!   cost alone).
//!
//! ```sh
//! cargo run --release -p tally-bench -- events [--messages 2000000] [--rounds 3]
//! ```

use tally::config::{Config, CounterConfig};

use crate::pipeline_loop::{load_bench_config, run_loop, Messages};
use crate::proc_stats::median;

/// The same events with the reference counter's dimensions inside a `client` object.
fn nested(flat: &Messages) -> Messages {
    let mut buf = Vec::with_capacity(flat.buf.len() + flat.index.len() * 16);
    let mut index = Vec::with_capacity(flat.index.len());
    for (i, &(_, _, p, offset, ts)) in flat.index.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_slice(flat.payload(i)).expect("generated JSON");
        let one = serde_json::json!({
            "client": {"app_id": v["app_id"], "device_id": v["device_id"], "ip": v["ip"]},
            "ts": v["ts"],
            "bytes": v["bytes"],
        });
        let start = buf.len();
        serde_json::to_writer(&mut buf, &one).expect("in memory");
        index.push((start, buf.len() - start, p, offset, ts));
    }
    Messages { buf, index }
}

const AVRO_SCHEMA: &str = r#"{"type": "record", "name": "Event", "fields": [
    {"name": "app_id", "type": "string"}, {"name": "device_id", "type": "string"},
    {"name": "ip", "type": "string"}, {"name": "ts", "type": "long"}, {"name": "bytes", "type": "long"}]}"#;

/// The same events as bare Avro datums of [`AVRO_SCHEMA`].
fn avro(flat: &Messages) -> anyhow::Result<Messages> {
    use apache_avro::types::Value;
    let schema = apache_avro::Schema::parse_str(AVRO_SCHEMA)?;
    let mut buf = Vec::with_capacity(flat.buf.len());
    let mut index = Vec::with_capacity(flat.index.len());
    for (i, &(_, _, p, offset, ts)) in flat.index.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_slice(flat.payload(i))?;
        let s = |k: &str| Value::String(v[k].as_str().unwrap_or_default().to_string());
        let n = |k: &str| Value::Long(v[k].as_i64().unwrap_or_default());
        let record = Value::Record(vec![
            ("app_id".into(), s("app_id")),
            ("device_id".into(), s("device_id")),
            ("ip".into(), s("ip")),
            ("ts".into(), n("ts")),
            ("bytes".into(), n("bytes")),
        ]);
        let start = buf.len();
        buf.extend(apache_avro::to_avro_datum(&schema, record)?);
        index.push((start, buf.len() - start, p, offset, ts));
    }
    Ok(Messages { buf, index })
}

const PROTO_SCHEMA: &str = r#"syntax = "proto3";
package bench;
message Event { string app_id = 1; string device_id = 2; string ip = 3; int64 ts = 4; int64 bytes = 5; }
"#;

/// The same events as bare Protobuf messages of [`PROTO_SCHEMA`].
fn protobuf(flat: &Messages) -> anyhow::Result<Messages> {
    fn varint(buf: &mut Vec<u8>, mut n: u64) {
        while n >= 0x80 {
            buf.push(n as u8 | 0x80);
            n >>= 7;
        }
        buf.push(n as u8);
    }
    let mut buf = Vec::with_capacity(flat.buf.len());
    let mut index = Vec::with_capacity(flat.index.len());
    for (i, &(_, _, p, offset, ts)) in flat.index.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_slice(flat.payload(i))?;
        let start = buf.len();
        for (number, key) in [(1u8, "app_id"), (2, "device_id"), (3, "ip")] {
            let text = v[key].as_str().unwrap_or_default();
            buf.push(number << 3 | 2);
            varint(&mut buf, text.len() as u64);
            buf.extend_from_slice(text.as_bytes());
        }
        for (number, key) in [(4u8, "ts"), (5, "bytes")] {
            buf.push(number << 3);
            varint(&mut buf, v[key].as_i64().unwrap_or_default() as u64);
        }
        index.push((start, buf.len() - start, p, offset, ts));
    }
    Ok(Messages { buf, index })
}

/// [`PROTO_SCHEMA`] as a descriptor set file at `path`.
fn descriptor_file(path: &std::path::Path) -> anyhow::Result<()> {
    let dir = path.with_extension("d");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("bench.proto"), PROTO_SCHEMA)?;
    let mut compiler = protox::Compiler::new([&dir])?;
    compiler.open_file("bench.proto")?;
    std::fs::write(path, compiler.encode_file_descriptor_set())?;
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

fn with_second(base: &Config, filter: Option<&str>) -> Config {
    let mut c = base.clone();
    c.counters.push(CounterConfig {
        name: "by_app".into(),
        dimensions: vec!["app_id".into()],
        key: "bench:app:{app_id}:{yyyyMMddHH}".into(),
        filter: filter.map(String::from),
        ..c.counters[0].clone()
    });
    c
}

/// Removes the schema file when the run ends.
struct Remove(std::path::PathBuf);
impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Run the comparison and print it.
pub fn role_events(messages: u64, keys: u64, partitions: i32, rounds: usize) -> anyhow::Result<()> {
    // No flusher: the URL is never dialled.
    let base = load_bench_config("redis://127.0.0.1:9")?;
    let mut nested_config = base.clone();
    for d in ["app_id", "device_id", "ip"] {
        nested_config
            .decode
            .fields
            .insert(d.into(), format!("client.{d}"));
    }
    let flat = Messages::generate(keys, 1.1, 7, messages, partitions);
    let deep = nested(&flat);
    let binary = avro(&flat)?;
    let schema_file = std::env::temp_dir().join(format!("tally-bench-{}.avsc", std::process::id()));
    std::fs::write(&schema_file, AVRO_SCHEMA)?;
    let mut avro_config = base.clone();
    avro_config.decode.format = tally::config::Format::Avro;
    avro_config.decode.schema_file = Some(schema_file.clone());
    let proto = protobuf(&flat)?;
    let descriptors = schema_file.with_extension("pb");
    descriptor_file(&descriptors)?;
    let mut proto_config = base.clone();
    proto_config.decode.format = tally::config::Format::Protobuf;
    proto_config.decode.descriptor_file = Some(descriptors.clone());
    proto_config.decode.message = Some("bench.Event".into());
    let variants: Vec<(&str, Config, &Messages, usize)> = vec![
        ("flat JSON, 1 counter", base.clone(), &flat, 0),
        (
            "nested JSON via [decode.fields], 1 counter",
            nested_config,
            &deep,
            0,
        ),
        (
            "Avro (bare datums, schema file), 1 counter",
            avro_config,
            &binary,
            0,
        ),
        (
            "Protobuf (bare messages, descriptor file), 1 counter",
            proto_config,
            &proto,
            0,
        ),
        ("flat JSON, 2 counters", with_second(&base, None), &flat, 4),
        (
            "2nd counter filtered, keeps half",
            with_second(&base, Some("bytes % 2 == 0")),
            &flat,
            4,
        ),
        (
            "2nd counter filtered, keeps all",
            with_second(&base, Some("bytes >= 0")),
            &flat,
            4,
        ),
    ];
    let mut secs = vec![Vec::new(); variants.len()];
    let _cleanup = (Remove(schema_file), Remove(descriptors));
    for round in 0..rounds {
        for (i, (name, config, msgs, _)) in variants.iter().enumerate() {
            let r = run_loop(config, msgs, partitions, None, None)?;
            eprintln!(
                "round {round}: {name}: {:.2} s ({:.2} s CPU)",
                r.secs, r.cpu
            );
            secs[i].push(r.cpu);
        }
    }
    println!("| variant | median CPU s | events/s per core | vs |");
    println!("|---|---|---|---|");
    let medians: Vec<f64> = secs.into_iter().map(median).collect();
    for (i, (name, _, _, against)) in variants.iter().enumerate() {
        let s = medians[i];
        println!(
            "| {name} | {s:.2} | {:.0} | {:.3} × {} |",
            messages as f64 / s,
            medians[*against] / s,
            variants[*against].0
        );
    }
    Ok(())
}
