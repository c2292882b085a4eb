//! Merging the units of several partitions that write to the same shard into one script call.
//!
//! With events spread over partitions without a key, a popular counter key is in every
//! partition's unit, and Redis would increment it once per partition per flush. A merged call
//! adds the deltas up first and carries every partition's fence: the script checks all of them
//! and applies everything or nothing (`APPLY_MERGED_LUA`), so each partition's range still lands
//! whole and once. A refused call names every partition's state; the consumer resynchronises
//! them all (their ranges are replayed from Kafka), exactly as for a refused single unit.

use std::collections::HashMap;

use ahash::RandomState;

use crate::stream::aggregate::{FlushUnit, KeyTable, Keys, MAX_KEY_BYTES};

/// One partition's offsets in a merged call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub partition: i32,
    pub start: i64,
    pub end: i64,
    /// The partition's highest event time up to `end` (see [`FlushUnit::max_event_ms`]).
    pub max_event_ms: Option<i64>,
}

/// Count-only units of several partitions of one shard, deltas added up per key.
#[derive(Debug)]
pub struct Merged {
    pub shard: u32,
    pub ranges: Vec<Range>,
    pub keys: Keys,
}

/// One script call of a flush, in the order its shard's pipeline must send it.
#[derive(Debug)]
pub enum Call {
    /// A unit on its own (it holds other kinds, or merging is off).
    FlushUnit(FlushUnit),
    Merged(Merged),
}

impl Call {
    pub fn shard(&self) -> u32 {
        match self {
            Call::FlushUnit(u) => u.shard,
            Call::Merged(m) => m.shard,
        }
    }
}

/// A merged call being filled.
struct Open {
    ranges: Vec<Range>,
    keys: KeyTable,
}

impl Open {
    fn new(hasher: &RandomState) -> Open {
        Open {
            ranges: Vec::new(),
            keys: KeyTable::new(hasher),
        }
    }

    fn holds(&self, partition: i32) -> bool {
        self.ranges.iter().any(|r| r.partition == partition)
    }

    /// Whether `unit` can join without passing `cap` keys, overflowing a sum, or leaving a gap
    /// in its partition's offsets.
    fn fits(&self, unit: &FlushUnit, cap: usize) -> bool {
        if let Some(r) = self.ranges.iter().find(|r| r.partition == unit.partition) {
            if r.end != unit.start {
                return false;
            }
        }
        let mut new = 0;
        for (k, d) in &unit.keys {
            match self.keys.get(k) {
                Some(have) if have.delta.checked_add(d.delta).is_none() => return false,
                Some(_) => {}
                None => new += 1,
            }
        }
        self.keys.len() + new <= cap
            && self.keys.bytes_len() + unit.keys.bytes_len() < MAX_KEY_BYTES
    }

    fn add(&mut self, unit: FlushUnit) {
        match self
            .ranges
            .iter_mut()
            .find(|r| r.partition == unit.partition)
        {
            Some(r) => {
                r.end = unit.end;
                r.max_event_ms = r.max_event_ms.max(unit.max_event_ms);
            }
            None => self.ranges.push(Range {
                partition: unit.partition,
                start: unit.start,
                end: unit.end,
                max_event_ms: unit.max_event_ms,
            }),
        }
        for (k, d) in &unit.keys {
            match self.keys.get_mut(k) {
                Some(have) => {
                    have.delta += d.delta;
                    have.expire_at_ms = have.expire_at_ms.max(d.expire_at_ms);
                }
                None => self.keys.insert_new(k, *d),
            }
        }
    }

    fn close(&mut self, shard: u32, hasher: &RandomState) -> Option<Call> {
        if self.ranges.is_empty() {
            return None;
        }
        let open = std::mem::replace(self, Open::new(hasher));
        Some(Call::Merged(Merged {
            shard,
            ranges: open.ranges,
            keys: open.keys.into_keys(),
        }))
    }
}

