//! The Protobuf reader against prost-reflect's writer: every scalar type, nested and repeated
//! (packed) fields, oneof, proto3 defaults, enums, message indexes; unwanted fields and groups
//! skipped; hostile input refused without panicking; two schema versions read alike.

use std::borrow::Cow;
use std::collections::HashMap;

use prost::Message;
use prost_reflect::{DynamicMessage, MapKey, Value};

use super::super::paths::Node;
use super::super::{DecodeError, FieldValue};
use super::{build, Files, Messages, MAIN};
use crate::config::FieldSource;

const SCHEMA: &str = r#"
syntax = "proto3";
package t;
enum Method { GET = 0; POST = 1; }
message Request { Method method = 1; int64 bytes = 2; string path = 3; }
message Event {
  string route = 1;
  Request request = 2;
  repeated Request items = 3;
  int32 i32 = 4; int64 i64 = 5; uint32 u32 = 6; uint64 u64 = 7; sint32 s32 = 8; sint64 s64 = 9;
  fixed32 f32 = 10; fixed64 f64 = 11; sfixed32 sf32 = 12; sfixed64 sf64 = 13;
  double d = 14; float f = 15; bool ok = 16; bytes blob = 17;
  repeated int64 packed = 18;
  optional string region = 19;
  oneof choice { string name = 20; int64 number = 21; }
  map<string, string> labels = 22;
  message Inner { string x = 1; }
  Inner inner = 23;
}
"#;

const PATHS: [&str; 26] = [
    "route",           // 0
    "request.method",  // 1
    "request.bytes",   // 2
    "items[1].bytes",  // 3
    "i32",             // 4
    "i64",             // 5
    "u32",             // 6
    "u64",             // 7
    "s32",             // 8
    "s64",             // 9
    "f32",             // 10
    "f64",             // 11
    "sf32",            // 12
    "sf64",            // 13
    "d",               // 14
    "f",               // 15
    "ok",              // 16
    "blob",            // 17
    "packed[2]",       // 18
    "region",          // 19
    "name",            // 20
    "number",          // 21
    "labels[0].value", // 22
    "inner.x",         // 23
    "request.path",    // 24
    "items[0].method", // 25
];

/// The default `decode.max_schema_nodes`.
const BUDGET: usize = 100_000;

fn root() -> Node {
    let mut root = Node::default();
    for (slot, path) in PATHS.iter().enumerate() {
        let FieldSource::Payload(p) = FieldSource::parse(path).unwrap() else {
            unreachable!()
        };
        root.insert(&p, slot);
    }
    root
}

fn compiled(text: &str) -> Messages {
    build(
        Files(HashMap::from([(MAIN.into(), text.into())])),
        &root(),
        BUDGET,
    )
    .unwrap()
}

fn pool(text: &str) -> prost_reflect::DescriptorPool {
    let mut c =
        protox::Compiler::with_file_resolver(Files(HashMap::from([(MAIN.into(), text.into())])));
    c.open_file(MAIN).unwrap();
    c.descriptor_pool()
}

fn request(method: i32, bytes: i64) -> Value {
    let pool = pool(SCHEMA);
    let mut m = DynamicMessage::new(pool.get_message_by_name("t.Request").unwrap());
    m.set_field_by_name("method", Value::EnumNumber(method));
    m.set_field_by_name("bytes", Value::I64(bytes));
    Value::Message(m)
}

fn event() -> Vec<u8> {
    let pool = pool(SCHEMA);
    let mut m = DynamicMessage::new(pool.get_message_by_name("t.Event").unwrap());
    let set = |m: &mut DynamicMessage, k: &str, v: Value| m.set_field_by_name(k, v);
    set(&mut m, "route", Value::String("/orders".into()));
    set(&mut m, "request", request(1, 42));
    set(
        &mut m,
        "items",
        Value::List(vec![request(0, 1), request(1, 7)]),
    );
    set(&mut m, "i32", Value::I32(-5));
    set(&mut m, "i64", Value::I64(-6_000_000_000));
    set(&mut m, "u32", Value::U32(u32::MAX));
    set(&mut m, "u64", Value::U64(u64::MAX));
    set(&mut m, "s32", Value::I32(-7));
    set(&mut m, "s64", Value::I64(i64::MIN));
    set(&mut m, "f32", Value::U32(8));
    set(&mut m, "f64", Value::U64(9));
    set(&mut m, "sf32", Value::I32(-10));
    set(&mut m, "sf64", Value::I64(-11));
    set(&mut m, "d", Value::F64(1.25));
    set(&mut m, "f", Value::F32(0.5));
    set(&mut m, "ok", Value::Bool(true));
    set(&mut m, "blob", Value::Bytes(vec![1, 2, 3].into()));
    set(
        &mut m,
        "packed",
        Value::List([3, 4, 5, 6].map(Value::I64).to_vec()),
    );
    set(&mut m, "region", Value::String("eu".into()));
    set(&mut m, "number", Value::I64(12));
    set(
        &mut m,
        "labels",
        Value::Map(HashMap::from([(
            MapKey::String("team".into()),
            Value::String("pay".into()),
        )])),
    );
    m.encode_to_vec()
}

