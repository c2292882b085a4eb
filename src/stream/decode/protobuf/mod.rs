//! Protobuf payloads (`decode.format = "protobuf"`).
//!
//! * With `[decode.schema_registry]`: the Confluent wire format: byte 0, the schema id (4
//!   big-endian bytes), the *message indexes* (a zigzag varint count, then that many zigzag
//!   varint indexes into the nested message declarations; the single byte 0 is `[0]`, the
//!   file's first message), then the message. The schema (`.proto` source, `schemaType:
//!   PROTOBUF`; its references fetched from their subjects) is compiled with protox once per id
//!   into a plan per message type (see [`super::schema`] for the cache and outages).
//! * With `decode.descriptor_file` and `decode.message`: bare messages of that type.
//!
//! Values: proto3 semantics. A scalar field without presence that a message lacks reads as its
//! default (0, "", false, the enum's first value); a field with presence (`optional`, a oneof
//! member, proto2), a message field, and a repeated field's missing item are absent
//! (`missing_field`). Enums read as their value's name (a number the schema does not name: the
//! number); uint64 and fixed64 past i64 as floats; bytes are not values.
//!
//! What cannot be read: a frame that is not one, an index past the schema's messages, or a
//! message its schema does not fit, is `not_protobuf`; a message over the reader's budget
//! (fields per byte, groups nested too deep) is `too_complex`; an unknown id or a schema that
//! does not compile is `unknown_schema`; a schema (with its imports) of more than
//! `decode.max_schema_nodes` messages, fields, enums, values and extensions is
//! `schema_too_large` (a descriptor file over it is refused by `tally check`).

mod plan;
mod read;

use std::collections::HashMap;
use std::sync::Arc;

use prost_reflect::MessageDescriptor;
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use smallvec::SmallVec;

use crate::config::SchemaSource;

use super::paths::Node;
use super::schema::registry::{Fetch, Registry, Schema};
use super::schema::{Cache, Compile, SchemaNews, Source, Unusable};
use super::{DecodeError, FieldValue};
use plan::ProtoPlan;

/// Message types compiled per schema at most (a file declaring more is `unknown_schema`).
const MAX_MESSAGES: usize = 10_000;

/// Schemas a registry schema may reference, directly or not.
const MAX_REFERENCES: usize = 100;

/// The file name the registry's schema text is compiled under (its imports are other names).
const MAIN: &str = "tally-registry-schema.proto";

/// Where schemas come from, and the compiled ones.
pub(super) struct Protobuf {
    source: Source<Messages>,
}

/// One schema's message types, compiled: by their message indexes (`[]` for the one message
/// of a descriptor file). The file's first message, the common case, is first.
struct Messages(Vec<(SmallVec<[u32; 2]>, ProtoPlan)>);

impl Protobuf {
    /// The reader of `schema` (compiled with the model: the descriptor file read once and
    /// refused over `max_nodes`), for the wanted fields of `root`; a registry's schemas
    /// refused over `max_nodes` and kept for at most `max_schemas` ids.
    pub(super) fn new(
        schema: &SchemaSource,
        root: &Node,
        max_nodes: usize,
        max_schemas: usize,
    ) -> Protobuf {
        let source = match schema {
            SchemaSource::Registry(r) => {
                let root = root.clone();
                let compile: Compile<Messages> =
                    Arc::new(move |s, r| compile(s, r, &root, max_nodes));
                Source::Registry(Cache::new(r, max_schemas, compile))
            }
            SchemaSource::ProtobufFile(message) => {
                let plan = plan::compile(message, root).map_err(|e| {
                    tracing::error!(message = message.full_name(), error = %e, "protobuf message unusable: every event is unknown_schema");
                    DecodeError::UnknownSchema
                });
                Source::File(plan.map(|p| Arc::new(Messages(vec![(SmallVec::new(), p)]))))
            }
            _ => Source::File(Err(DecodeError::UnknownSchema)),
        };
        Protobuf { source }
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
        let (messages, body) = self.source.resolve(payload, DecodeError::NotProtobuf)?;
        let (plan, message) = match &self.source {
            Source::File(_) => (&messages.0[0].1, body),
            Source::Registry(_) => messages.select(body).ok_or(DecodeError::NotProtobuf)?,
        };
        let mut reader = read::ProtoReader::new(message.len());
        match reader.message(message, plan, out) {
            Some(()) => Ok(()),
            None if reader.over_budget => Err(DecodeError::TooComplex),
            None => Err(DecodeError::NotProtobuf),
        }
    }
}

