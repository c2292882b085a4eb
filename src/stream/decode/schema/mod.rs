//! Where the binary formats (Avro, Protobuf) find an event's schema, shared by both:
//!
//! * With `[decode.schema_registry]`: the Confluent wire format (byte 0, the writer schema's id
//!   as 4 big-endian bytes, then the format's body). A schema is fetched by id (`GET
//!   /schemas/ids/{id}`, the registry's REST API) the first time it is seen, compiled by the
//!   format for the wanted fields, and kept.
//! * With a local file (`decode.schema_file`, `decode.descriptor_file`): bare bodies, all
//!   written with that schema.
//!
//! An id the registry does not know (404), or a schema the format cannot read, is
//! `unknown_schema`, and a schema over the format's budget `schema_too_large` (both asked again
//! after [`UNKNOWN_RETRY`]). A registry that does not answer is not bad input: the lane waits
//! and asks again (1 s, doubling to 30 s), logging, until it answers or tally stops (then
//! [`DecodeError::Unavailable`]: the event is left for the next start, nothing skipped). An id
//! the registry answers with a failure (a 5xx, an answer over 1 MiB or not a schema) is waited
//! out the same way, but after [`MAX_ASKS`] asks the registry is checked: if it answers, it is
//! failing for this id only, and the id's events are `registry_error` (asked again after
//! [`FAILED_RETRY`]) instead of holding the partition for ever.
//!
//! The wait runs on the lane's thread, between two polls of Kafka: an outage longer than
//! `max.poll.interval.ms` makes the lane leave the group (counts stay exact; the partitions
//! are taken again when it polls).

pub(super) mod registry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::RegistrySettings;
use crate::ops::log_limit::LogLimiter;

use super::DecodeError;
use registry::{Fetch, Registry, Schema};

/// Unknown ids remembered at most (then forgotten, known schemas kept).
const MAX_SCHEMAS: usize = 10_000;

/// How long an id the registry did not know is answered `unknown_schema` without asking again.
const UNKNOWN_RETRY: Duration = Duration::from_secs(10);

/// Asks of an id the registry answers with failures before the registry is checked (1 + 2 +
/// 4 s of waiting).
const MAX_ASKS: u32 = 4;

/// How long an id the registry kept failing for is answered `registry_error` without asking
/// again (each new ask holds the partition for the asks above).
const FAILED_RETRY: Duration = Duration::from_secs(60);

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

impl<P> Source<P> {
    /// The compiled schema of `payload`, and its body (after the frame, if framed). A payload
    /// that is not a frame is `not_framed`.
    pub(super) fn resolve<'a>(
        &self,
        payload: &'a [u8],
        not_framed: DecodeError,
        compile: impl Fn(&Schema, &Registry) -> Result<P, Unusable>,
    ) -> Result<(Arc<P>, &'a [u8]), DecodeError> {
        match self {
            Source::File(Err(e)) => Err(*e),
            Source::File(Ok(p)) => Ok((p.clone(), payload)),
            Source::Registry(cache) => {
                let (id, body) = frame(payload).ok_or(not_framed)?;
                Ok((cache.get(id, compile)?, body))
            }
        }
    }

    /// Wait out registry outages until `stop` is cancelled.
    pub(super) fn stop_on(&mut self, stop: CancellationToken) {
        if let Source::Registry(cache) = self {
            cache.stop = Some(stop);
        }
    }
}

/// One id's schema compiled, or until when and why its events are refused.
type Compiled<P> = Result<Arc<P>, (Instant, DecodeError)>;

/// A registry's schemas, compiled, by id.
pub(super) struct Cache<P> {
    registry: Registry,
    /// Compiled schemas by id; `Err((until, why))`: refused until then.
    compiled: Mutex<HashMap<u32, Compiled<P>>>,
    /// Set by the lane: a registry outage is waited out until this is cancelled.
    stop: Option<CancellationToken>,
    log: Mutex<LogLimiter>,
}

impl<P> Cache<P> {
    pub(super) fn new(settings: &RegistrySettings) -> Cache<P> {
        Cache {
            registry: Registry::new(settings),
            compiled: Mutex::new(HashMap::new()),
            stop: None,
            log: Mutex::new(LogLimiter::new()),
        }
    }

    /// The compiled schema `id`: cached, else fetched and compiled (waiting out an outage, see
    /// the module).
    fn get(
        &self,
        id: u32,
        compile: impl Fn(&Schema, &Registry) -> Result<P, Unusable>,
    ) -> Result<Arc<P>, DecodeError> {
        match self.compiled.lock().get(&id) {
            Some(Ok(p)) => return Ok(p.clone()),
            Some(Err((until, why))) if Instant::now() < *until => return Err(*why),
            _ => {}
        }
        let mut wait = Duration::from_secs(1);
        let mut asked = 0;
        loop {
            asked += 1;
            let answer = match self.registry.schema(id) {
                Fetch::Found(schema) => compile(&schema, &self.registry),
                Fetch::NotFound => Err(Unusable::Bad("the registry does not know it".into())),
                Fetch::Failed(e) => Err(Unusable::Failed(e)),
                Fetch::Unavailable(e) => Err(Unusable::Unavailable(e)),
            };
            match answer {
                Ok(p) => {
                    let p = Arc::new(p);
                    self.compiled.lock().insert(id, Ok(p.clone()));
                    return Ok(p);
                }
                // Failing again and again while the registry answers: only this id fails.
                Err(e @ Unusable::Failed(_)) if asked >= MAX_ASKS && self.registry.answers() => {
                    return Err(self.refuse(id, e));
                }
                Err(Unusable::Failed(e) | Unusable::Unavailable(e)) => {
                    self.wait_out(id, &e, wait)?;
                    wait = (wait * 2).min(Duration::from_secs(30));
                }
                Err(e) => return Err(self.refuse(id, e)),
            }
        }
    }

    /// Waits `wait` before asking the registry about `id` again (it failed with `e`), or
    /// answers [`DecodeError::Unavailable`] if the lane stops or may not wait.
    fn wait_out(&self, id: u32, e: &str, wait: Duration) -> Result<(), DecodeError> {
        if let Some(suppressed) = self.log.lock().allow() {
            tracing::warn!(schema_id = id, error = %e, suppressed, "schema registry unavailable: the partition waits");
        }
        let Some(stop) = self.stop.as_ref().filter(|s| !s.is_cancelled()) else {
            return Err(DecodeError::Unavailable);
        };
        // Asleep in short steps: a stop is noticed within 100 ms.
        let until = Instant::now() + wait;
        while Instant::now() < until && !stop.is_cancelled() {
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Remembers that the events of `id` are refused (for a while: see the module), and why.
    fn refuse(&self, id: u32, e: Unusable) -> DecodeError {
        let why = e.reason();
        tracing::warn!(schema_id = id, error = %e, reason = why.reason(), "schema unusable: its events are refused");
        let again = match why {
            DecodeError::RegistryError => FAILED_RETRY,
            _ => UNKNOWN_RETRY,
        };
        let mut compiled = self.compiled.lock();
        // Ids are 32-bit: a producer inventing them must not grow this forever.
        if compiled.len() >= MAX_SCHEMAS {
            compiled.retain(|_, p| p.is_ok());
        }
        compiled.insert(id, Err((Instant::now() + again, why)));
        why
    }
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
