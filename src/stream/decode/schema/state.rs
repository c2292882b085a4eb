//! What a lane's schema cache and its fetching threads share: the compiled schemas by id
//! (bounded, the least recently used forgotten first) and the fetches under way.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use lru::LruCache;
use parking_lot::{Condvar, Mutex};

use crate::ops::log_limit::LogLimiter;

use super::registry::Registry;
use super::{Compile, DecodeError, SchemaNews};

/// One id's schema compiled, or until when and why its events are refused.
pub(super) type CompiledSchema<P> = Result<Arc<P>, (Instant, DecodeError)>;

/// What the lane and its fetching threads share.
pub(super) struct Shared<P> {
    pub(super) registry: Registry,
    /// The format's compiler of a fetched schema.
    pub(super) compile: Compile<P>,
    pub(super) state: Mutex<State<P>>,
    /// Notified when a fetch ends (the lane may be waiting for it).
    pub(super) settled: Condvar,
    /// One warning per interval for a registry that keeps failing.
    pub(super) log: Mutex<LogLimiter>,
}

/// The schemas known, and the fetches under way.
pub(super) struct State<P> {
    /// Compiled schemas and refusals, by id; at most `decode.max_schemas`.
    compiled: LruCache<u32, CompiledSchema<P>>,
    /// Ids being fetched (by a thread each).
    fetching: HashSet<u32>,
    /// Fetches ended (see [`SchemaNews::settled`]).
    ended: u64,
    /// `ended` when an event was last answered `Unavailable`.
    missed_at: u64,
    /// Ids forgotten to make room.
    evicted: u64,
}

impl<P> State<P> {
    /// What is known of `id` now: its schema, or a refusal not yet expired.
    pub(super) fn known(&mut self, id: u32) -> Option<Result<Arc<P>, DecodeError>> {
        match self.compiled.get(&id)? {
            Ok(p) => Some(Ok(p.clone())),
            Err((until, why)) if Instant::now() < *until => Some(Err(*why)),
            Err(_) => None,
        }
    }

    /// Keep what was learnt of `id`, forgetting the least recently used id when full.
    pub(super) fn keep(&mut self, id: u32, compiled: CompiledSchema<P>) {
        if let Some((old, _)) = self.compiled.push(id, compiled) {
            self.evicted += u64::from(old != id);
        }
    }

    /// Whether `id` is being fetched.
    pub(super) fn fetching(&self, id: u32) -> bool {
        self.fetching.contains(&id)
    }

    /// Fetches under way.
    pub(super) fn fetches(&self) -> usize {
        self.fetching.len()
    }

    /// A fetch of `id` started.
    pub(super) fn started(&mut self, id: u32) {
        self.fetching.insert(id);
    }

    pub(super) fn news(&self) -> SchemaNews {
        SchemaNews {
            settled: self.ended,
            missed_at: self.missed_at,
            held: self.compiled.len(),
            evicted: self.evicted,
        }
    }

    /// A fetch of `id` ended (with `answer`, or none when it stopped).
    pub(super) fn ended(&mut self, id: u32, answer: Option<CompiledSchema<P>>) {
        self.fetching.remove(&id);
        if let Some(answer) = answer {
            self.keep(id, answer);
        }
        self.ended += 1;
    }

    pub(super) fn unavailable(&mut self) -> DecodeError {
        self.missed_at = self.ended;
        DecodeError::Unavailable
    }
}

impl<P> Shared<P> {
    /// Nothing known yet; at most `capacity` ids kept.
    pub(super) fn new(registry: Registry, capacity: usize, compile: Compile<P>) -> Shared<P> {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Shared {
            registry,
            compile,
            state: Mutex::new(State {
                compiled: LruCache::new(capacity),
                fetching: HashSet::new(),
                ended: 0,
                missed_at: 0,
                evicted: 0,
            }),
            settled: Condvar::new(),
            log: Mutex::new(LogLimiter::new()),
        }
    }
}

#[cfg(test)]
#[test]
fn a_producer_cycling_through_a_million_ids_is_held_to_the_bound() {
    let mut state: State<u32> = State {
        compiled: LruCache::new(NonZeroUsize::new(3).unwrap()),
        fetching: HashSet::new(),
        ended: 0,
        missed_at: 0,
        evicted: 0,
    };
    for id in 0..1_000_000 {
        state.keep(id, Ok(Arc::new(id)));
    }
    assert_eq!((state.news().held, state.news().evicted), (3, 999_997));
    // Read last: the least recently used is the one forgotten next.
    assert!(state.known(999_997).is_some());
    state.keep(7, Ok(Arc::new(7)));
    assert!(
        state.known(999_998).is_none(),
        "least recently used, forgotten"
    );
    assert!(state.known(999_997).is_some() && state.known(999_999).is_some());
    // Learnt again about an id held: replaced, nothing forgotten.
    let refused = (
        Instant::now() + std::time::Duration::from_secs(9),
        DecodeError::UnknownSchema,
    );
    state.keep(7, Err(refused));
    assert_eq!(state.known(7), Some(Err(DecodeError::UnknownSchema)));
    assert_eq!(state.news().evicted, 999_998);
    // A refusal that expired is not known: the id is fetched again.
    state.keep(8, Err((Instant::now(), DecodeError::UnknownSchema)));
    assert!(state.known(8).is_none());
}
