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
    let schema = Schema::parse_str(text).map_err(|e| SchemaError::Unreadable(e.to_string()))?;
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
