//! When a counter key expires: the window's expiry (window end + retention), which every
//! exactness decision uses, and the expiry tally stores on each key, spread by a hash of the key.

use crate::config::CounterConfig;

/// When a key of a window ending at `window_end_ms` with `retention_ms` expires. Saturates:
/// validation bounds retention, and a window end is at most year 9999.
pub fn expire_at(window_end_ms: i64, retention_ms: i64) -> i64 {
    window_end_ms.saturating_add(retention_ms)
}

/// The expiry tally stores on `key` (the bytes as stored, with the cluster hash tag if any)
/// whose window's keys expire at `expire_at_ms` (window end + retention): that instant plus a
/// deterministic offset in `[0, spread_ms]` from a hash of the key. Every key of a window then
/// expires at its own moment within the spread instead of all in the same one (Redis's active
/// expiry stalls every client while a large batch of keys expires at once).
///
/// Only the stored expiry moves: lateness, queries and recovery keep deciding with
/// `expire_at_ms`, so a key may live up to `spread_ms` longer in Redis, never shorter. The
/// stream flush, the TTL auditor and (through the flush) a replay or rebuild all call this, so
/// a key gets the same expiry whoever writes it.
pub fn stored_expire_at(key: &[u8], expire_at_ms: i64, spread_ms: i64) -> i64 {
    if spread_ms <= 0 {
        return expire_at_ms;
    }
    // spread_ms < i64::MAX (validation bounds it), so the modulus does not overflow.
    let offset = stable_hash(key) % (spread_ms as u64 + 1);
    expire_at_ms.saturating_add(offset as i64)
}

/// A hash of `bytes` eight at a time (multiply-xorshift over little-endian words, the length
/// mixed in) with a final avalanche (splitmix64's), so the low bits taken by the modulus depend
/// on every byte. Word-wise because the flush hashes every new key: a byte-wise loop costs
/// several times more. Fixed forever: stored expiries are computed from it.
fn stable_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (bytes.len() as u64).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K);
        h ^= h >> 29;
    }
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(last)).wrapping_mul(K);
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The default `expiry_spread`: a tenth of a key's lifetime (window + retention), at most
/// five minutes. A tenth keeps the extra memory small (a window's keys outlive it by 5% on
/// average); five minutes spread a million keys to ~3,300 expiries a second, far below what
/// Redis's active expiry handles without a stall.
pub const DEFAULT_SPREAD_CAP_MS: i64 = 5 * 60 * 1000;

/// The counter's spread in ms: its `expiry_spread`, or the default of
/// [`DEFAULT_SPREAD_CAP_MS`]'s rule.
pub(super) fn spread_ms(config: &CounterConfig) -> i64 {
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    match config.expiry_spread {
        Some(spread) => ms(spread),
        None => default_spread_ms(ms(config.window).saturating_add(ms(config.retention))),
    }
}

/// The default spread of keys that live `lifetime_ms` (window + retention): a tenth of it, at
/// most [`DEFAULT_SPREAD_CAP_MS`]. The request path's window-aligned keys use it too.
pub fn default_spread_ms(lifetime_ms: i64) -> i64 {
    (lifetime_ms / 10).clamp(0, DEFAULT_SPREAD_CAP_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const PINNED: i64 = 108_771;

    #[test]
    fn stored_expiries_lie_within_the_spread_and_are_deterministic() {
        let (at, spread) = (1_735_689_600_000, 60_000);
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let key = format!("flow:count:app:dev{i}:2025010100");
            let stored = stored_expire_at(key.as_bytes(), at, spread);
            assert!((at..=at + spread).contains(&stored), "{key}: {stored}");
            assert_eq!(stored, stored_expire_at(key.as_bytes(), at, spread));
            seen.insert((stored - at) / 1_000);
        }
        // 10,000 keys over the 60 whole seconds of the spread: every second gets some.
        assert!(seen.len() >= 60, "offsets cover the spread: {}", seen.len());
        assert_eq!(stored_expire_at(b"k", at, 0), at, "0: no spread");
        assert_eq!(
            stored_expire_at(b"k", i64::MAX - 1, spread),
            i64::MAX,
            "saturates"
        );
    }

    #[test]
    fn the_hash_is_pinned() {
        // Stored expiries already in Redis depend on it: a change moves every key's expiry.
        let key = b"flow:count:app123:device456:127.0.0.1:2025080117";
        assert_eq!(stored_expire_at(key, 0, 300_000), PINNED);
    }

    #[test]
    fn offsets_are_spread_evenly() {
        let spread = 99_999;
        let mut buckets = [0u32; 10];
        for i in 0..100_000 {
            let key = format!("k:{i}:{{17}}");
            let offset = stored_expire_at(key.as_bytes(), 0, spread);
            buckets[(offset / 10_000) as usize] += 1;
        }
        for (i, n) in buckets.iter().enumerate() {
            assert!((9_000..11_000).contains(n), "bucket {i}: {n} of 100,000");
        }
    }

    #[test]
    fn the_default_spread_is_a_tenth_of_the_lifetime_capped() {
        let spread = |window: u64, retention: u64, set: Option<u64>| {
            let mut c = CounterConfig::reference();
            c.window = Duration::from_secs(window);
            c.retention = Duration::from_secs(retention);
            c.expiry_spread = set.map(Duration::from_secs);
            spread_ms(&c)
        };
        assert_eq!(spread(60, 0, None), 6_000);
        assert_eq!(spread(60, 120, None), 18_000);
        assert_eq!(spread(3600, 0, None), DEFAULT_SPREAD_CAP_MS);
        assert_eq!(spread(3600, 86_400, Some(0)), 0);
        assert_eq!(spread(60, 0, Some(600)), 600_000, "set: taken as it is");
    }
}
