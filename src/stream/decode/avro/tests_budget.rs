//! The Avro decoder within its budgets: schemas of reused named types compile to their size
//! (not their expansion), values that take no bytes are skipped at once, a plan past the node
//! budget is refused, and a datum past the item budget is `too_complex`.

use std::time::{Duration, Instant};

use apache_avro::Schema;
use serde_json::json;

use super::super::paths::Node;
use super::super::{DecodeError, FieldValue};
use super::plan::{self, AvroKind, Refused};
use super::run;
use crate::config::FieldSource;

/// 8 record types of 8 fields, each of the previous type (`leaf`: the first type's one field):
/// 8^8 values when expanded. A producer can register it in 2.7 KB.
pub(crate) fn nested_eights(leaf: &str) -> String {
    let mut fields = vec![
        json!({"name": "app", "type": "string"}),
        json!({"name": "t0", "type": {"type": "record", "name": "T0",
            "fields": [{"name": "x", "type": leaf}]}}),
    ];
    for i in 1..9 {
        let inner: Vec<_> = (0..8)
            .map(|j| json!({"name": format!("f{j}"), "type": format!("T{}", i - 1)}))
            .collect();
        fields.push(json!({"name": format!("t{i}"),
            "type": {"type": "record", "name": format!("T{i}"), "fields": inner}}));
    }
    json!({"type": "record", "name": "Root", "fields": fields}).to_string()
}

/// The wanted fields `paths`, slot by slot.
fn root(paths: &[&str]) -> Node {
    let mut root = Node::default();
    for (slot, path) in paths.iter().enumerate() {
        let FieldSource::Payload(p) = FieldSource::parse(path).unwrap() else {
            unreachable!()
        };
        root.insert(&p, slot);
    }
    root
}

fn compile(text: &str, root: &Node, max: usize) -> Result<plan::Compiled, Refused> {
    plan::compile(&Schema::parse_str(text).unwrap(), root, max)
}

#[test]
fn reused_types_compile_to_the_schema_size_not_its_expansion() {
    let started = Instant::now();
    let c = compile(&nested_eights("int"), &root(&["app"]), 100_000).unwrap();
    // Root, app, T0 and x, T1 to T8: each once.
    assert_eq!(c.nodes, 12);
    // Its event: `app`, then the records cut short: malformed, refused at once.
    let mut out = vec![None];
    assert_eq!(
        run(&c.plan, &[0x02, b'a'], &mut out),
        Err(DecodeError::NotAvro)
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // Below its size, the budget refuses it.
    let refused = compile(&nested_eights("int"), &root(&["app"]), 11).err();
    assert_eq!(refused, Some(Refused::TooLarge(11)));
    // A path deep into it plans one more copy per wanted level, no more.
    let deep = root(&["app", "t8.f7.f0.f1.f2.f3.f4.f5.f6.x"]);
    let c = compile(&nested_eights("int"), &deep, 100_000).unwrap();
    assert!(c.nodes < 12 + 2 * 9, "{} nodes", c.nodes);
}

#[test]
fn values_that_take_no_bytes_are_skipped_at_once() {
    // With a null leaf, the 8^8 values take no bytes: the datum is just `app`.
    let wanted = root(&["app", "t8.f7.f0.f1.f2.f3.f4.f5.f6.x"]);
    let c = compile(&nested_eights("null"), &wanted, 100_000).unwrap();
    let AvroKind::Record(fields) = &c.plan.kind else {
        panic!("a record")
    };
    assert!(
        matches!(fields[8].kind, AvroKind::Null),
        "t7 is skipped as a null"
    );
    let started = Instant::now();
    for _ in 0..1_000 {
        let mut out = vec![None, None];
        run(&c.plan, &[0x02, b'a'], &mut out).unwrap();
        assert_eq!(out[0], Some(FieldValue::Str("a".into())));
        assert_eq!(out[1], Some(FieldValue::Other), "the wanted null");
    }
    // Expanded, each event would visit 8^8 values.
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_shared_type_fills_the_slots_of_each_use() {
    let text = r#"{"type": "record", "name": "E", "fields": [
        {"name": "a", "type": {"type": "enum", "name": "M", "symbols": ["GET", "POST"]}},
        {"name": "b", "type": ["null", "M"]},
        {"name": "c", "type": {"type": "array", "items": "M"}},
        {"name": "d", "type": "M"}]}"#;
    let c = compile(text, &root(&["b", "c[1]", "d"]), 100_000).unwrap();
    let mut out = vec![None; 3];
    // a = POST, b = GET (branch 1), c = [GET, POST], d = POST
    let datum = [0x02, 0x02, 0x00, 0x04, 0x00, 0x02, 0x00, 0x02];
    run(&c.plan, &datum, &mut out).unwrap();
    let s = |v: &str| Some(FieldValue::Str(v.to_string().into()));
    assert_eq!(out, vec![s("GET"), s("POST"), s("POST")]);
}

#[test]
fn a_shared_type_used_too_deep_is_refused() {
    // C30 is 31 levels high: fine at the top, too deep under 5 more records.
    let mut fields = vec![json!({"name": "c0", "type":
        {"type": "record", "name": "C0", "fields": [{"name": "v", "type": "long"}]}})];
    for i in 1..=30 {
        fields = vec![json!({"name": format!("c{i}"), "type": {"type": "record",
            "name": format!("C{i}"), "fields": fields}})];
    }
    let mut wrapped = json!({"name": "w", "type": "C30"});
    for i in 0..5 {
        wrapped = json!({"name": "w", "type": {"type": "record", "name": format!("W{i}"),
            "fields": [wrapped]}});
    }
    fields.push(wrapped);
    let text = json!({"type": "record", "name": "R", "fields": fields}).to_string();
    match compile(&text, &root(&[]), 100_000) {
        Err(Refused::Unreadable(e)) => assert!(e.contains("deeper"), "{e}"),
        other => panic!("{:?}", other.map(|c| c.nodes)),
    }
}

#[test]
fn an_array_of_nulls_beyond_its_bytes_is_too_complex() {
    // 10 bytes: `app`, then 2^24 - 1 nulls in one block.
    let text = r#"{"type":"record","name":"Ev","fields":[{"name":"app","type":"string"},
        {"name":"junk","type":{"type":"array","items":"null"}}]}"#;
    let c = compile(text, &root(&["app"]), 100_000).unwrap();
    let datum = [0x02, b'a', 0xfe, 0xff, 0xff, 0x0f, 0x00];
    let started = Instant::now();
    for _ in 0..1_000 {
        let mut out = vec![None];
        assert_eq!(run(&c.plan, &datum, &mut out), Err(DecodeError::TooComplex));
    }
    // Read item by item, each would cost ~16 M iterations.
    assert!(started.elapsed() < Duration::from_secs(1));
    // As many nulls as 8 per byte, plus 1024, still read.
    let mut out = vec![None];
    let ok = [0x02, b'a', 0x80, 0x10, 0x00]; // 1024 nulls
    assert_eq!(run(&c.plan, &ok, &mut out), Ok(()));
}
