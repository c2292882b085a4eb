//! The hottest keys: a Misra–Gries summary of the counter deltas the aggregator seals.
//!
//! It is fed once per flush with the batch's deltas (never per message), in the mergeable form
//! of Agarwal et al. ("Mergeable summaries", 2012), in two cuts so that only a few keys per batch
//! are hashed:
//!
//! 1. **The batch's own summary, without hashing.** The batch is a list of entries `(key, delta)`,
//!    already summed per key within each unit; one key can still appear in several units (one per
//!    partition, more when a unit was cut by `max_keys_per_call`), at most `repeats` times. With
//!    `L = repeats × (capacity + 1) − 1`, if the batch has more than `L` entries, the (`L`+1)-th
//!    largest delta `c₁` (a `select_nth` over the deltas above 1; 1s are only counted) is
//!    subtracted from every entry and only the entries above it survive: at most `L`. The cut
//!    removes at least
//!    `(L + 1) × c₁ = repeats × (capacity + 1) × c₁` and any one key at most `repeats × c₁`.
//! 2. **Merge into the held summary.** The survivors are summed per key and added to the held
//!    keys; if more than `capacity` keys remain, the (`capacity`+1)-th largest count `c₂` is
//!    subtracted from every key and the keys at or below zero are dropped. This cut removes at
//!    least `(capacity + 1) × c₂` and any one key at most `c₂`.
//!
//! Either cut takes from one key at most `1 / (capacity + 1)` of what it removes in all. Hence,
//! over everything fed:
//!
//! * memory is bounded: at most `capacity` keys are held between batches;
//! * a key's shown count is a lower bound of its true sum, short by at most
//!   `error_bound = subtracted / (capacity + 1)`, where `subtracted ≤ N − held` is what the cuts
//!   (and expiry) removed, `N` the sum of every delta fed and `held` the sum of the counts held;
//!   a key whose true sum exceeds that bound is held;
//! * while fewer than `capacity + 1` distinct keys were ever fed, counts are exact (a batch of at
//!   most `capacity` keys has at most `L` entries, so neither cut happens).
//!
//! Keys whose expiry (`expire_at_ms`, window end + retention) has passed are dropped: Redis
//! dropped them too.

use std::collections::HashMap;

/// The summary hashes the few keys that survive a batch's first cut: aHash, not SipHash (the
/// keys are ours).
type Map<K, V> = HashMap<K, V, ahash::RandomState>;

/// One held key.
#[derive(Debug, Clone)]
struct HotEntry {
    /// The lower bound of the key's sum.
    count: u64,
    /// When Redis expires the key (Unix ms).
    expire_at_ms: i64,
}

/// A bounded summary of the heaviest keys.
#[derive(Debug)]
pub struct HotKeys {
    /// Keys held at most (between batches).
    capacity: usize,
    held: Map<Box<[u8]>, HotEntry>,
    /// Sum of every delta fed (`N`).
    total: u64,
    /// Sum the cuts and expiry removed from the counts so far (at most `N − held`).
    subtracted: u64,
    /// The batch's deltas, kept between feeds so a feed allocates nothing once warm.
    scratch: Vec<u64>,
}

/// One key as the status shows it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct HotKey {
    /// The Redis key (lossy UTF-8).
    pub key: String,
    /// At least this much was added to it (within `error_bound` of the truth).
    pub count: u64,
}