fn read<'a>(
    messages: &Messages,
    bytes: &'a [u8],
) -> Result<Vec<Option<FieldValue<'a>>>, DecodeError> {
    let mut out = vec![None; PATHS.len()];
    let mut reader = super::read::ProtoReader::new(bytes.len());
    match reader.message(bytes, &messages.0[1].1, &mut out) {
        Some(()) => Ok(out),
        None if reader.over_budget => Err(DecodeError::TooComplex),
        None => Err(DecodeError::NotProtobuf),
    }
}

fn s(v: &str) -> Option<FieldValue<'_>> {
    Some(FieldValue::Str(Cow::Borrowed(v)))
}

fn int(n: i64) -> Option<FieldValue<'static>> {
    Some(FieldValue::Int(n))
}

#[test]
fn every_field_type() {
    let messages = compiled(SCHEMA);
    assert_eq!(
        messages.0[1].0.as_slice(),
        [1],
        "Event is the file's second message"
    );
    let bytes = event();
    let out = read(&messages, &bytes).unwrap();
    assert!(
        matches!(out[0], Some(FieldValue::Str(Cow::Borrowed(_)))),
        "strings borrow from the message"
    );
    let want = vec![
        s("/orders"),
        s("POST"),
        int(42),
        int(7),
        int(-5),
        int(-6_000_000_000),
        int(u32::MAX.into()),
        Some(FieldValue::Float(u64::MAX as f64)),
        int(-7),
        int(i64::MIN),
        int(8),
        int(9),
        int(-10),
        int(-11),
        Some(FieldValue::Float(1.25)),
        Some(FieldValue::Float(0.5)),
        Some(FieldValue::Bool(true)),
        Some(FieldValue::Other),
        int(5),
        s("eu"),
        None,
        int(12),
        s("pay"),
        None,
        s(""),
        s("GET"),
    ];
    assert_eq!(out, want);
}

#[test]
fn proto3_defaults_for_scalars_absent_for_messages_and_presence() {
    let messages = compiled(SCHEMA);
    let out = read(&messages, &[]).unwrap();
    assert_eq!(out[0], s(""), "a string without presence reads \"\"");
    assert_eq!(out[4], int(0));
    assert_eq!(out[16], Some(FieldValue::Bool(false)));
    assert_eq!(out[14], Some(FieldValue::Float(0.0)));
    assert_eq!(out[1], None, "inside an absent message: absent");
    assert_eq!(out[19], None, "`optional` has presence");
    assert_eq!(out[20], None, "a oneof member has presence");
    assert_eq!(out[3], None, "an item the list lacks");
    // A present but empty request: its enum reads its first value.
    let out = read(&messages, &[0x12, 0x00]).unwrap();
    assert_eq!(out[1], s("GET"));
    assert_eq!(out[2], int(0));
}

#[test]
fn unknown_enum_numbers_read_as_the_number() {
    let messages = compiled(SCHEMA);
    // request { method: 9 }
    let out = read(&messages, &[0x12, 0x02, 0x08, 0x09]).unwrap();
    assert_eq!(out[1], int(9));
}

#[test]
fn unpacked_repeated_scalars_and_skipped_groups() {
    let messages = compiled(SCHEMA);
    // packed written unpacked (field 18, varint) three times; then an unknown group (field 30)
    // holding a varint and a nested group; then route.
    let mut bytes = vec![0x90, 0x01, 1, 0x90, 0x01, 2, 0x90, 0x01, 3];
    bytes.extend([0xf3, 0x01, 0x08, 0x01, 0xfb, 0x01, 0xfc, 0x01, 0xf4, 0x01]);
    bytes.extend([0x0a, 0x01, b'x']);
    let out = read(&messages, &bytes).unwrap();
    assert_eq!(out[18], int(3));
    assert_eq!(out[0], s("x"));
}

#[test]
fn message_indexes_select_the_type() {
    let messages = compiled(SCHEMA);
    let (plan, rest) = messages.select(&[0, 0xaa]).unwrap();
    assert!(std::ptr::eq(plan, &messages.0[0].1), "byte 0 is [0]");
    assert_eq!(rest, [0xaa]);
    let (plan, _) = messages.select(&[2, 2]).unwrap();
    assert!(std::ptr::eq(plan, &messages.0[1].1), "[1]");
    let (plan, _) = messages.select(&[4, 2, 2]).unwrap();
    let at = messages.0.iter().position(|(p, _)| p.as_slice() == [1, 1]);
    assert!(
        std::ptr::eq(plan, &messages.0[at.unwrap()].1),
        "[1, 1]: Event.Inner"
    );
    assert!(messages.select(&[2, 40]).is_none(), "no 21st message");
    assert!(messages.select(&[1]).is_none(), "a negative count");
    assert!(messages.select(&[2]).is_none(), "cut");
}

