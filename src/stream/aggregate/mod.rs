//! Pre-aggregation: one delta per (key, window) per flush unit, instead of one Redis call per event.
//!
//! Deltas are grouped into *units*. A unit holds every contribution of the messages with offsets
//! in `[start, end)` of one partition to one shard (standalone Redis has one shard; in cluster
//! mode a shard is a hash-tag group that lives in one slot). The flush script applies a unit
//! atomically together with the partition's applied offset for that shard, so a unit is the
//! unit of exactly-once: it lands whole or not at all, and never twice.
//!
//! [`Aggregator`] is one type with its `impl` in this file: adding events, sealing units for a
//! flush, and the partitions' lifecycle. Its parts have their own homes: `counter.rs` (a counter
//! compiled for the hot path), `unit.rs` (the units, open and sealed), `check.rs` (the check
//! before an event is applied, so that nothing is ever taken back), `target.rs` (where a counter
//! puts an event), `keys.rs` and `kinds.rs` (the pending keys, and the kinds beyond counts),
//! `seal.rs` (the sealed [`Batch`]).

use std::collections::HashMap;

use ahash::RandomState;
use smallvec::SmallVec;

use crate::model::layout::Layout;
use crate::stream::decode::Event;

mod check;
mod counter;
mod keys;
mod kinds;
mod seal;
mod target;
mod unit;

pub use counter::{stages, stages_of, Counter};
pub use keys::Keys;
pub(crate) use keys::{KeyTable, MAX_KEY_BYTES};
pub use kinds::{Op, Other};
pub use seal::{max_units_per_key, Batch};
pub use unit::{Delta, FlushUnit};

use check::Weights;
use counter::HotKind;
use target::{target, Render};
use unit::{OpenUnit, ShardState};

