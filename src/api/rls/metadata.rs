//! The dynamic metadata of an answer, in envoyproxy/ratelimit's shape (its
//! `ratelimitToMetadata`, sent when `RESPONSE_DYNAMIC_METADATA=true`), so that Envoy configs
//! written for it read the same fields. Envoy files it under the filter's namespace
//! (`envoy.filters.http.ratelimit`):
//!
//! ```text
//! domain: <the request's domain>
//! descriptors: [{entries: ["key=value", …], limit: "<override>", hitsAddend: n}, …]   (every descriptor, in order)
//! hitsAddend: <the request's hits_addend, when not 0>
//! metadata: <the configured metadata of every descriptor whose status is OK, merged in order>
//! ```
//!
//! Merging: a key already present keeps its value (the first passing descriptor wins), except
//! that two mappings merge key by key; `metadata` is absent when nothing passing has any. So a
//! route reads `%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service:name)%` and
//! gets the first quota that still has room.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use serde_json::Value as Json;

/// The answer's dynamic metadata: `passed` holds, per descriptor in order, the configured
/// metadata of those whose status is OK.
pub fn build<'a>(
    req: &RateLimitRequest,
    passed: impl IntoIterator<Item = &'a serde_json::Map<String, Json>>,
) -> Struct {
    let mut fields = std::collections::HashMap::with_capacity(4);
    fields.insert("domain".to_string(), string(req.domain.clone()));
    let descriptors = req.descriptors.iter().map(descriptor).collect();
    fields.insert(
        "descriptors".to_string(),
        kind(Kind::ListValue(ListValue {
            values: descriptors,
        })),
    );
    if req.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_string(),
            kind(Kind::NumberValue(f64::from(req.hits_addend))),
        );
    }
    let mut merged = Struct::default();
    for m in passed {
        merge(&mut merged, m);
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_string(), kind(Kind::StructValue(merged)));
    }
    Struct { fields }
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut fields = std::collections::HashMap::with_capacity(3);
    let entries = d
        .entries
        .iter()
        .map(|e| string(format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert(
        "entries".to_string(),
        kind(Kind::ListValue(ListValue { values: entries })),
    );
    if let Some(o) = &d.limit {
        // As Go prints the message (`requests_per_unit:10 unit:MINUTE`).
        let unit = RateLimitUnit::try_from(o.unit).map_or("UNKNOWN", |u| u.as_str_name());
        fields.insert(
            "limit".to_string(),
            string(format!(
                "requests_per_unit:{} unit:{unit}",
                o.requests_per_unit
            )),
        );
    }
    if let Some(a) = &d.hits_addend {
        // A float, as every Struct number (an addend above 2^53 is rounded, as in Go).
        fields.insert(
            "hitsAddend".to_string(),
            kind(Kind::NumberValue(a.value as f64)),
        );
    }
    kind(Kind::StructValue(Struct { fields }))
}

/// Add `src` to `dest`: new keys are added; a key present in both keeps `dest`'s value unless
/// both are mappings, which merge.
fn merge(dest: &mut Struct, src: &serde_json::Map<String, Json>) {
    for (k, v) in src {
        match dest.fields.get_mut(k) {
            None => {
                dest.fields.insert(k.clone(), value(v));
            }
            Some(Value {
                kind: Some(Kind::StructValue(inner)),
            }) => {
                if let Json::Object(map) = v {
                    merge(inner, map);
                }
            }
            Some(_) => {}
        }
    }
}

/// A JSON value as a protobuf `Value` (numbers were checked at load to be exact as floats).
fn value(v: &Json) -> Value {
    kind(match v {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(value).collect(),
        }),
        Json::Object(map) => {
            let mut s = Struct::default();
            merge(&mut s, map);
            Kind::StructValue(s)
        }
    })
}

fn kind(k: Kind) -> Value {
    Value { kind: Some(k) }
}

fn string(s: String) -> Value {
    kind(Kind::StringValue(s))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    fn json(text: &str) -> serde_json::Map<String, Json> {
        serde_json::from_str(text).unwrap()
    }

    fn get<'a>(s: &'a Struct, path: &[&str]) -> Option<&'a Kind> {
        let (last, inner) = path.split_last()?;
        let mut at = s;
        for p in inner {
            match at.fields.get(*p)?.kind.as_ref()? {
                Kind::StructValue(next) => at = next,
                _ => return None,
            }
        }
        at.fields.get(*last)?.kind.as_ref()
    }

    #[test]
    fn shape_matches_envoyproxy_ratelimit() {
        let req = RateLimitRequest {
            domain: "rl".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "service".into(),
                        value: "service_1".into(),
                    }],
                    hits_addend: Some(UInt64Value { value: 0 }),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "a".into(),
                            value: "b".into(),
                        },
                        Entry {
                            key: "c".into(),
                            value: "".into(),
                        },
                    ],
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 10,
                        unit: RateLimitUnit::Minute as i32,
                    }),
                    ..Default::default()
                },
            ],
            hits_addend: 3,
        };
        let s = build(&req, []);
        assert_eq!(get(&s, &["domain"]), Some(&Kind::StringValue("rl".into())));
        assert_eq!(get(&s, &["hitsAddend"]), Some(&Kind::NumberValue(3.0)));
        assert!(get(&s, &["metadata"]).is_none(), "nothing passing has any");
        let Some(Kind::ListValue(list)) = get(&s, &["descriptors"]) else {
            panic!("descriptors: {s:?}")
        };
        let d = |i: usize| match &list.values[i].kind {
            Some(Kind::StructValue(d)) => d.clone(),
            other => panic!("{other:?}"),
        };
        let entries = |d: &Struct| match get(d, &["entries"]) {
            Some(Kind::ListValue(l)) => l
                .values
                .iter()
                .map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => s.clone(),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(entries(&d(0)), ["service=service_1"]);
        assert_eq!(get(&d(0), &["hitsAddend"]), Some(&Kind::NumberValue(0.0)));
        assert_eq!(entries(&d(1)), ["a=b", "c="]);
        assert_eq!(
            get(&d(1), &["limit"]),
            Some(&Kind::StringValue(
                "requests_per_unit:10 unit:MINUTE".into()
            ))
        );
        assert!(get(&d(1), &["hitsAddend"]).is_none());
    }

    #[test]
    fn the_first_passing_value_wins_and_mappings_merge() {
        let req = RateLimitRequest {
            domain: "rl".into(),
            ..Default::default()
        };
        let first = json(r#"{"service": {"name": "service_1"}, "tier": 1}"#);
        let second = json(
            r#"{"service": {"name": "service_2", "zone": "b"}, "tier": 2, "x": [1, null, true]}"#,
        );
        let s = build(&req, [&first, &second]);
        let m = |p: &[&str]| {
            let mut path = vec!["metadata"];
            path.extend_from_slice(p);
            get(&s, &path).cloned()
        };
        assert_eq!(
            m(&["service", "name"]),
            Some(Kind::StringValue("service_1".into()))
        );
        assert_eq!(m(&["service", "zone"]), Some(Kind::StringValue("b".into())));
        assert_eq!(m(&["tier"]), Some(Kind::NumberValue(1.0)));
        assert_eq!(
            m(&["x"]),
            Some(Kind::ListValue(ListValue {
                values: vec![
                    kind(Kind::NumberValue(1.0)),
                    kind(Kind::NullValue(0)),
                    kind(Kind::BoolValue(true))
                ]
            }))
        );
        assert!(get(&s, &["hitsAddend"]).is_none(), "0 is left out");
    }
}
