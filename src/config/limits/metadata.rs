//! A descriptor's `metadata` (envoyproxy/ratelimit's descriptor metadata): checked once at load
//! and kept as plain JSON-shaped data; the RLS turns it into Envoy's `google.protobuf.Struct`.
//!
//! What Envoy can carry is what a `Struct` holds: string keys; strings, numbers (64-bit
//! floats), booleans, null, lists and nested mappings. Anything else is refused here with its
//! path rather than changed on the way (envoyproxy/ratelimit turns a large integer into a
//! rounded float without a word).

use super::error::{invalid, LimitsProblem};
use serde_json::{Map, Number, Value};
use serde_yaml_ng::Value as Yaml;

/// The largest integer a `Struct`'s number (a 64-bit float) holds exactly: 2^53.
const EXACT_INTEGER: u64 = 1 << 53;

/// `metadata` at `path`, checked: `None` for an empty mapping (nothing to return), an error
/// naming the place for anything a `Struct` cannot hold exactly.
pub fn compile(path: &str, yaml: &Yaml) -> Result<Option<Map<String, Value>>, LimitsProblem> {
    let Yaml::Mapping(map) = yaml else {
        return invalid(format!(
            "`{path}.metadata`: must be a mapping of keys to values (it is returned as Envoy dynamic metadata, a Struct)"
        ));
    };
    let out = object(&format!("{path}.metadata"), map)?;
    Ok((!out.is_empty()).then_some(out))
}

fn object(at: &str, map: &serde_yaml_ng::Mapping) -> Result<Map<String, Value>, LimitsProblem> {
    let mut out = Map::new();
    for (k, v) in map {
        let Yaml::String(key) = k else {
            return invalid(format!(
                "`{at}`: key {} is not a string (Struct keys are strings; quote it)",
                serde_yaml_ng::to_string(k).unwrap_or_default().trim()
            ));
        };
        out.insert(key.clone(), value(&format!("{at}.{key}"), v)?);
    }
    Ok(out)
}

fn value(at: &str, yaml: &Yaml) -> Result<Value, LimitsProblem> {
    Ok(match yaml {
        Yaml::Null => Value::Null,
        Yaml::Bool(b) => Value::Bool(*b),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Number(n) => number(at, n)?,
        Yaml::Sequence(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| value(&format!("{at}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Mapping(map) => Value::Object(object(at, map)?),
        Yaml::Tagged(t) => {
            return invalid(format!(
                "`{at}`: the tagged value `{}` cannot be returned as metadata",
                t.tag
            ))
        }
    })
}

fn number(at: &str, n: &serde_yaml_ng::Number) -> Result<Value, LimitsProblem> {
    let too_big = || {
        format!(
            "`{at}`: {n} is beyond ±{EXACT_INTEGER}, which a Struct number (a 64-bit float) holds exactly; quote it to send it as a string"
        )
    };
    if let Some(i) = n.as_i64() {
        if i.unsigned_abs() > EXACT_INTEGER {
            return invalid(too_big());
        }
        return Ok(Value::Number(i.into()));
    }
    if let Some(u) = n.as_u64() {
        if u > EXACT_INTEGER {
            return invalid(too_big());
        }
        return Ok(Value::Number(u.into()));
    }
    n.as_f64()
        .and_then(Number::from_f64)
        .map(Value::Number)
        .ok_or_else(|| LimitsProblem::Invalid(format!("`{at}`: {n} is not a finite number")))
}