/// One partition this process owns.
struct PartitionState {
    /// Next offset expected: one past the last message processed.
    position: i64,
    /// Highest event time seen since the partition was assigned (i64::MIN: none yet).
    max_event_ms: i64,
    /// Bound on the magnitude of every pending sum of its open units (see `check.rs`); zero
    /// when they are all sealed.
    bound: u64,
    /// Its shards, by number.
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
    /// The counters, compiled, in model order (an event's skip bits follow it).
    counters: Vec<Counter>,
    /// What each event can add to the sums (the check before applying).
    weights: Weights,
    partitions: HashMap<i32, PartitionState>,
    /// Entries an open unit holds before it is cut.
    max_keys_per_call: usize,
    /// Entries held, sealed units included.
    pending_keys: usize,
    hasher: RandomState,
    /// The key buffer, the shard count and the cluster layout.
    render: Render,
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
            weights: Weights::of(&counters),
            counters,
            partitions: HashMap::new(),
            max_keys_per_call,
            pending_keys: 0,
            hasher: RandomState::new(),
            render: Render {
                buf: Vec::with_capacity(256),
                shards: shards.max(1),
                layout: None,
            },
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
        self.render.shards = layout.shards();
        self.render.layout = Some(layout);
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
        self.render.shards
    }

    /// Distinct keys held in memory, sealed units included.
    pub fn pending_keys(&self) -> usize {
        self.pending_keys
    }

    /// Start tracking `partition`; `applied[s]` is the offset Redis has applied up to for shard s.
    /// Consumption must start at `min(applied)`; returns it.
    pub fn assign(&mut self, partition: i32, applied: &[i64]) -> i64 {
        debug_assert_eq!(applied.len(), self.render.shards as usize);
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
            bound: 0,
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
                self.pending_keys -= shard.sealed.iter().map(FlushUnit::items).sum::<usize>();
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

    /// Add one event at `offset` of `partition`. `now_ms` decides lateness.
    ///
    /// The event is added to every counter or to none: it is checked first (see `check.rs`),
    /// and if one counter's pending sum would overflow i64 nothing is added and the caller treats
    /// the message as bad input.
    pub fn add(&mut self, partition: i32, offset: i64, event: &Event<'_>, now_ms: i64) -> Added {
        let Some(part) = self.partitions.get_mut(&partition) else {
            return Added::Ignored;
        };
        if offset < part.position {
            return Added::Ignored;
        }
        part.position = offset + 1;
        part.max_event_ms = part.max_event_ms.max(event.ts_ms);
        let bound = part.bound.saturating_add(self.weights.of_event(event));
        if bound > check::MAX_BOUND {
            let (counters, render) = (&mut self.counters, &mut self.render);
            if !check::fits(counters, render, part, offset, event, now_ms) {
                return Added::Overflow;
            }
        }
        part.bound = bound;
        // Shards whose open unit reached `max_keys_per_call`, cut once the whole event is in.
        let mut full: SmallVec<[u32; 4]> = SmallVec::new();
        let skips = event.skips.all();
        for (ci, counter) in self.counters.iter_mut().enumerate() {
            if skips.checked_shr(ci as u32).unwrap_or(0) & 1 == 1 {
                continue;
            }
            let Some(target) = target(counter, event, now_ms, &mut self.render) else {
                self.stats.late[ci] += 1;
                continue;
            };
            let state = &mut part.shards[target.shard as usize];
            if offset < state.open.start {
                self.stats.replay_skipped += 1;
                continue;
            }
            let items = state
                .open
                .add(counter, &self.render.buf, &target, &self.hasher);
            if items > 0 {
                self.pending_keys += items;
                if state.open.full(self.max_keys_per_call) && !full.contains(&target.shard) {
                    full.push(target.shard);
                }
            }
            self.stats.counted[ci] += 1;
        }
        // A unit always ends on a message boundary: full units are cut after the whole message.
        let seen = self.watermarks.then_some(part.max_event_ms);
        for shard in full {
            let state = &mut part.shards[shard as usize];
            let unit = state.seal(partition, shard, offset + 1, seen, &self.hasher);
            state.sealed.push(unit);
        }
        Added::Counted
    }

    /// Seal every tracked partition (or only `only`) up to its position and return the units,
    /// oldest first per (partition, shard), plus each partition's end offset.
    pub fn seal(&mut self, only: Option<&[i32]>) -> Batch {
        self.seal_up_to(only, usize::MAX)
    }

    /// Like `seal`, but stop after the partition that brings the batch to `max_keys` keys, so a
    /// flush stays bounded in size and memory even after a backlog built up. Successive calls
    /// start at successive partitions, so none waits for long. `Batch::complete` says whether
    /// everything pending was sealed.
    pub fn seal_up_to(&mut self, only: Option<&[i32]>, max_keys: usize) -> Batch {
        let mut batch = Batch {
            complete: true,
            ..Batch::default()
        };
        let parts = self.seal_order(only);
        for (i, &p) in parts.iter().enumerate() {
            if batch.keys >= max_keys {
                self.seal_cursor = p;
                break;
            }
            if i + 1 == parts.len() {
                self.seal_cursor = 0;
            }
            let state = self
                .partitions
                .get_mut(&p)
                .expect("listed partition is tracked");
            let end = state.position;
            let seen = self.watermarks.then_some(state.max_event_ms);
            let before = batch.units.len();
            for (s, shard) in state.shards.iter_mut().enumerate() {
                batch.units.append(&mut shard.sealed);
                // A shard whose applied offset is ahead (replay) has nothing to write yet.
                if end > shard.open.start {
                    batch
                        .units
                        .push(shard.seal(p, s as u32, end, seen, &self.hasher));
                }
            }
            // Every open unit is empty now: nothing is pending to bound.
            state.bound = 0;
            if batch.units.len() > before {
                batch.keys += batch.units[before..]
                    .iter()
                    .map(FlushUnit::items)
                    .sum::<usize>();
                batch.ends.push((p, end));
            }
        }
        self.pending_keys -= batch.keys;
        batch.complete = self.pending_keys == 0;
        batch
    }

    /// The partitions a seal goes through (`only`, or all), sorted, starting at the cursor so a
    /// capped flush does not always favour low partitions.
    fn seal_order(&self, only: Option<&[i32]>) -> Vec<i32> {
        let mut parts: Vec<i32> = match only {
            Some(list) => list
                .iter()
                .copied()
                .filter(|p| self.partitions.contains_key(p))
                .collect(),
            None => self.partitions.keys().copied().collect(),
        };
        parts.sort_unstable();
        let start = parts
            .iter()
            .position(|&p| p >= self.seal_cursor)
            .unwrap_or(0);
        parts.rotate_left(start);
        parts
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
