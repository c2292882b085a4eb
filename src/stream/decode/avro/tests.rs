//! The Avro reader against apache-avro's writer: wanted fields at any depth, unions, enums,
//! arrays, maps, logical times; malformed datums refused; two writer versions read alike.

use std::borrow::Cow;

use apache_avro::types::Value;
use apache_avro::{to_avro_datum, Schema};

use super::super::paths::Node;
use super::super::FieldValue;
use super::{plan, run};
use crate::config::{FieldSource, Segment};

const SCHEMA: &str = r#"{
  "type": "record", "name": "Event", "namespace": "t",
  "fields": [
    {"name": "route", "type": "string"},
    {"name": "skip_me", "type": {"type": "array", "items": {"type": "map", "values": "double"}}},
    {"name": "request", "type": {"type": "record", "name": "Request", "fields": [
      {"name": "method", "type": {"type": "enum", "name": "Method", "symbols": ["GET", "POST"]}},
      {"name": "bytes", "type": "long"}
    ]}},
    {"name": "region", "type": ["null", "string"], "default": null},
    {"name": "items", "type": {"type": "array", "items": "Request"}},
    {"name": "labels", "type": {"type": "map", "values": "string"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "ok", "type": "boolean"},
    {"name": "ratio", "type": "float"}
  ]
}"#;

/// Slots: 0 route, 1 request.method, 2 request.bytes, 3 region, 4 items[1].bytes,
/// 5 labels.team, 6 at, 7 ok, 8 ratio.
fn root() -> Node {
    let mut root = Node::default();
    for (slot, path) in [
        "route",
        "request.method",
        "request.bytes",
        "region",
        "items[1].bytes",
        "labels.team",
        "at",
        "ok",
        "ratio",
    ]
    .iter()
    .enumerate()
    {
        let FieldSource::Payload(p) = FieldSource::parse(path).unwrap() else {
            unreachable!()
        };
        root.insert(&p, slot);
    }
    root
}

fn request(method: u32, symbol: &str, bytes: i64) -> Value {
    Value::Record(vec![
        ("method".into(), Value::Enum(method, symbol.into())),
        ("bytes".into(), Value::Long(bytes)),
    ])
}

fn event(region: Option<&str>) -> Value {
    Value::Record(vec![
        ("route".into(), Value::String("/orders".into())),
        (
            "skip_me".into(),
            Value::Array(vec![Value::Map(
                [("x".to_string(), Value::Double(1.5))].into(),
            )]),
        ),
        ("request".into(), request(1, "POST", 42)),
        (
            "region".into(),
            match region {
                Some(r) => Value::Union(1, Box::new(Value::String(r.into()))),
                None => Value::Union(0, Box::new(Value::Null)),
            },
        ),
        (
            "items".into(),
            Value::Array(vec![request(0, "GET", 1), request(0, "GET", 7)]),
        ),
        (
            "labels".into(),
            Value::Map(
                [
                    ("team".to_string(), Value::String("pay".into())),
                    ("z".to_string(), Value::String("q".into())),
                ]
                .into(),
            ),
        ),
        ("at".into(), Value::TimestampMicros(1_722_531_600_123_456)),
        ("ok".into(), Value::Boolean(true)),
        ("ratio".into(), Value::Float(0.5)),
    ])
}

/// The plan of `schema` for `root`, within the default budget.
pub(super) fn compiled(schema: &Schema, root: &Node) -> plan::AvroPlan {
    plan::compile(schema, root, 100_000).unwrap().plan
}

fn read(datum: &[u8]) -> Result<Vec<Option<FieldValue<'_>>>, super::DecodeError> {
    let schema = Schema::parse_str(SCHEMA).unwrap();
    let plan = compiled(&schema, &root());
    let mut out = vec![None; 9];
    run(&plan, datum, &mut out).map(|()| out)
}

#[test]
fn wanted_fields_at_any_depth() {
    let schema = Schema::parse_str(SCHEMA).unwrap();
    let datum = to_avro_datum(&schema, event(Some("eu"))).unwrap();
    let out = read(&datum).unwrap();
    fn s(v: &str) -> Option<FieldValue<'_>> {
        Some(FieldValue::Str(Cow::Borrowed(v)))
    }
    assert_eq!(out[0], s("/orders"));
    assert!(
        matches!(out[0], Some(FieldValue::Str(Cow::Borrowed(_)))),
        "borrowed"
    );
    assert_eq!(out[1], Some(FieldValue::Str(Cow::Owned("POST".into()))));
    assert_eq!(out[2], Some(FieldValue::Int(42)));
    assert_eq!(out[3], s("eu"));
    assert_eq!(out[4], Some(FieldValue::Int(7)));
    assert_eq!(out[5], s("pay"));
    assert_eq!(
        out[6],
        Some(FieldValue::Int(1_722_531_600_123)),
        "micros to ms"
    );
    assert_eq!(out[7], Some(FieldValue::Bool(true)));
    assert_eq!(out[8], Some(FieldValue::Float(0.5)));
    let datum = to_avro_datum(&schema, event(None)).unwrap();
    assert_eq!(
        read(&datum).unwrap()[3],
        Some(FieldValue::Other),
        "null branch"
    );
}

