//! Where the binary formats (Avro, Protobuf) find an event's schema, shared by both:
//!
//! * With `[decode.schema_registry]`: the Confluent wire format (byte 0, the writer schema's id
//!   as 4 big-endian bytes, then the format's body). A schema is fetched by id (`GET
//!   /schemas/ids/{id}`, the registry's REST API) the first time it is seen, compiled by the
//!   format for the wanted fields, and kept: at most `decode.max_schemas` ids per lane, the
//!   least recently used forgotten first (and fetched again when seen again).
//! * With a local file (`decode.schema_file`, `decode.descriptor_file`): bare bodies, all
//!   written with that schema.
//!
//! An id the registry does not know (404), or a schema the format cannot read, is
//! `unknown_schema`, and a schema over the format's budget `schema_too_large` (both asked again
//! after [`fetch::UNKNOWN_RETRY`]). A registry that does not answer is not bad input: it is
//! asked again (1 s, doubling to 30 s), logging, until it answers or tally stops. An id the
//! registry answers with a failure (a 5xx, an answer over 1 MiB or not a schema) is asked the
//! same way, but after [`fetch::MAX_ASKS`] asks the registry is checked: if it answers, it is
//! failing for this id only, and the id's events are `registry_error` (asked again after
//! [`fetch::FAILED_RETRY`]) instead of holding the partition for ever.
//!
//! In a lane ([`Source::stop_on`]) the asking runs on a thread of its own per id ([`fetch`]):
//! the lane waits for it at most [`cache::LANE_WAIT`], then the event is
//! [`DecodeError::Unavailable`] and the lane pauses only that partition, keeps polling Kafka,
//! and reads the event again once the answer is in ([`Source::settled`] moves). Without a lane
//! (a recount), the registry is asked once per event and an outage is `Unavailable` at once.

mod cache;
mod fetch;
pub(super) mod registry;
mod state;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::DecodeError;
pub(super) use cache::Cache;
use registry::{Registry, Schema};

/// How a format compiles a registry's schema (fetching what it references from the registry),
/// shared with the threads that fetch.
pub(super) type Compile<P> = Arc<dyn Fn(&Schema, &Registry) -> Result<P, Unusable> + Send + Sync>;

/// Why a fetched schema was not compiled.
#[derive(Debug)]
pub(super) enum Unusable {
    /// The format cannot read it (or it is another format's): its events are `unknown_schema`.
    Bad(String),
    /// It compiles to more than the format's budget: its events are `schema_too_large`.
    TooLarge(String),
    /// The registry answered with a failure (it, or something it needs): ask again, then, if
    /// the registry answers other calls, its events are `registry_error`.
    Failed(String),
    /// Something it needs (a referenced schema) could not be fetched now: wait and ask again.
    Unavailable(String),
}

impl Unusable {
    /// What its events are refused as.
    pub(super) fn reason(&self) -> DecodeError {
        match self {
            Unusable::TooLarge(_) => DecodeError::SchemaTooLarge,
            Unusable::Failed(_) => DecodeError::RegistryError,
            Unusable::Unavailable(_) => DecodeError::Unavailable,
            Unusable::Bad(_) => DecodeError::UnknownSchema,
        }
    }
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Bad(e)
            | Unusable::TooLarge(e)
            | Unusable::Failed(e)
            | Unusable::Unavailable(e) => f.write_str(e),
        }
    }
}

impl From<String> for Unusable {
    fn from(e: String) -> Unusable {
        Unusable::Bad(e)
    }
}

/// The schemas of the events: a registry's (by id, compiled to `P` when first seen) or a local
/// file's (compiled once).
pub(super) enum Source<P> {
    Registry(Cache<P>),
    /// The file's compiled schema (bare bodies), or what every event is refused as when it
    /// does not compile for the wanted fields.
    File(Result<Arc<P>, DecodeError>),
}

impl<P: Send + Sync + 'static> Source<P> {
    /// The compiled schema of `payload`, and its body (after the frame, if framed). A payload
    /// that is not a frame is `not_framed`.
    pub(super) fn resolve<'a>(
        &self,
        payload: &'a [u8],
        not_framed: DecodeError,
    ) -> Result<(Arc<P>, &'a [u8]), DecodeError> {
        match self {
            Source::File(Err(e)) => Err(*e),
            Source::File(Ok(p)) => Ok((p.clone(), payload)),
            Source::Registry(cache) => {
                let (id, body) = frame(payload).ok_or(not_framed)?;
                Ok((cache.get(id)?, body))
            }
        }
    }

    /// Ask the registry off the caller's thread, retrying outages until `stop` is cancelled.
    pub(super) fn stop_on(&mut self, stop: CancellationToken) {
        if let Source::Registry(cache) = self {
            cache.stop_on(stop);
        }
    }

    /// What the schema cache has to tell the lane (see [`SchemaNews`]).
    pub(super) fn news(&self) -> SchemaNews {
        match self {
            Source::Registry(cache) => cache.news(),
            Source::File(_) => SchemaNews::default(),
        }
    }
}

/// What the registry's side of a decoder tells its lane, read between two polls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SchemaNews {
    /// Fetches finished so far: an event answered [`DecodeError::Unavailable`] when this was
    /// `missed_at` can be read again once it is greater.
    pub settled: u64,
    /// `settled` when the last event was answered [`DecodeError::Unavailable`].
    pub missed_at: u64,
    /// Compiled schemas (or refusals) held now.
    pub held: usize,
    /// Held ids forgotten to make room for others, since the lane started.
    pub evicted: u64,
}

/// The Confluent wire format: magic byte 0, the schema id (4 bytes, big-endian), the body.
pub(super) fn frame(payload: &[u8]) -> Option<(u32, &[u8])> {
    match payload {
        [0, a, b, c, d, body @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        _ => None,
    }
}

#[cfg(test)]
#[test]
fn the_registry_frame() {
    assert_eq!(frame(&[0, 0, 0, 1, 2, 9, 9]), Some((258, &[9u8, 9][..])));
    assert_eq!(frame(&[1, 0, 0, 0, 1]), None, "magic byte");
    assert_eq!(frame(&[0, 0, 0, 1]), None, "short");
    assert_eq!(frame(b"{\"json\":1}"), None);
}
