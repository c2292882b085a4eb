//! Avro schemas read from a file (`decode.schema_file`): parsed, and refused over the node
//! budget (`decode.max_schema_nodes`), so `tally check` and a start refuse what the decoder
//! would.

use apache_avro::Schema;

/// Why a schema text was refused.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// Not an Avro schema.
    #[error("{0}")]
    Unreadable(String),
    /// More nodes than the budget (the count so far, when it was passed).
    #[error("more than {max} schema nodes (types, fields and enum symbols, each named type once): over decode.max_schema_nodes, raise it or trim the schema")]
    TooLarge {
        /// The budget.
        max: usize,
    },
}

/// The schema of `text`, if it has at most `max_nodes` nodes.
pub fn schema(text: &str, max_nodes: usize) -> Result<Schema, SchemaError> {
    // apache-avro 0.21 panics on some texts instead of answering an error (an invalid name in
    // a named type nested in a record field: `Name::parse` unwraps it; found by the `avro`
    // fuzz target, seed `fuzz/regressions/avro/invalid_nested_name`). A schema is a producer's
    // input: its panic is this schema's refusal, not the lane's end.
    let parsed = std::panic::catch_unwind(|| Schema::parse_str(text)).map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the Avro schema parser failed");
        SchemaError::Unreadable(why.to_string())
    })?;
    let schema = parsed.map_err(|e| SchemaError::Unreadable(e.to_string()))?;
    match nodes(&schema, max_nodes) {
        Some(_) => Ok(schema),
        None => Err(SchemaError::TooLarge { max: max_nodes }),
    }
}

/// The nodes of `schema` (a named type is defined once in it, every other use is a reference,
/// so this is linear in its text), or None past `max`.
pub fn nodes(schema: &Schema, max: usize) -> Option<usize> {
    let mut count = 0;
    walk(schema, &mut count, max).then_some(count)
}

/// Adds the nodes of `schema` to `count`; false once it passes `max`.
fn walk(schema: &Schema, count: &mut usize, max: usize) -> bool {
    *count += 1;
    let within = match schema {
        Schema::Record(r) => r.fields.iter().all(|f| walk(&f.schema, count, max)),
        Schema::Enum(e) => {
            *count += e.symbols.len();
            true
        }
        Schema::Array(a) => walk(&a.items, count, max),
        Schema::Map(m) => walk(&m.types, count, max),
        Schema::Union(u) => u.variants().iter().all(|v| walk(v, count, max)),
        Schema::Decimal(d) => walk(&d.inner, count, max),
        _ => true,
    };
    within && *count <= max
}

#[cfg(test)]
#[test]
fn a_schema_the_parser_panics_on_is_refused() {
    // A record named `T&` nested in a field: apache-avro 0.21 unwraps the invalid name.
    let text = r#"{"type": "record", "name": "Root", "fields": [
        {"name": "t", "type": {"type": "record", "name": "T&", "fields": []}}]}"#;
    let refused = schema(text, 100_000).expect_err("an invalid name");
    assert!(matches!(refused, SchemaError::Unreadable(_)), "{refused}");
}
