//! Asking the registry for one id: on a thread of its own for a lane (retrying outages, see the
//! module above), or once on the caller's thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::registry::Fetch;
use super::state::{CompiledSchema, Shared};
use super::{DecodeError, Unusable};

/// How long an id the registry did not know is answered `unknown_schema` without asking again.
pub(super) const UNKNOWN_RETRY: Duration = Duration::from_secs(10);

/// Asks of an id the registry answers with failures before the registry is checked (1 + 2 +
/// 4 s of waiting).
pub(super) const MAX_ASKS: u32 = 4;

/// How long an id the registry kept failing for is answered `registry_error` without asking
/// again.
pub(super) const FAILED_RETRY: Duration = Duration::from_secs(60);

/// Start asking for `id` on a thread of its own, until answered or `stop`; false if no thread
/// could be started (the event waits, and is tried again).
pub(super) fn start<P: Send + Sync + 'static>(
    shared: &Arc<Shared<P>>,
    id: u32,
    stop: CancellationToken,
) -> bool {
    let shared = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("tally-schema".into())
        .spawn(move || {
            let answer = ask_until_answered(&shared, id, &stop);
            shared.state.lock().ended(id, answer);
            shared.settled.notify_all();
        });
    if let Err(e) = &spawned {
        tracing::warn!(schema_id = id, error = %e, "cannot start a schema fetch; retrying");
    }
    spawned.is_ok()
}

/// Ask for `id` once, on this thread: an outage or failure is [`DecodeError::Unavailable`].
pub(super) fn ask_once<P>(shared: &Shared<P>, id: u32) -> Result<Arc<P>, DecodeError> {
    let answer = match ask(shared, id) {
        Ok(p) => Ok(Arc::new(p)),
        Err(Unusable::Failed(e) | Unusable::Unavailable(e)) => {
            warn(shared, id, &e);
            return Err(DecodeError::Unavailable);
        }
        Err(e) => Err(refusal(id, e)),
    };
    shared.state.lock().keep(id, answer.clone());
    answer.map_err(|(_, why)| why)
}

/// Ask for `id` until the registry answers (see the module above); None if `stop` came first
/// or nobody waits for the answer any more.
fn ask_until_answered<P>(
    shared: &Arc<Shared<P>>,
    id: u32,
    stop: &CancellationToken,
) -> Option<CompiledSchema<P>> {
    let mut wait = Duration::from_secs(1);
    let mut asked = 0;
    loop {
        asked += 1;
        match ask(shared, id) {
            Ok(p) => return Some(Ok(Arc::new(p))),
            // Failing again and again while the registry answers: only this id fails.
            Err(e @ Unusable::Failed(_)) if asked >= MAX_ASKS && shared.registry.answers() => {
                return Some(Err(refusal(id, e)));
            }
            Err(Unusable::Failed(e) | Unusable::Unavailable(e)) => {
                warn(shared, id, &e);
                if !sleep(shared, wait, stop) {
                    return None;
                }
                wait = (wait * 2).min(Duration::from_secs(30));
            }
            Err(e) => return Some(Err(refusal(id, e))),
        }
    }
}

/// One ask of the registry, compiled by the format.
fn ask<P>(shared: &Shared<P>, id: u32) -> Result<P, Unusable> {
    match shared.registry.schema(id) {
        Fetch::Found(schema) => (shared.compile)(&schema, &shared.registry),
        Fetch::NotFound => Err(Unusable::Bad("the registry does not know it".into())),
        Fetch::Failed(e) => Err(Unusable::Failed(e)),
        Fetch::Unavailable(e) => Err(Unusable::Unavailable(e)),
    }
}

fn warn<P>(shared: &Shared<P>, id: u32, e: &str) {
    if let Some(suppressed) = shared.log.lock().allow() {
        tracing::warn!(schema_id = id, error = %e, suppressed, "schema registry unavailable: the partition waits");
    }
}

/// Sleeps `wait` in short steps; false if `stop` is cancelled or the lane is gone meanwhile.
fn sleep<P>(shared: &Arc<Shared<P>>, wait: Duration, stop: &CancellationToken) -> bool {
    let until = Instant::now() + wait;
    loop {
        // Only this thread holds the cache: the lane that wanted the answer has ended.
        if stop.is_cancelled() || Arc::strong_count(shared) == 1 {
            return false;
        }
        if Instant::now() >= until {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long and why the events of `id` are refused (see the module above).
fn refusal(id: u32, e: Unusable) -> (Instant, DecodeError) {
    let why = e.reason();
    tracing::warn!(schema_id = id, error = %e, reason = why.reason(), "schema unusable: its events are refused");
    let again = match why {
        DecodeError::RegistryError => FAILED_RETRY,
        _ => UNKNOWN_RETRY,
    };
    (Instant::now() + again, why)
}
