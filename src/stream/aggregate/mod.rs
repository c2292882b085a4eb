//! Pre-aggregation: one delta per (key, window) per flush unit, instead of one Redis call per event.
//!
//! Deltas are grouped into *units*. A unit holds every contribution of the messages with offsets
//! in `[start, end)` of one partition to one shard (standalone Redis has one shard; in cluster
//! mode a shard is a hash-tag group that lives in one slot). The flush script applies a unit
//! atomically together with the partition's applied offset for that shard, so a unit is the
//! unit of exactly-once: it lands whole or not at all, and never twice.

use std::collections::HashMap;

use ahash::RandomState;

use crate::key::KeyTemplate;
use crate::model::layout::Layout;
use crate::stream::decode::Decoder;

mod add;
mod keys;
mod kinds;
mod seal;
mod target;
mod undo;

pub use keys::Keys;
pub(crate) use keys::{KeyTable, MAX_KEY_BYTES};
pub use seal::{max_units_per_key, Batch};

use kinds::OtherMap;
pub use kinds::{Op, Other};

use crate::model::{CounterSpec, Kind};
use crate::window::WindowCache;

/// One counter, compiled for the hot path.
pub struct Counter {
    /// Name from the config, for metrics.
    pub name: String,
    template: KeyTemplate,
    windows: WindowCache,
    /// Indexes of this counter's dimensions in `Event::dims`.
    dims: Vec<usize>,
    /// Index of the summed field in `Event::nums`; None counts 1 per event.
    value: Option<usize>,
    retention_ms: i64,
    /// `CounterSpec::expiry_spread_ms`: a new key's stored expiry is spread by its hash.
    expiry_spread_ms: i64,
    /// Formatted time part of the cached window, and which window it belongs to.
    time_text: String,
    time_window: Option<i64>,
    kind: HotKind,
}

/// A counter's kind, with the event field indexes it needs.
enum HotKind {
    Count,
    /// Hash storage: the hash's key template and its formatted time part.
    Hash {
        template: KeyTemplate,
        time_text: String,
    },
    Distinct {
        member: usize,
        exact: bool,
    },
    Leaderboard {
        member: usize,
    },
}

/// The decoder and hot-path counters of `model`, as each consumer lane builds them.
pub fn stages(model: &crate::config::Model) -> (Decoder, Vec<Counter>) {
    stages_of(model, model.first_topic())
}

/// [`stages`] for the events of `topic`: the counters that do not read it skip them all.
pub fn stages_of(
    model: &crate::config::Model,
    topic: &crate::config::Topic,
) -> (Decoder, Vec<Counter>) {
    let decoder = Decoder::for_topic(topic, &model.counters);
    let counters = Counter::for_decoder(&model.counters, &decoder);
    (decoder, counters)
}

impl Counter {
    /// The hot-path counters of `specs`, reading their fields from events of `decoder`
    /// (built by [`Decoder::for_counters`] from the same specs).
    pub fn for_decoder(specs: &[CounterSpec], decoder: &Decoder) -> Vec<Counter> {
        specs
            .iter()
            .enumerate()
            .map(|(ci, spec)| {
                Counter::new(spec, |name| match decoder.field_index(name) {
                    Some(slot) => slot,
                    // A counter that does not read the decoder's topic skips every event
                    // (`Skips::unread`): its fields are never looked at.
                    None if !decoder.reads(ci) => 0,
                    None => panic!("Decoder::for_counters registers every field of the specs"),
                })
            })
            .collect()
    }

    /// Prepare a compiled counter for the hot path. `field_index` maps an event field name to
    /// its decoder index.
    pub fn new(spec: &CounterSpec, field_index: impl Fn(&str) -> usize) -> Counter {
        Counter {
            name: spec.name.clone(),
            template: spec.template.clone(),
            windows: WindowCache::new(spec.window),
            dims: spec.dimensions.iter().map(|d| field_index(d)).collect(),
            value: spec.value_field.as_deref().map(&field_index),
            retention_ms: spec.retention_ms,
            expiry_spread_ms: spec.expiry_spread_ms,
            time_text: String::new(),
            time_window: None,
            kind: match &spec.kind {
                Kind::Count => HotKind::Count,
                Kind::HashCount { hash } => HotKind::Hash {
                    template: hash.clone(),
                    time_text: String::new(),
                },
                Kind::Distinct { member, exact } => HotKind::Distinct {
                    member: field_index(member),
                    exact: *exact,
                },
                Kind::Leaderboard { member } => HotKind::Leaderboard {
                    member: field_index(member),
                },
            },
        }
    }

