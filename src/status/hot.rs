//! The hottest keys: a Misra–Gries summary of the counter deltas the aggregator seals.
//!
//! It is fed once per flush with the batch's pre-aggregated deltas (never per message), in the
//! mergeable form of Agarwal et al. ("Mergeable summaries", 2012): the batch's keys are added,
//! and if more than `capacity` keys remain, the (`capacity`+1)-th largest count is subtracted
//! from every key and the keys at or below zero are dropped. Hence, over everything fed:
//!
//! * memory is bounded: at most `capacity` keys are held between batches;
//! * a key's shown count is a lower bound of its true sum, short by at most
//!   `error_bound = (N − held) / (capacity + 1)`, where `N` is the sum of every delta fed and
//!   `held` the sum of the counts held; a key whose true sum exceeds that bound is held;
//! * while fewer than `capacity + 1` distinct keys were ever fed, counts are exact.
//!
//! Keys whose expiry (`expire_at_ms`, window end + retention) has passed are dropped: Redis
//! dropped them too.

use std::collections::HashMap;

/// The summary hashes every flushed key once or twice: aHash, not SipHash (the keys are ours,
/// and the hot path pays per key).
type Map<K, V> = HashMap<K, V, ahash::RandomState>;

/// One held key.
#[derive(Debug, Clone)]
struct Entry {
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
    held: Map<Box<[u8]>, Entry>,
    /// Sum of every delta fed (`N`).
    total: u64,
    /// Sum subtracted from the counts so far (`N − held`, plus what expired).
    subtracted: u64,
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
        }
    }

    /// Keys held at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Add one batch of `(key, delta, expire_at_ms)` (negative deltas are ignored).
    pub fn feed<'a>(&mut self, batch: impl IntoIterator<Item = (&'a [u8], i64, i64)>, now_ms: i64) {
        // New keys of this batch, summed per key, borrowed until they survive the cut.
        let mut fresh: Map<&[u8], Entry> = Map::default();
        for (key, delta, expire_at_ms) in batch {
            let Ok(delta) = u64::try_from(delta) else {
                continue;
            };
            if delta == 0 {
                continue;
            }
            self.total = self.total.saturating_add(delta);
            let entry = match self.held.get_mut(key) {
                Some(e) => e,
                None => fresh.entry(key).or_insert(Entry {
                    count: 0,
                    expire_at_ms,
                }),
            };
            entry.count = entry.count.saturating_add(delta);
            entry.expire_at_ms = entry.expire_at_ms.max(expire_at_ms);
        }
        self.held.retain(|_, e| {
            let keep = e.expire_at_ms > now_ms;
            if !keep {
                self.subtracted = self.subtracted.saturating_add(e.count);
            }
            keep
        });
        let distinct = self.held.len() + fresh.len();
        let cut = if distinct > self.capacity {
            let mut counts: Vec<u64> = self
                .held
                .values()
                .chain(fresh.values())
                .map(|e| e.count)
                .collect();
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
            if e.count > 0 && e.expire_at_ms > now_ms {
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
        let mut top: Vec<(&Box<[u8]>, &Entry)> = self
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
        hot.feed([(&b"a"[..], 5, FAR), (b"b", 2, FAR)], 0);
        hot.feed([(&b"a"[..], 1, FAR), (b"c", 9, FAR)], 0);
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
            hot.feed(keys.iter().map(|(k, d)| (k.as_bytes(), *d, FAR)), 0);
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
    fn expired_keys_are_dropped() {
        let mut hot = HotKeys::new(4);
        hot.feed([(&b"old"[..], 50, 1_000), (b"new", 1, 5_000)], 0);
        assert_eq!(hot.top(5, 2_000).len(), 1);
        hot.feed([(&b"new"[..], 1, 5_000)], 2_000);
        assert_eq!(hot.held.len(), 1);
    }
}