impl Messages {
    /// The plan the message indexes at the start of `body` select, and the message after them.
    fn select<'a>(&self, mut body: &'a [u8]) -> Option<(&ProtoPlan, &'a [u8])> {
        let zigzag = |b: &mut &[u8]| {
            let n = read::varint(b)?;
            i64::try_from(n >> 1).ok().map(|v| v ^ -((n & 1) as i64))
        };
        let count = usize::try_from(zigzag(&mut body)?).ok()?;
        let mut path: SmallVec<[u32; 2]> = SmallVec::new();
        if count == 0 {
            path.push(0);
        }
        if count > plan::MAX_DEPTH {
            return None;
        }
        for _ in 0..count {
            path.push(u32::try_from(zigzag(&mut body)?).ok()?);
        }
        let (_, plan) = self.0.iter().find(|(p, _)| *p == path)?;
        Some((plan, body))
    }
}

/// The registry's Protobuf schema `schema` (and the schemas it references) compiled, within
/// `max_nodes`: a plan for each of its message types.
fn compile(
    schema: &Schema,
    registry: &Registry,
    root: &Node,
    max_nodes: usize,
) -> Result<Messages, Unusable> {
    if !schema.is("PROTOBUF") {
        let kind = schema.schema_type.as_deref().unwrap_or("AVRO");
        return Err(Unusable::Bad(format!("a {kind} schema, not protobuf")));
    }
    let mut files = Files(HashMap::from([(MAIN.to_string(), schema.schema.clone())]));
    let mut wanted = schema.references.clone();
    while let Some(r) = wanted.pop() {
        if files.0.contains_key(&r.name) {
            continue;
        }
        if files.0.len() > MAX_REFERENCES {
            return Err(Unusable::Bad(format!(
                "more than {MAX_REFERENCES} references"
            )));
        }
        match registry.reference(&r) {
            Fetch::Found(s) => {
                files.0.insert(r.name, s.schema);
                wanted.extend(s.references);
            }
            Fetch::NotFound => {
                return Err(Unusable::Bad(format!(
                    "reference `{}` ({} version {}) not found",
                    r.name, r.subject, r.version
                )));
            }
            Fetch::Failed(e) => return Err(Unusable::Failed(e)),
            Fetch::Unavailable(e) => return Err(Unusable::Unavailable(e)),
        }
    }
    build(files, root, max_nodes)
}

/// The schema [`MAIN`] of `files` compiled: a plan for each of its message types; refused
/// as too large when it and its imports hold more than `max_nodes` nodes (counted as for a
/// descriptor file, before a plan is made).
fn build(files: Files, root: &Node, max_nodes: usize) -> Result<Messages, Unusable> {
    let mut resolver = ChainFileResolver::new();
    resolver.add(files);
    resolver.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler
        .open_file(MAIN)
        .map_err(|e| Unusable::Bad(e.to_string()))?;
    let pool = compiler.descriptor_pool();
    crate::config::descriptor_within_budget(&pool, max_nodes)
        .map_err(|e| Unusable::TooLarge(e.to_string()))?;
    let file = pool
        .get_file_by_name(MAIN)
        .ok_or_else(|| Unusable::Bad("the schema compiled to nothing".into()))?;
    let mut plans = Vec::new();
    for (i, m) in file.messages().enumerate() {
        messages(&m, SmallVec::from_slice(&[i as u32]), root, &mut plans)?;
    }
    Ok(Messages(plans))
}

/// The plans of `message` (at `path`) and of the messages declared inside it.
fn messages(
    message: &MessageDescriptor,
    path: SmallVec<[u32; 2]>,
    root: &Node,
    out: &mut Vec<(SmallVec<[u32; 2]>, ProtoPlan)>,
) -> Result<(), Unusable> {
    if out.len() >= MAX_MESSAGES || path.len() > plan::MAX_DEPTH {
        return Err(Unusable::Bad(format!(
            "more than {MAX_MESSAGES} message types, or nested too deep"
        )));
    }
    let plan = plan::compile(message, root).map_err(|e| Unusable::Bad(e.to_string()))?;
    out.push((path.clone(), plan));
    for (i, child) in message.child_messages().enumerate() {
        let mut p = path.clone();
        p.push(i as u32);
        messages(&child, p, root, out)?;
    }
    Ok(())
}

/// The registry's schema texts by file name, for protox.
struct Files(HashMap<String, String>);

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(text) => File::from_source(name, text),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

#[cfg(test)]
mod tests;