    /// Whether the counter writes with INCRBY (the fast path).
    fn is_count(&self) -> bool {
        matches!(self.kind, HotKind::Count)
    }
}

/// A key's pending change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    /// Sum to add with INCRBY.
    pub delta: i64,
    /// The key's stored expiry, Unix ms: window end + retention, spread by the key's hash
    /// (`model::stored_expire_at`).
    pub expire_at_ms: i64,
}

/// The atomic flush unit: all contributions of offsets `[start, end)` of a partition to a shard.
#[derive(Debug)]
pub struct Unit {
    /// Kafka partition.
    pub partition: i32,
    /// Shard within the partition (0 on standalone Redis).
    pub shard: u32,
    /// First offset covered; Redis must have applied exactly up to here.
    pub start: i64,
    /// One past the last offset covered; Redis records it once the unit is applied.
    pub end: i64,
    /// Keys and their deltas (possibly none: the unit then only advances the applied offset).
    pub keys: Keys,
    /// Changes of the other kinds (hash fields, distinct members, leaderboard scores).
    pub other: Vec<(Box<[u8]>, Other)>,
    /// The highest event time the partition has shown up to `end`, recorded with the applied
    /// offset (the partition's watermark before lateness); `i64::MIN` when no event was seen yet,
    /// None when no counter has an output (the script then records nothing).
    pub max_event_ms: Option<i64>,
}

impl Unit {
    /// Entries the unit writes: keys, plus each hash field, member and score.
    pub fn items(&self) -> usize {
        self.keys.len() + self.other.iter().map(|(_, o)| o.items()).sum::<usize>()
    }
}

struct OpenUnit {
    start: i64,
    keys: keys::KeyTable,
    other: OtherMap,
    /// Items in `other` (see [`Other::items`]).
    other_items: usize,
}

impl OpenUnit {
    fn new(start: i64, hasher: &RandomState) -> OpenUnit {
        OpenUnit {
            start,
            keys: keys::KeyTable::new(hasher),
            other: OtherMap::with_hasher(hasher.clone()),
            other_items: 0,
        }
    }

    fn items(&self) -> usize {
        self.keys.len() + self.other_items
    }

    /// Whether the unit must be cut after this message: `max_keys` entries, or so many key
    /// bytes that the arena's offsets would no longer fit.
    fn full(&self, max_keys: usize) -> bool {
        self.items() >= max_keys || self.keys.bytes_len() >= keys::MAX_KEY_BYTES
    }
}

struct ShardState {
    open: OpenUnit,
    /// Units cut because they reached `max_keys_per_call`, oldest first.
    sealed: Vec<Unit>,
}

struct PartitionState {
    /// Next offset expected: one past the last message processed.
    position: i64,
    /// Highest event time seen since the partition was assigned (i64::MIN: none yet).
    max_event_ms: i64,
    shards: Vec<ShardState>,
}

/// Per-flush statistics the caller publishes to metrics in one go.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Contributions counted, per counter.
    pub counted: Vec<u64>,
    /// Contributions dropped as late, per counter.
    pub late: Vec<u64>,
    /// Contributions skipped because Redis already applied them.
    pub replay_skipped: u64,
}

/// All pending deltas of the partitions this process owns.
pub struct Aggregator {
    counters: Vec<Counter>,
    partitions: HashMap<i32, PartitionState>,
    shards: u32,
    max_keys_per_call: usize,
    pending_keys: usize,
    hasher: RandomState,
    key_buf: Vec<u8>,
    /// Cluster key layout: appends each key's shard hash tag. None: plain keys.
    layout: Option<Layout>,
    /// Partition a capped seal starts at next.
    seal_cursor: i32,
    /// Units carry their partition's highest event time (some counter has an output).
    watermarks: bool,
    /// Counts since the last `take_stats`.
    pub stats: Stats,
}