#[test]
fn hostile_messages_are_refused() {
    let messages = compiled(SCHEMA);
    let bytes = event();
    for n in 0..bytes.len() {
        let _ = read(&messages, &bytes[..n]); // never a panic
    }
    for i in 0..bytes.len() {
        for b in [0x00, 0x7f, 0x80, 0xff] {
            let mut m = bytes.clone();
            m[i] = b;
            let _ = read(&messages, &m);
        }
    }
    let bad: &[&[u8]] = &[
        &[0x0a, 0x05, b'a'],       // a length past the end
        &[0x08; 1],                // a key without its value
        &[0x80; 11],               // a varint past 10 bytes
        &[0x00, 0x01],             // field number 0
        &[0x08, 0x01],             // route (a string) as a varint
        &[0x0a, 0x02, 0xff, 0xfe], // invalid UTF-8 in a wanted string
        &[0xf4, 0x01],             // an end-group without its start
        &[0xf3, 0x01, 0xfc, 0x01], // a group ended by another number
        &[0xf3, 0x01],             // an unended group
        &[0xf7, 0x01],             // wire type 7
    ];
    for b in bad {
        assert_eq!(read(&messages, b), Err(DecodeError::NotProtobuf), "{b:?}");
    }
    // Groups nested past the bound: well-formed, but deeper than the reader goes.
    let mut deep: Vec<u8> = [0xf3, 0x01].repeat(100);
    deep.extend([0xf4, 0x01].repeat(100));
    assert_eq!(read(&messages, &deep), Err(DecodeError::TooComplex));
    let mut within: Vec<u8> = [0xf3, 0x01].repeat(64);
    within.extend([0xf4, 0x01].repeat(64));
    assert!(read(&messages, &within).is_ok(), "64 groups deep");
}

#[test]
fn schema_versions_each_read_with_their_own() {
    // v2 renumbers nothing but adds fields and a nested message before the wanted ones.
    let v2 = r#"syntax = "proto3"; package t;
        message Tenant { string id = 1; }
        message Event { Tenant tenant = 30; string route = 1; int64 i64 = 5; string extra = 31; }"#;
    let v2 = compiled(v2);
    let mut bytes = vec![0xf2, 0x01, 0x03, 0x0a, 0x01, b't'];
    bytes.extend([0x0a, 0x02, b'/', b'a', 0x28, 0x07, 0xfa, 0x01, 0x01, b'z']);
    let mut out = vec![None; PATHS.len()];
    super::read::ProtoReader::new(bytes.len())
        .message(&bytes, &v2.0[1].1, &mut out)
        .unwrap();
    assert_eq!(out[0], s("/a"));
    assert_eq!(out[5], int(7));
    assert_eq!(out[1], None, "v2 has no request");
}

#[test]
fn schemas_that_do_not_compile_are_refused() {
    let files = |t: &str| Files(HashMap::from([(MAIN.into(), t.into())]));
    assert!(build(files("syntax = \"proto3\"; message {"), &root(), BUDGET).is_err());
    assert!(build(
        files("syntax = \"proto3\"; import \"other.proto\";"),
        &root(),
        BUDGET
    )
    .is_err());
    // Well-known imports resolve without the registry.
    let t = r#"syntax = "proto3"; import "google/protobuf/timestamp.proto";
        message E { google.protobuf.Timestamp at = 1; string route = 2; }"#;
    let m = build(files(t), &root(), BUDGET).unwrap();
    let mut out = vec![None; PATHS.len()];
    super::read::ProtoReader::new(3)
        .message(&[0x12, 0x01, b'r'], &m.0[0].1, &mut out)
        .unwrap();
    assert_eq!(out[0], s("r"), "found by name, whatever its number");
}

#[test]
fn schemas_over_the_node_budget_are_too_large() {
    // 10 messages of 50 fields: 510 nodes.
    let mut text = String::from("syntax = \"proto3\"; package t;\n");
    for m in 0..10 {
        text += &format!("message E{m} {{");
        for f in 1..=50 {
            text += &format!(" int32 f{f} = {f};");
        }
        text += " }\n";
    }
    let files = || Files(HashMap::from([(MAIN.into(), text.clone())]));
    assert_eq!(build(files(), &root(), 510).unwrap().0.len(), 10);
    let Err(e) = build(files(), &root(), 509) else {
        panic!("over the budget, compiled")
    };
    assert_eq!(e.reason(), DecodeError::SchemaTooLarge, "{e}");
    assert!(e.to_string().contains("decode.max_schema_nodes"), "{e}");
    // Imports count too: a small schema importing a large one.
    let mut with_import = files();
    with_import.0.insert(
        "big.proto".into(),
        text.replace("package t;", "package big;"),
    );
    with_import.0.insert(
        MAIN.into(),
        "syntax = \"proto3\"; import \"big.proto\"; message R { big.E0 e = 1; }".into(),
    );
    let Err(e) = build(with_import, &root(), 509) else {
        panic!("over the budget with its imports, compiled")
    };
    assert_eq!(e.reason(), DecodeError::SchemaTooLarge, "{e}");
}