#[test]
fn malformed_datums_are_refused() {
    let schema = Schema::parse_str(SCHEMA).unwrap();
    let datum = to_avro_datum(&schema, event(Some("eu"))).unwrap();
    for end in 0..datum.len() {
        assert!(read(&datum[..end]).is_err(), "cut at {end}");
    }
    let mut longer = datum.clone();
    longer.push(0);
    assert!(read(&longer).is_err(), "a byte left over");
    // Every single-byte change either still reads or is refused: never a panic.
    for i in 0..datum.len() {
        for b in [0u8, 1, 0x7f, 0x80, 0xff] {
            let mut bad = datum.clone();
            bad[i] = b;
            let _ = read(&bad);
        }
    }
    // A huge block count of items that take bytes is malformed, refused before looping.
    let mut huge = vec![0x0c];
    huge.extend_from_slice(b"/route");
    huge.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0x0f]);
    assert_eq!(read(&huge), Err(super::DecodeError::NotAvro));
}

#[test]
fn schema_versions_each_read_with_their_own() {
    // v2 adds a field in front and drops `region`: the same paths still find their values.
    let v2 = r#"{"type": "record", "name": "Event", "fields": [
        {"name": "tenant", "type": "string"},
        {"name": "route", "type": "string"},
        {"name": "request", "type": {"type": "record", "name": "Request", "fields": [
            {"name": "bytes", "type": "int"},
            {"name": "method", "type": "string"}]}}]}"#;
    let schema = Schema::parse_str(v2).unwrap();
    let plan = compiled(&schema, &root());
    let value = Value::Record(vec![
        ("tenant".into(), Value::String("acme".into())),
        ("route".into(), Value::String("/r".into())),
        (
            "request".into(),
            Value::Record(vec![
                ("bytes".into(), Value::Int(5)),
                ("method".into(), Value::String("GET".into())),
            ]),
        ),
    ]);
    let datum = to_avro_datum(&schema, value).unwrap();
    let mut out = vec![None; 9];
    run(&plan, &datum, &mut out).unwrap();
    assert_eq!(out[0], Some(FieldValue::Str(Cow::Borrowed("/r"))));
    assert_eq!(out[1], Some(FieldValue::Str(Cow::Borrowed("GET"))));
    assert_eq!(out[2], Some(FieldValue::Int(5)));
    assert_eq!(out[3], None, "a field this version lacks is missing");
}

#[test]
fn recursive_and_non_record_schemas_are_refused() {
    let list = r#"{"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"]}]}"#;
    let schema = Schema::parse_str(list).unwrap();
    let mut root = Node::default();
    root.insert(&[Segment::Key("v".into())], 0);
    let refused = |schema: &Schema| match plan::compile(schema, &root, 100_000) {
        Err(plan::Refused::Unreadable(e)) => e,
        _ => panic!("compiled"),
    };
    assert!(refused(&schema).contains("recursive"));
    let schema = Schema::parse_str(r#""string""#).unwrap();
    assert!(refused(&schema).contains("not a record"));
}

#[test]
fn items_that_take_no_bytes_cannot_spin_a_lane() {
    // An array of nulls: each item is zero bytes, so only the item budget bounds the work.
    let schema = Schema::parse_str(
        r#"{"type": "record", "name": "Z", "fields": [{"name": "zs", "type": {"type": "array", "items": "null"}}]}"#,
    )
    .unwrap();
    let plan = compiled(&schema, &Node::default());
    let mut datum = Vec::new();
    for _ in 0..1_000 {
        datum.extend_from_slice(&[0x80, 0x80, 0x80, 0x01]); // zigzag 2^20 items
    }
    datum.push(0);
    let started = std::time::Instant::now();
    assert_eq!(
        run(&plan, &datum, &mut []),
        Err(super::DecodeError::TooComplex),
        "2^30 items refused"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Within the budget (8 items per byte, plus 1024) it reads: 1000 nulls in 3 bytes.
    let ok = [0xd0, 0x0f, 0];
    assert!(run(&plan, &ok, &mut []).is_ok());
}