impl HotKeys {
    /// A summary holding at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> HotKeys {
        HotKeys {
            capacity: capacity.max(1),
            held: Map::with_capacity_and_hasher(capacity + 1, ahash::RandomState::new()),
            total: 0,
            subtracted: 0,
            scratch: Vec::new(),
        }
    }

    /// Keys held at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Add one batch of `(key, delta, expire_at_ms)` entries in which no key appears more than
    /// `repeats` times (negative deltas are ignored). The batch is walked twice.
    pub fn feed<'a, I>(&mut self, batch: I, repeats: usize, now_ms: i64)
    where
        I: IntoIterator<Item = (&'a [u8], i64, i64)> + Clone,
    {
        let (cut1, live) = self.batch_cut(batch.clone(), repeats, now_ms);
        // The survivors of the first cut (at most L entries), summed per key, borrowed until
        // they survive the second.
        let mut fresh: Map<&[u8], HotEntry> = Map::default();
        let mut survived = 0u64;
        for (key, delta, expire_at_ms) in batch {
            let Ok(delta) = u64::try_from(delta) else {
                continue;
            };
            if delta <= cut1 || expire_at_ms <= now_ms {
                continue;
            }
            let left = delta - cut1;
            survived += left;
            let entry = match self.held.get_mut(key) {
                Some(e) => e,
                None => fresh.entry(key).or_insert(HotEntry {
                    count: 0,
                    expire_at_ms,
                }),
            };
            entry.count = entry.count.saturating_add(left);
            entry.expire_at_ms = entry.expire_at_ms.max(expire_at_ms);
        }
        // What the first cut removed.
        self.subtracted = self
            .subtracted
            .saturating_add(live.saturating_sub(survived));
        self.merge(fresh, now_ms);
    }

    /// The first cut `c₁` (0: none) and the sum of the batch's live (unexpired) deltas; counts
    /// every delta into `total`.
    fn batch_cut<'a>(
        &mut self,
        batch: impl IntoIterator<Item = (&'a [u8], i64, i64)>,
        repeats: usize,
        now_ms: i64,
    ) -> (u64, u64) {
        // Deltas of 1 (most of them in a high-cardinality stream) are only counted: they are
        // the smallest, so the (L+1)-th largest is among the others unless those are too few.
        self.scratch.clear();
        let (mut live, mut ones) = (0u64, 0usize);
        for (_, delta, expire_at_ms) in batch {
            let Ok(delta) = u64::try_from(delta) else {
                continue;
            };
            self.total = self.total.saturating_add(delta);
            if delta == 0 || expire_at_ms <= now_ms {
                continue;
            }
            live = live.saturating_add(delta);
            if delta == 1 {
                ones += 1;
            } else {
                self.scratch.push(delta);
            }
        }
        let keep = repeats.max(1).saturating_mul(self.capacity + 1) - 1;
        if self.scratch.len() + ones <= keep {
            return (0, live);
        }
        if self.scratch.len() <= keep {
            // The (L+1)-th largest delta is a 1.
            return (1, live);
        }
        // The (L+1)-th largest delta.
        let (_, nth, _) = self.scratch.select_nth_unstable_by(keep, |a, b| b.cmp(a));
        (*nth, live)
    }

    /// The second cut: drop expired keys, add `fresh` and keep at most `capacity` keys.
    fn merge(&mut self, mut fresh: Map<&[u8], HotEntry>, now_ms: i64) {
        self.held.retain(|_, e| {
            let keep = e.expire_at_ms > now_ms;
            if !keep {
                self.subtracted = self.subtracted.saturating_add(e.count);
            }
            keep
        });
        let distinct = self.held.len() + fresh.len();
        let cut = if distinct > self.capacity {
            let counts = &mut self.scratch;
            counts.clear();
            counts.extend(self.held.values().chain(fresh.values()).map(|e| e.count));
            // The (capacity+1)-th largest count.
            let (_, nth, _) = counts.select_nth_unstable_by(self.capacity, |a, b| b.cmp(a));
            *nth
        } else {
            0
        };
        if cut > 0 {
            let mut dropped = 0u64;
            self.held.retain(|_, e| {
                let kept = e.count > cut;
                dropped += if kept { cut } else { e.count };
                e.count = e.count.saturating_sub(cut);
                kept
            });
            for e in fresh.values_mut() {
                dropped += e.count.min(cut);
                e.count = e.count.saturating_sub(cut);
            }
            self.subtracted = self.subtracted.saturating_add(dropped);
        }
        for (key, e) in fresh {
            if e.count > 0 {
                self.held.insert(key.into(), e);
            }
        }
        debug_assert!(self.held.len() <= self.capacity);
    }

    /// How far below its true sum a shown count can be.
    pub fn error_bound(&self) -> u64 {
        self.subtracted / (self.capacity as u64 + 1)
    }

    /// The `n` heaviest keys not expired at `now_ms`, heaviest first.
    pub fn top(&self, n: usize, now_ms: i64) -> Vec<HotKey> {
        let mut top: Vec<(&Box<[u8]>, &HotEntry)> = self
            .held
            .iter()
            .filter(|(_, e)| e.expire_at_ms > now_ms)
            .collect();
        top.sort_unstable_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
        top.into_iter()
            .take(n)
            .map(|(k, e)| HotKey {
                key: String::from_utf8_lossy(k).into_owned(),
                count: e.count,
            })
            .collect()
    }

    /// Sum of every delta fed.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const FAR: i64 = i64::MAX;

    #[test]
    fn exact_while_few_keys() {
        let mut hot = HotKeys::new(4);
        hot.feed([(&b"a"[..], 5, FAR), (b"b", 2, FAR)], 1, 0);
        hot.feed([(&b"a"[..], 1, FAR), (b"c", 9, FAR)], 1, 0);
        let top = hot.top(10, 0);
        let got: Vec<(&str, u64)> = top.iter().map(|k| (k.key.as_str(), k.count)).collect();
        assert_eq!(got, [("c", 9), ("a", 6), ("b", 2)]);
        assert_eq!(hot.error_bound(), 0);
    }

    #[test]
    fn bounded_memory_and_error_with_many_light_keys() {
        // Zipf-like: key i gets 1000 / (i+1); many batches, 500 distinct keys, capacity 16.
        let mut truth: BTreeMap<String, u64> = BTreeMap::new();
        let mut hot = HotKeys::new(16);
        for round in 0..20 {
            let keys: Vec<(String, i64)> = (0..500)
                .map(|i| (format!("k{i}"), (1000 / (i + 1) + (round % 3)) as i64))
                .collect();
            for (k, d) in &keys {
                *truth.entry(k.clone()).or_default() += *d as u64;
            }
            hot.feed(keys.iter().map(|(k, d)| (k.as_bytes(), *d, FAR)), 1, 0);
            assert!(hot.held.len() <= 16);
        }
        let bound = hot.error_bound();
        let n: u64 = truth.values().sum();
        assert_eq!(hot.total(), n);
        assert!(bound <= n / 17, "bound {bound} within N/(k+1)");
        for k in hot.top(16, 0) {
            let t = truth[&k.key];
            assert!(
                k.count <= t && t - k.count <= bound,
                "{}: {} vs {t}",
                k.key,
                k.count
            );
        }
        // Every key heavier than the bound is held; the true top 5 come first.
        let mut by_truth: Vec<(&String, &u64)> = truth.iter().collect();
        by_truth.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<String> = hot.top(5, 0).into_iter().map(|k| k.key).collect();
        let want: Vec<String> = by_truth[..5].iter().map(|(k, _)| (*k).clone()).collect();
        assert_eq!(shown, want);
    }

    #[test]
    fn keys_repeated_across_units_keep_the_bound() {
        // 16 "partitions" per batch: every key appears once per partition with a share of its
        // delta, like round-robin production; 2,000 distinct keys, Zipf-like; capacity 10.
        let (parts, capacity) = (16usize, 10usize);
        let mut truth: BTreeMap<String, u64> = BTreeMap::new();
        let mut hot = HotKeys::new(capacity);
        let names: Vec<String> = (0..2000).map(|i| format!("k{i}")).collect();
        for round in 0..30u64 {
            let mut batch: Vec<(&[u8], i64, i64)> = Vec::new();
            for p in 0..parts as u64 {
                for (i, name) in names.iter().enumerate() {
                    // Each partition gets a slightly different share, some none.
                    let d = (4000 / (i as u64 + 1) + (p + round + i as u64) % 3) / parts as u64;
                    if d > 0 {
                        batch.push((name.as_bytes(), d as i64, FAR));
                        *truth.entry(name.clone()).or_default() += d;
                    }
                }
            }
            hot.feed(batch.iter().copied(), parts, 0);
            assert!(hot.held.len() <= capacity);
        }
        let n: u64 = truth.values().sum();
        assert_eq!(hot.total(), n);
        let bound = hot.error_bound();
        assert!(bound <= n / (capacity as u64 + 1), "bound {bound}");
        for k in hot.top(capacity, 0) {
            let t = truth[&k.key];
            assert!(
                k.count <= t && t - k.count <= bound,
                "{}: {} vs {t}",
                k.key,
                k.count
            );
        }
        // Every key whose true sum exceeds the bound is held.
        let held: Vec<String> = hot.top(capacity, 0).into_iter().map(|k| k.key).collect();
        for (k, t) in &truth {
            if *t > bound {
                assert!(held.contains(k), "{k} ({t} > {bound}) is held");
            }
        }
        let mut by_truth: Vec<(&String, &u64)> = truth.iter().collect();
        by_truth.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<String> = hot.top(5, 0).into_iter().map(|k| k.key).collect();
        let want: Vec<String> = by_truth[..5].iter().map(|(k, _)| (*k).clone()).collect();
        assert_eq!(shown, want);
    }

    #[test]
    fn a_cut_among_ones_keeps_the_heavier_keys() {
        // L = 2: the 3rd largest delta is a 1; only `a` survives the batch's cut, by 5 - 1.
        let mut hot = HotKeys::new(2);
        let batch = [
            (&b"a"[..], 5, FAR),
            (b"b", 1, FAR),
            (b"c", 1, FAR),
            (b"d", 1, FAR),
        ];
        hot.feed(batch, 1, 0);
        let top: Vec<(String, u64)> = hot
            .top(5, 0)
            .into_iter()
            .map(|k| (k.key, k.count))
            .collect();
        assert_eq!(top, [("a".to_string(), 4)]);
        assert_eq!(hot.error_bound(), 1, "(8 - 4) / 3");
        assert_eq!(hot.total(), 8);
    }

    #[test]
    fn expired_keys_are_dropped() {
        let mut hot = HotKeys::new(4);
        hot.feed([(&b"old"[..], 50, 1_000), (b"new", 1, 5_000)], 1, 0);
        assert_eq!(hot.top(5, 2_000).len(), 1);
        hot.feed([(&b"new"[..], 1, 5_000)], 1, 2_000);
        assert_eq!(hot.held.len(), 1);
    }
}