/// The calls of one flush: count-only units merged per shard up to `cap` keys per call (0: no
/// merging). Per (partition, shard) the order of the units is kept: a unit that cannot be
/// merged, or does not fit, first sends the call its partition is in.
pub fn plan(units: Vec<FlushUnit>, cap: usize) -> Vec<Call> {
    if cap == 0 {
        return units.into_iter().map(Call::FlushUnit).collect();
    }
    let hasher = RandomState::new();
    let mut calls = Vec::new();
    let mut open: HashMap<u32, Open> = HashMap::new();
    for unit in units {
        let shard = unit.shard;
        let o = open.entry(shard).or_insert_with(|| Open::new(&hasher));
        if !unit.other.is_empty() {
            if o.holds(unit.partition) {
                calls.extend(o.close(shard, &hasher));
            }
            calls.push(Call::FlushUnit(unit));
            continue;
        }
        if !o.fits(&unit, cap) {
            calls.extend(o.close(shard, &hasher));
        }
        o.add(unit);
    }
    let mut shards: Vec<u32> = open.keys().copied().collect();
    shards.sort_unstable();
    for shard in shards {
        if let Some(o) = open.get_mut(&shard) {
            calls.extend(o.close(shard, &hasher));
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::aggregate::Delta;

    fn unit(partition: i32, start: i64, end: i64, keys: &[(&str, i64)]) -> FlushUnit {
        FlushUnit {
            partition,
            shard: 0,
            start,
            end,
            keys: keys
                .iter()
                .map(|(k, d)| {
                    (
                        k.as_bytes(),
                        Delta {
                            delta: *d,
                            expire_at_ms: 1_000 + (*d).min(1_000),
                        },
                    )
                })
                .collect(),
            other: Vec::new(),
            max_event_ms: None,
        }
    }

    fn merged(call: &Call) -> (&[Range], HashMap<String, i64>) {
        match call {
            Call::Merged(m) => (
                &m.ranges,
                m.keys
                    .iter()
                    .map(|(k, d)| (String::from_utf8(k.to_vec()).unwrap(), d.delta))
                    .collect(),
            ),
            Call::FlushUnit(u) => panic!("unmerged unit {u:?}"),
        }
    }

    #[test]
    fn partitions_of_a_shard_merge_their_deltas_and_keep_their_ranges() {
        let calls = plan(
            vec![
                unit(0, 0, 5, &[("a", 2), ("b", 1)]),
                unit(1, 10, 12, &[("a", 3)]),
                unit(0, 5, 7, &[("c", 1)]),
            ],
            100,
        );
        assert_eq!(calls.len(), 1);
        let (ranges, keys) = merged(&calls[0]);
        assert_eq!(
            ranges,
            &[
                Range {
                    partition: 0,
                    start: 0,
                    end: 7,
                    max_event_ms: None,
                },
                Range {
                    partition: 1,
                    start: 10,
                    end: 12,
                    max_event_ms: None,
                }
            ]
        );
        assert_eq!(keys.len(), 3);
        assert_eq!(keys["a"], 5);
        let a = match &calls[0] {
            Call::Merged(m) => *m.keys.iter().find(|(k, _)| *k == b"a").unwrap().1,
            _ => unreachable!(),
        };
        assert_eq!(a.expire_at_ms, 1_003, "the later expiry wins");
    }

    #[test]
    fn a_full_call_is_sent_before_the_next_and_sums_never_overflow() {
        let calls = plan(
            vec![
                unit(0, 0, 1, &[("a", 1), ("b", 1)]),
                unit(1, 0, 1, &[("c", 1), ("d", 1)]),
            ],
            3,
        );
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(merged(&calls[0]).1.len(), 2);
        assert_eq!(merged(&calls[1]).1.len(), 2);
        let calls = plan(
            vec![
                unit(0, 0, 1, &[("a", 1)]),
                unit(1, 0, 1, &[("a", i64::MAX)]),
            ],
            100,
        );
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(merged(&calls[1]).1["a"], i64::MAX);
    }

    #[test]
    fn a_unit_with_other_kinds_goes_alone_after_its_partition_s_earlier_call() {
        let mut kinds = unit(0, 5, 6, &[]);
        kinds.other.push((
            b"hf".as_slice().into(),
            crate::stream::aggregate::Other {
                op: crate::stream::aggregate::Op::HashAdd { split: 1, delta: 1 },
                expire_at_ms: 1_000,
            },
        ));
        let calls = plan(
            vec![
                unit(0, 0, 5, &[("a", 1)]),
                kinds,
                unit(0, 6, 8, &[("a", 1)]),
                unit(1, 0, 3, &[("a", 1)]),
            ],
            100,
        );
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(merged(&calls[0]).0[0].end, 5);
        assert!(matches!(&calls[1], Call::FlushUnit(u) if u.start == 5));
        let (ranges, keys) = merged(&calls[2]);
        assert_eq!(ranges.len(), 2);
        assert_eq!(keys["a"], 2);
    }

    #[test]
    fn without_merging_every_unit_is_its_own_call() {
        let calls = plan(
            vec![unit(0, 0, 1, &[("a", 1)]), unit(1, 0, 1, &[("a", 1)])],
            0,
        );
        assert!(calls.iter().all(|c| matches!(c, Call::FlushUnit(_))));
    }
}
