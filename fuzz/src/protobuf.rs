//! The `protobuf` target: bare Protobuf messages read through a descriptor file.

use std::sync::OnceLock;

use tally::config::{DecodeConfig, Format};
use tally::stream::decode::{Decoder, FieldRole};

/// A message with what makes reading hard: nesting, repeated fields, a oneof, an enum, a map,
/// a recursive field and every scalar kind.
const PROTO: &str = r#"syntax = "proto3";
package fuzz;
enum Kind { KIND_UNSPECIFIED = 0; WEB = 1; APP = 2; }
message Client { string region = 1; optional int64 id = 2; Client parent = 3; }
message Item { string sku = 1; repeated int32 counts = 2 [packed = true]; }
message Event {
  string app = 1; int64 at = 2; uint64 big = 3; sint32 delta = 4; fixed64 f64 = 5;
  double ratio = 6; bool ok = 7; Kind kind = 8; bytes raw = 9; Client client = 10;
  repeated Item items = 11; map<string, string> tags = 12;
  oneof choice { string word = 13; int32 number = 14; }
  float f = 15; sfixed32 s32 = 16;
}
"#;

/// The decoder, built once: fields at every depth the plan supports.
fn decoder() -> &'static Decoder {
    static DECODER: OnceLock<Decoder> = OnceLock::new();
    DECODER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tally-fuzz-proto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("event.proto"), PROTO).expect("write .proto");
        let mut compiler = protox::Compiler::new([&dir]).expect("protox");
        compiler.include_imports(true);
        compiler
            .open_file("event.proto")
            .expect("the fuzz schema compiles");
        let file = dir.join("event.pb");
        std::fs::write(&file, compiler.encode_file_descriptor_set()).expect("write .pb");
        let mut config = DecodeConfig {
            format: Format::Protobuf,
            descriptor_file: Some(file),
            message: Some("fuzz.Event".into()),
            time_field: Some("at".into()),
            max_message_bytes: 1 << 16,
            max_value_bytes: 64,
            ..DecodeConfig::default()
        };
        let paths = [
            ("region", "client.region"),
            ("grand", "client.parent.parent.region"),
            ("sku", "items[1].sku"),
            ("count", "items[0].counts[2]"),
        ];
        for (name, path) in paths {
            config.fields.insert(name.into(), path.into());
        }
        let compiled = config.compile().expect("a valid [decode]");
        let mut fields: Vec<(String, FieldRole)> =
            ["app", "region", "grand", "sku", "kind", "word"]
                .iter()
                .map(|f| (f.to_string(), FieldRole::Dimension))
                .collect();
        for value in ["big", "delta", "ratio", "count", "number"] {
            fields.push((value.to_string(), FieldRole::Value));
        }
        Decoder::new(&compiled, &fields)
    })
}

/// `data` is one message. Decoding answers an event or an error, never a panic; a decoded
/// value respects `max_value_bytes`.
pub fn protobuf(data: &[u8]) {
    if let Ok(event) = decoder().decode(Some(data), Some(0)) {
        assert!(event.dims.iter().all(|d| d.len() <= 64), "max_value_bytes");
    }
}
