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

impl Batch {
    /// Every count key's `(key, delta, expire_at_ms)`, for the heavy-hitters summary (fed once
    /// per flush, never per message; nothing is allocated or cloned per unit or key).
    pub fn count_deltas(&self) -> impl Iterator<Item = (&[u8], i64, i64)> + Clone + '_ {
        self.units
            .iter()
            .flat_map(|u| u.keys.iter().map(|(key, d)| (key, d.delta, d.expire_at_ms)))
    }

    /// How many of [`Batch::count_deltas`]' entries one key can have ([`max_units_per_key`]).
    pub fn max_units_per_key(&self) -> usize {
        max_units_per_key(&self.units)
    }
}

/// How many units of a batch one key can appear in: a key belongs to one shard, so to the units
/// of one (partition, shard) per partition; those are adjacent in a batch (sealed ones, then the
/// open one). The sum over partitions of the longest run of one (partition, shard).
pub fn max_units_per_key(units: &[Unit]) -> usize {
    let (mut total, mut longest, mut run) = (0usize, 0usize, 0usize);
    let mut prev: Option<(i32, u32)> = None;
    for u in units {
        let at = (u.partition, u.shard);
        match prev {
            Some(p) if p == at => run += 1,
            Some((partition, _)) if partition == at.0 => run = 1,
            _ => {
                total += longest;
                longest = 0;
                run = 1;
            }
        }
        longest = longest.max(run);
        prev = Some(at);
    }
    total + longest
}

#[cfg(test)]
mod units_per_key_tests {
    use super::super::{Keys, Unit};

    fn unit(partition: i32, shard: u32) -> Unit {
        Unit {
            partition,
            shard,
            start: 0,
            end: 1,
            keys: Keys::with_capacity(0, 0),
            other: Vec::new(),
            max_event_ms: None,
        }
    }

    #[test]
    fn units_per_key_counts_runs_of_one_partition_and_shard() {
        assert_eq!(super::max_units_per_key(&[]), 0);
        let one_each = [unit(0, 0), unit(0, 1), unit(1, 0), unit(1, 1)];
        assert_eq!(super::max_units_per_key(&one_each), 2);
        // Partition 0's shard 1 was cut twice before its open unit: 3 units; partition 4: 1.
        let cut = [unit(0, 0), unit(0, 1), unit(0, 1), unit(0, 1), unit(4, 0)];
        assert_eq!(super::max_units_per_key(&cut), 4);
    }
}
