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
//! read, is `unknown_schema`; a schema over `decode.max_schema_nodes` is `schema_too_large`;
//! a datum over the reader's item budget is `too_complex` (all counted and dead-lettered like
//! any bad input). A registry outage is waited out, the partition paused ([`super::schema`]).

mod plan;
mod read;

use std::sync::Arc;

use crate::config::SchemaSource;

use super::paths::Node;
use super::schema::{Cache, Compile, SchemaNews, Source, Unusable};
use super::{DecodeError, FieldValue};
use plan::{AvroPlan, Refused};

/// Where schemas come from, and the compiled ones.
pub(super) struct Avro {
    source: Source<AvroPlan>,
}

impl Avro {
    /// The reader of `schema` (compiled with the model: the file read once), for the wanted
    /// fields of `root`, each schema planned in at most `max_nodes` nodes; a registry's
    /// schemas kept for at most `max_schemas` ids.
    pub(super) fn new(
        schema: &SchemaSource,
        root: &Node,
        max_nodes: usize,
        max_schemas: usize,
    ) -> Avro {
        let source = match schema {
            SchemaSource::Registry(r) => {
                let root = root.clone();
                let compile: Compile<AvroPlan> = Arc::new(move |s, _| match s.is("AVRO") {
                    true => compile(&s.schema, &root, max_nodes),
                    false => Err(format!("a {:?} schema, not avro", s.schema_type).into()),
                });
                Source::Registry(Cache::new(r, max_schemas, compile))
            }
            SchemaSource::AvroFile(schema) => {
                let plan = plan::compile(schema, root, max_nodes).map_err(|e| {
                    let e = Unusable::from(e);
                    tracing::error!(error = %e, reason = e.reason().reason(), "avro schema file unusable for the wanted fields: every event is refused");
                    e.reason()
                });
                Source::File(plan.map(|c| Arc::new(c.plan)))
            }
            _ => Source::File(Err(DecodeError::UnknownSchema)),
        };
        Avro { source }
    }

    /// Ask the registry off the lane's thread until `stop` is cancelled.
    pub(super) fn stop_on(&mut self, stop: tokio_util::sync::CancellationToken) {
        self.source.stop_on(stop);
    }

    pub(super) fn news(&self) -> SchemaNews {
        self.source.news()
    }

    /// Reads `payload` into `out`.
    pub(super) fn read<'a>(
        &self,
        payload: &'a [u8],
        out: &mut [Option<FieldValue<'a>>],
    ) -> Result<(), DecodeError> {
        let (plan, datum) = self.source.resolve(payload, DecodeError::NotAvro)?;
        run(&plan, datum, out)
    }
}

/// The plan of the Avro schema `text` for the wanted fields of `root`: the text refused as
/// `tally check` refuses a schema file, then its plan within the same budget.
fn compile(text: &str, root: &Node, max_nodes: usize) -> Result<AvroPlan, Unusable> {
    let schema = crate::config::avro_schema(text, max_nodes).map_err(|e| match e {
        crate::config::AvroSchemaError::TooLarge { .. } => Unusable::TooLarge(e.to_string()),
        e => Unusable::Bad(e.to_string()),
    })?;
    let compiled = plan::compile(&schema, root, max_nodes)?;
    tracing::debug!(nodes = compiled.nodes, "avro schema planned");
    Ok(compiled.plan)
}

impl From<Refused> for Unusable {
    fn from(e: Refused) -> Unusable {
        match e {
            Refused::Unreadable(e) => Unusable::Bad(e),
            Refused::TooLarge(max) => Unusable::TooLarge(format!(
                "its plan for the wanted fields has more than {max} nodes: over decode.max_schema_nodes"
            )),
        }
    }
}

fn run<'a>(
    plan: &AvroPlan,
    datum: &'a [u8],
    out: &mut [Option<FieldValue<'a>>],
) -> Result<(), DecodeError> {
    let mut r = read::AvroReader::new(datum);
    let refused = |r: &read::AvroReader| match r.over_budget {
        true => DecodeError::TooComplex,
        false => DecodeError::NotAvro,
    };
    if r.value(plan, out).is_none() {
        return Err(refused(&r));
    }
    match r.at_end() {
        true => Ok(()),
        false => Err(DecodeError::NotAvro),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_budget;
