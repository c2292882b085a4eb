//! Avro payloads (`decode.format = "avro"`).
//!
//! * With `[decode.schema_registry]`: the Confluent wire format (byte 0, the writer schema's id
//!   as 4 big-endian bytes, the datum); schemas fetched by id and cached (see [`super::schema`]).
//!   Each event is read with its own writer's schema, so events written with several versions
//!   of a schema count into the same counters (a field a version lacks is `missing_field`).
//! * With `decode.schema_file`: bare datums, all written with that schema.
//!
//! What happens to an event that cannot be read: a frame that is not one, or a datum its schema
//! does not fit, is `not_avro`; an id the registry does not know (404), or a schema tally cannot
//! read, is `unknown_schema` (both counted and dead-lettered like any bad input). A registry
//! outage is waited out ([`super::schema`]).

mod plan;
mod read;

use crate::config::SchemaSource;

use super::paths::Node;
use super::schema::{Cache, Source};
use super::{DecodeError, FieldValue};
use plan::Plan;

/// Where schemas come from, and the compiled ones.
pub(super) struct Avro {
    source: Source<Plan>,
}

impl Avro {
    /// The reader of `schema` (compiled with the model: the file read once), for the wanted
    /// fields of `root`.
    pub(super) fn new(schema: &SchemaSource, root: &Node) -> Avro {
        let source = match schema {
            SchemaSource::Registry(r) => Source::Registry(Cache::new(r)),
            SchemaSource::AvroFile(schema) => {
                let plan = plan::compile(schema, root)
                    .map_err(|e| {
                        tracing::error!(error = %e, "avro schema file unusable: every event is unknown_schema");
                    })
                    .ok();
                Source::File(plan.map(std::sync::Arc::new))
            }
            _ => Source::File(None),
        };
        Avro { source }
    }

    /// Wait out registry outages until `stop` is cancelled.
    pub(super) fn stop_on(&mut self, stop: tokio_util::sync::CancellationToken) {
        self.source.stop_on(stop);
    }

    /// Reads `payload` into `out`.
    pub(super) fn read<'a>(
        &self,
        payload: &'a [u8],
        root: &Node,
        out: &mut [Option<FieldValue<'a>>],
    ) -> Result<(), DecodeError> {
        let (plan, datum) =
            self.source
                .resolve(payload, DecodeError::NotAvro, |s, _| match s.is("AVRO") {
                    true => Ok(compile(&s.schema, root)?),
                    false => Err(format!("a {:?} schema, not avro", s.schema_type).into()),
                })?;
        run(&plan, datum, out)
    }
}

/// The plan of the Avro schema `text` for the wanted fields of `root`.
fn compile(text: &str, root: &Node) -> Result<Plan, String> {
    let schema = apache_avro::Schema::parse_str(text).map_err(|e| e.to_string())?;
    plan::compile(&schema, root)
}

fn run<'a>(
    plan: &Plan,
    datum: &'a [u8],
    out: &mut [Option<FieldValue<'a>>],
) -> Result<(), DecodeError> {
    let mut r = read::Reader::new(datum);
    r.value(plan, out).ok_or(DecodeError::NotAvro)?;
    match r.at_end() {
        true => Ok(()),
        false => Err(DecodeError::NotAvro),
    }
}

#[cfg(test)]
mod tests;
