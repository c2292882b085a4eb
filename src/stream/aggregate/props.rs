//! Property test of the aggregator: random events, undecodable messages and seals over several
//! partitions add up to a direct count.

use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// (partition, user, time step, value, missing offsets before it).
    Event(usize, u8, i64, i64, i64),
    /// An undecodable message.
    Skip { p: usize },
    /// A flush of all partitions, or only one.
    Seal { only: Option<usize> },
}

fn op() -> impl Strategy<Value = Op> {
    let event = (
        0..3_usize,
        0..6_u8,
        0..5_i64,
        0..10_i64,
        prop_oneof![4 => Just(0_i64), 1 => 1..3_i64],
    )
        .prop_map(|(p, user, step, n, gap)| Op::Event(p, user, step, n, gap));
    prop_oneof![
        20 => event,
        2 => (0..3_usize).prop_map(|p| Op::Skip { p }),
        2 => proptest::option::of(0..3_usize).prop_map(|only| Op::Seal { only }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sealed_units_add_up_to_a_direct_count(
        shards in 1..=8_u32,
        max_keys in 1..=12_usize,
        bases in prop::collection::vec(0..1_000_i64, 3),
        ahead in prop::collection::vec(prop::collection::vec(0..6_i64, 8), 3),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let mut rig = Rig::new(vec![hits(), bytes()], shards, max_keys);
        let applied: Vec<Vec<i64>> = (0..3)
            .map(|p| ahead[p][..shards as usize].iter().map(|a| bases[p] + a).collect())
            .collect();
        let mut next = Vec::new();
        for (p, a) in applied.iter().enumerate() {
            let start = rig.agg.assign(p as i32, a);
            prop_assert_eq!(start, *a.iter().min().expect("at least one shard"));
            next.push(start);
        }
        let mut want: BTreeMap<String, i64> = BTreeMap::new();
        let mut units = Vec::new();
        let mut seal = |agg: &mut Aggregator, only: Option<usize>, next: &[i64]| {
            let pending = agg.pending_keys();
            let batch = match only {
                Some(p) => agg.seal(Some(&[p as i32])),
                None => agg.seal(None),
            };
            for &(p, end) in &batch.ends {
                assert_eq!(end, next[p as usize], "a partition ends at its position");
            }
            assert_eq!(batch.keys, batch.units.iter().map(|u| u.keys.len()).sum::<usize>());
            assert_eq!(agg.pending_keys(), pending - batch.keys);
            if only.is_none() {
                assert_eq!(agg.pending_keys(), 0);
            }
            units.extend(batch.units);
        };
        for op in ops {
            match op {
                Op::Event(p, user, step, n, gap) => {
                    let offset = next[p] + gap;
                    let user = format!("u{user}");
                    let ts = T0 + step * 17 * MINUTE + n * 1_000;
                    prop_assert!(rig.add(p as i32, offset, &user, n, ts, T0));
                    next[p] = offset + 1;
                    for (key, delta) in [(hits_key(&user, ts).0, 1), (bytes_key(&user, ts).0, n)] {
                        if offset >= applied[p][shard_of(key.as_bytes(), shards) as usize] {
                            *want.entry(key).or_insert(0) += delta;
                        }
                    }
                }
                Op::Skip { p } => {
                    rig.agg.skip(p as i32, next[p]);
                    next[p] += 1;
                }
                Op::Seal { only } => seal(&mut rig.agg, only, &next),
            }
        }
        seal(&mut rig.agg, None, &next);

        for unit in &units {
            prop_assert!(unit.keys.len() < max_keys + 2, "{} keys in a unit", unit.keys.len());
            for (key, _) in &unit.keys {
                prop_assert_eq!(shard_of(key, shards), unit.shard);
            }
        }
        prop_assert_eq!(totals(&units), want);
        let got = chains(&units);
        for (p, a) in applied.iter().enumerate() {
            for (s, &start) in a.iter().enumerate() {
                match got.get(&(p as i32, s as u32)) {
                    Some(chain) => prop_assert_eq!(assert_contiguous(chain), (start, next[p])),
                    None => prop_assert!(next[p] <= start, "no units for ({}, {})", p, s),
                }
            }
        }
    }
}
