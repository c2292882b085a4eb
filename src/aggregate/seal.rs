//! Sealing: cutting the open units of the owned partitions into a batch for one flush.

use ahash::RandomState;

use super::{Aggregator, OtherMap, ShardState, Unit};

impl Aggregator {
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
        let mut parts: Vec<i32> = match only {
            Some(list) => list
                .iter()
                .copied()
                .filter(|p| self.partitions.contains_key(p))
                .collect(),
            None => self.partitions.keys().copied().collect(),
        };
        parts.sort_unstable();
        // Rotate the starting point so a capped flush does not always favour low partitions.
        let start = parts
            .iter()
            .position(|&p| p >= self.seal_cursor)
            .unwrap_or(0);
        parts.rotate_left(start);
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
            let mut any = false;
            for (s, shard) in state.shards.iter_mut().enumerate() {
                for unit in shard.sealed.drain(..) {
                    batch.keys += unit.items();
                    batch.units.push(unit);
                    any = true;
                }
                // A shard whose applied offset is ahead (replay) has nothing to write yet.
                if end > shard.open.start {
                    let unit = seal_unit(p, s as u32, shard, end, seen, &self.hasher);
                    batch.keys += unit.items();
                    batch.units.push(unit);
                    any = true;
                }
            }
            if any {
                batch.ends.push((p, end));
            }
        }
        self.pending_keys -= batch.keys;
        batch.complete = self.pending_keys == 0;
        batch
    }
}

pub(super) fn seal_unit(
    partition: i32,
    shard: u32,
    state: &mut ShardState,
    end: i64,
    max_event_ms: Option<i64>,
    hasher: &RandomState,
) -> Unit {
    // The next unit likely sees as many keys: `take` sizes its buffers up front.
    let keys = state.open.keys.take();
    let other = std::mem::replace(&mut state.open.other, OtherMap::with_hasher(hasher.clone()));
    state.open.other_items = 0;
    let unit = Unit {
        partition,
        shard,
        start: state.open.start,
        end,
        keys,
        other: other.into_iter().collect(),
        max_event_ms,
    };
    state.open.start = end;
    unit
}

/// Units sealed for one flush.
#[derive(Debug, Default)]
pub struct Batch {
    /// Units in apply order per (partition, shard).
    pub units: Vec<Unit>,
    /// Partitions covered and the offset each is complete up to once the batch lands.
    pub ends: Vec<(i32, i64)>,
    /// Total keys in `units`.
    pub keys: usize,
    /// Whether every pending key was sealed (false when a size cap stopped early).
    pub complete: bool,
}