impl Aggregator {
    /// An aggregator over `counters`, writing to `shards` shards (1 on standalone Redis).
    pub fn new(counters: Vec<Counter>, shards: u32, max_keys_per_call: usize) -> Aggregator {
        let n = counters.len();
        Aggregator {
            counters,
            partitions: HashMap::new(),
            shards: shards.max(1),
            max_keys_per_call,
            pending_keys: 0,
            hasher: RandomState::new(),
            key_buf: Vec::with_capacity(256),
            layout: None,
            seal_cursor: 0,
            watermarks: false,
            stats: Stats {
                counted: vec![0; n],
                late: vec![0; n],
                replay_skipped: 0,
            },
        }
    }

    /// Use `layout` for shards and key tags (Redis Cluster).
    pub fn with_layout(mut self, layout: Layout) -> Aggregator {
        self.shards = layout.shards();
        self.layout = Some(layout);
        self
    }

    /// Let units carry their partition's highest event time, for the watermarks of counters
    /// with an output.
    pub fn with_watermarks(mut self, on: bool) -> Aggregator {
        self.watermarks = on;
        self
    }

    /// The compiled counters, in config order.
    pub fn counters(&self) -> &[Counter] {
        &self.counters
    }

    /// Number of shards units are split into.
    pub fn shard_count(&self) -> u32 {
        self.shards
    }

    /// Distinct keys held in memory, sealed units included.
    pub fn pending_keys(&self) -> usize {
        self.pending_keys
    }

    /// Start tracking `partition`; `applied[s]` is the offset Redis has applied up to for shard s.
    /// Consumption must start at `min(applied)`; returns it.
    pub fn assign(&mut self, partition: i32, applied: &[i64]) -> i64 {
        debug_assert_eq!(applied.len(), self.shards as usize);
        self.revoke(partition);
        let position = applied.iter().copied().min().unwrap_or(0);
        let shards = applied
            .iter()
            .map(|&start| ShardState {
                open: OpenUnit::new(start, &self.hasher),
                sealed: Vec::new(),
            })
            .collect();
        let state = PartitionState {
            position,
            max_event_ms: i64::MIN,
            shards,
        };
        self.partitions.insert(partition, state);
        position
    }

    /// Forget `partition` and everything pending for it (after a flush, or when its data is
    /// to be replayed from Redis' applied offsets).
    pub fn revoke(&mut self, partition: i32) {
        if let Some(state) = self.partitions.remove(&partition) {
            for shard in &state.shards {
                self.pending_keys -= shard.open.items();
                self.pending_keys -= shard.sealed.iter().map(Unit::items).sum::<usize>();
            }
        }
    }

    /// Whether `partition` is tracked.
    pub fn owns(&self, partition: i32) -> bool {
        self.partitions.contains_key(&partition)
    }

    /// The partitions tracked.
    pub fn partitions(&self) -> impl Iterator<Item = i32> + '_ {
        self.partitions.keys().copied()
    }

    /// The applied offset Redis must hold for each shard of `partition` while no flush is in
    /// flight: the start of its oldest unit not yet sent.
    pub fn expected_fences(&self, partition: i32) -> Option<Vec<i64>> {
        let state = self.partitions.get(&partition)?;
        Some(
            state
                .shards
                .iter()
                .map(|s| s.sealed.first().map_or(s.open.start, |u| u.start))
                .collect(),
        )
    }

    /// Next offset expected for `partition`.
    pub fn position(&self, partition: i32) -> Option<i64> {
        self.partitions.get(&partition).map(|p| p.position)
    }

    /// Record that the message at `offset` was consumed but carries no event (undecodable), so
    /// the applied offset can move past it.
    pub fn skip(&mut self, partition: i32, offset: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            if offset >= p.position {
                p.position = offset + 1;
            }
        }
    }

    /// Take the statistics gathered since the last call.
    pub fn take_stats(&mut self) -> Stats {
        let n = self.counters.len();
        std::mem::replace(
            &mut self.stats,
            Stats {
                counted: vec![0; n],
                late: vec![0; n],
                replay_skipped: 0,
            },
        )
    }
}

/// What [`Aggregator::add`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Added to every counter (contributions that were late or already applied are skipped
    /// and recorded in [`Stats`]).
    Counted,
    /// Unknown partition, or an offset already processed: nothing to do.
    Ignored,
    /// A counter's pending sum would overflow i64: nothing of the event was added.
    Overflow,
}

#[cfg(test)]
mod tests;
