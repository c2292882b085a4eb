//! The `avro` target: an Avro writer schema and a datum, compiled and read as tally does for a
//! `decode.schema_file` (the same parse, node budget and plan as a registry schema).

use std::sync::Arc;

use tally::config::{DecodeConfig, Format, SchemaSource};
use tally::stream::decode::{DecodeError, Decoder, FieldRole};

/// The node budget of the target: small, so `schema_too_large` is reachable.
const MAX_NODES: usize = 2_000;

/// `data` is a schema's text, a NUL byte (never in JSON text), then the datum. A schema within
/// the budget is planned for fields at the top level, nested, in arrays and maps, and the datum
/// read: it is decoded or refused as bad Avro input; a panic, a hang (the fuzzer's `-timeout`)
/// or memory past the fuzzer's cap is a finding.
pub fn avro(data: &[u8]) {
    let (text, datum) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let Ok(schema) = parsing(|| tally::config::avro_schema(text, MAX_NODES)) else {
        return;
    };
    let mut config = DecodeConfig {
        max_schema_nodes: MAX_NODES,
        ..DecodeConfig::default()
    };
    for (name, path) in [
        ("deep", "t8.f7.f0.x"),
        ("item", "items[1].sku"),
        ("label", "labels.team"),
        ("either", "u"),
    ] {
        config.fields.insert(name.into(), path.into());
    }
    let mut compiled = config.compile().expect("a valid [decode]");
    compiled.config.format = Format::Avro;
    compiled.schema = SchemaSource::AvroFile(Arc::new(schema));
    let fields: Vec<(String, FieldRole)> = [
        ("app", FieldRole::Dimension),
        ("deep", FieldRole::Filter),
        ("item", FieldRole::Filter),
        ("label", FieldRole::Filter),
        ("either", FieldRole::Filter),
    ]
    .into_iter()
    .map(|(n, r)| (n.to_string(), r))
    .collect();
    let decoder = Decoder::new(&compiled, &fields);
    match decoder.decode(Some(datum), Some(0)) {
        Ok(_) => {}
        Err(
            DecodeError::NotAvro
            | DecodeError::TooComplex
            | DecodeError::SchemaTooLarge
            | DecodeError::UnknownSchema
            | DecodeError::MissingField
            | DecodeError::WrongType
            | DecodeError::TooLarge
            | DecodeError::Empty,
        ) => {}
        Err(e) => panic!("an avro datum refused as {e:?}"),
    }
}

thread_local! {
    /// Set while tally parses a schema text: apache-avro panics on some texts and tally catches
    /// that panic as the schema's refusal (`tally::config::avro_schema`).
    static PARSING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `parse` (tally's schema parse) with the parser's panics left to tally's own catch:
/// libFuzzer's panic hook aborts on every panic, even a caught one, so a hook in front of it
/// lets those through (every other panic still reaches libFuzzer's hook and is a finding).
fn parsing<T>(parse: impl FnOnce() -> T) -> T {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let next = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PARSING.with(|p| p.get()) {
                next(info)
            }
        }));
    });
    PARSING.with(|p| p.set(true));
    let parsed = parse();
    PARSING.with(|p| p.set(false));
    parsed
}
