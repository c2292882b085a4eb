//! What sealing gives a flush: the [`Batch`] of units cut from the owned partitions (cut by
//! `Aggregator::seal_up_to`), and how many of its units one key can appear in.

use super::FlushUnit;

/// Units sealed for one flush.
#[derive(Debug, Default)]
pub struct Batch {
    /// Units in apply order per (partition, shard).
    pub units: Vec<FlushUnit>,
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
pub fn max_units_per_key(units: &[FlushUnit]) -> usize {
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
    use super::super::{FlushUnit, Keys};

    fn unit(partition: i32, shard: u32) -> FlushUnit {
        FlushUnit {
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
