//! Avro payloads (`decode.format = "avro"`).
//!
//! * With `[decode.schema_registry]`: the Confluent wire format (byte 0, the writer schema's id
//!   as 4 big-endian bytes, the datum). A schema is fetched by id (`GET /schemas/ids/{id}`, the
//!   registry's REST API) the first time it is seen, compiled for the wanted fields and kept.
//!   Each event is read with its own writer's schema, so events written with several versions
//!   of a schema count into the same counters (a field a version lacks is `missing_field`).
//! * With `decode.schema_file`: bare datums, all written with that schema.
//!
//! What happens to an event that cannot be read: a frame that is not one, or a datum its schema
//! does not fit, is `not_avro`; an id the registry does not know (404), or a schema tally cannot
//! read, is `unknown_schema` (both counted and dead-lettered like any bad input; an unknown id
//! is asked again after [`UNKNOWN_RETRY`]). A registry that does not answer is not bad input:
//! the lane waits and asks again (1 s, doubling to 30 s), logging, until it answers or tally
//! stops (then the event is left for the next start: nothing skipped).

mod plan;
mod read;
mod registry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::DecodeConfig;
use crate::ops::log_limit::LogLimiter;

use super::paths::Node;
use super::{DecodeError, FieldValue};
use plan::Plan;
use registry::{Fetch, Registry};

/// Unknown ids remembered at most (then forgotten, known schemas kept).
const MAX_SCHEMAS: usize = 10_000;

/// How long an id the registry did not know is answered `unknown_schema` without asking again.
pub const UNKNOWN_RETRY: Duration = Duration::from_secs(10);

/// Where schemas come from, and the compiled ones.
pub(super) struct Avro {
    source: Source,
    /// Compiled plans by schema id; `Err(when)`: unknown since then.
    plans: Mutex<HashMap<u32, Result<Arc<Plan>, Instant>>>,
    /// Set by the lane: a registry outage is waited out until this is cancelled.
    stop: Option<CancellationToken>,
    log: Mutex<LogLimiter>,
}

enum Source {
    Registry(Registry),
    /// The schema file's plan (bare datums); none if it became unreadable since validation.
    File(Option<Plan>),
}

impl Avro {
    /// The reader `config` describes, for the wanted fields of `root` (validated: the schema
    /// file reads and parses).
    pub(super) fn new(config: &DecodeConfig, root: &Node) -> Avro {
        let source = match (&config.schema_registry, &config.schema_file) {
            (Some(r), _) => Source::Registry(Registry::new(r)),
            (None, Some(path)) => {
                let plan = std::fs::read_to_string(path)
                    .map_err(|e| e.to_string())
                    .and_then(|t| apache_avro::Schema::parse_str(&t).map_err(|e| e.to_string()))
                    .and_then(|s| plan::compile(&s, root))
                    .map_err(|e| {
                        tracing::error!(file = %path.display(), error = %e, "avro schema file unusable: every event is unknown_schema");
                    })
                    .ok();
                Source::File(plan)
            }
            (None, None) => Source::File(None),
        };
        Avro {
            source,
            plans: Mutex::new(HashMap::new()),
            stop: None,
            log: Mutex::new(LogLimiter::new()),
        }
    }

    /// Wait out registry outages until `stop` is cancelled.
    pub(super) fn stop_on(&mut self, stop: CancellationToken) {
        self.stop = Some(stop);
    }

    /// Reads `payload` into `out`.
    pub(super) fn read<'a>(
        &self,
        payload: &'a [u8],
        root: &Node,
        out: &mut [Option<FieldValue<'a>>],
    ) -> Result<(), DecodeError> {
        let (plan, datum) = match &self.source {
            Source::File(None) => return Err(DecodeError::UnknownSchema),
            Source::File(Some(plan)) => return run(plan, payload, out),
            Source::Registry(r) => {
                let (id, datum) = frame(payload).ok_or(DecodeError::NotAvro)?;
                (self.plan(r, id, root)?, datum)
            }
        };
        run(&plan, datum, out)
    }

    /// The plan of schema `id`: cached, else fetched (waiting out an outage, see the module).
    fn plan(&self, registry: &Registry, id: u32, root: &Node) -> Result<Arc<Plan>, DecodeError> {
        match self.plans.lock().get(&id) {
            Some(Ok(plan)) => return Ok(plan.clone()),
            Some(Err(since)) if since.elapsed() < UNKNOWN_RETRY => {
                return Err(DecodeError::UnknownSchema)
            }
            _ => {}
        }
        let mut wait = Duration::from_secs(1);
        loop {
            let answer = match registry.schema(id) {
                Fetch::Found(text) => apache_avro::Schema::parse_str(&text)
                    .map_err(|e| e.to_string())
                    .and_then(|s| plan::compile(&s, root)),
                Fetch::NotFound => Err("the registry does not know it".into()),
                Fetch::Unavailable(e) => {
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
                    wait = (wait * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            let mut plans = self.plans.lock();
            return match answer {
                Ok(plan) => {
                    let plan = Arc::new(plan);
                    plans.insert(id, Ok(plan.clone()));
                    Ok(plan)
                }
                Err(e) => {
                    tracing::warn!(schema_id = id, error = %e, "avro schema unusable: its events are unknown_schema");
                    // Ids are 32-bit: a producer inventing them must not grow this forever.
                    if plans.len() >= MAX_SCHEMAS {
                        plans.retain(|_, p| p.is_ok());
                    }
                    plans.insert(id, Err(Instant::now()));
                    Err(DecodeError::UnknownSchema)
                }
            };
        }
    }
}

/// The Confluent wire format: magic byte 0, the schema id (4 bytes, big-endian), the datum.
fn frame(payload: &[u8]) -> Option<(u32, &[u8])> {
    match payload {
        [0, a, b, c, d, datum @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), datum)),
        _ => None,
    }
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
