//! A lane's compiled schemas by id, bounded (the least recently used forgotten first), and the
//! lane's side of fetching one: start the fetch on a thread of its own, wait for it briefly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::RegistrySettings;

use super::registry::Registry;
use super::state::Shared;
use super::{fetch, Compile, DecodeError, SchemaNews};

/// How long the lane waits for a schema it starts fetching before it moves on (the partition
/// waits, paused; the lane keeps polling): a registry that answers at once costs no pause.
pub(super) const LANE_WAIT: Duration = Duration::from_millis(100);

/// Ids fetched at once per lane at most (each holds a partition: more are asked when these end).
const MAX_FETCHES: usize = 64;

/// A registry's schemas, compiled, by id.
pub(in crate::stream::decode) struct Cache<P> {
    shared: Arc<Shared<P>>,
    /// Set by the lane: fetches run on their own threads and retry outages until this is
    /// cancelled. None: each event asks once, on the caller's thread.
    stop: Option<CancellationToken>,
}

impl<P: Send + Sync + 'static> Cache<P> {
    /// A cache of at most `capacity` ids, compiling each with `compile`.
    pub(in crate::stream::decode) fn new(
        settings: &RegistrySettings,
        capacity: usize,
        compile: Compile<P>,
    ) -> Cache<P> {
        Cache {
            shared: Arc::new(Shared::new(Registry::new(settings), capacity, compile)),
            stop: None,
        }
    }

    pub(super) fn stop_on(&mut self, stop: CancellationToken) {
        self.stop = Some(stop);
    }

    /// The compiled schema `id`: known, else fetched and compiled (see the module).
    pub(super) fn get(&self, id: u32) -> Result<Arc<P>, DecodeError> {
        let mut state = self.shared.state.lock();
        if let Some(known) = state.known(id) {
            return known;
        }
        let Some(stop) = self.stop.as_ref() else {
            drop(state);
            return fetch::ask_once(&self.shared, id);
        };
        if state.fetching(id) || state.fetches() >= MAX_FETCHES || stop.is_cancelled() {
            return Err(state.unavailable());
        }
        if !fetch::start(&self.shared, id, stop.clone()) {
            return Err(state.unavailable());
        }
        state.started(id);
        // A registry that answers at once: the event is read now, nothing paused.
        let deadline = Instant::now() + LANE_WAIT;
        loop {
            let timed_out = self
                .shared
                .settled
                .wait_until(&mut state, deadline)
                .timed_out();
            if let Some(known) = state.known(id) {
                return known;
            }
            if timed_out || !state.fetching(id) {
                return Err(state.unavailable());
            }
        }
    }

    pub(super) fn news(&self) -> SchemaNews {
        self.shared.state.lock().news()
    }
}
