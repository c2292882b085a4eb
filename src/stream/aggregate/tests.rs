//! Tests for the aggregator: deltas, unit chaining, the per-call key limit, replay skipping,
//! and a property test against a direct count. Events go through the real decoder; expected
//! keys are rendered here with chrono, independently of `tally_counters::key`.

use super::*;
use crate::config::{Config, CounterConfig};
use crate::model::layout::series_shard;
use crate::model::stored_expire_at;
use crate::stream::decode::Decoder;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// 2025-01-01T00:00:00Z.
const T0: i64 = 1_735_689_600_000;
const MINUTE: i64 = 60_000;
const HOUR: i64 = 3_600_000;
/// Retention of the `hits` counter.
const HITS_RETENTION: i64 = 2 * MINUTE;

fn counter(name: &str, key: &str, secs: u64, retention: u64, value: Option<&str>) -> CounterConfig {
    CounterConfig {
        name: name.into(),
        dimensions: vec!["user".into()],
        key: key.into(),
        window: Duration::from_secs(secs),
        timezone: "UTC".into(),
        retention: Duration::from_secs(retention),
        value_field: value.map(Into::into),
        ..CounterConfig::reference()
    }
}

/// Events per user per minute, kept two minutes after the window ends.
fn hits() -> CounterConfig {
    counter("hits", "hits:{user}:{yyyyMMddHHmm}", 60, 120, None)
}

/// Sum of `n` per user per hour, expiring at the window end.
fn bytes() -> CounterConfig {
    counter("bytes", "bytes:{user}:{yyyyMMddHH}", 3600, 0, Some("n"))
}

/// The shard of a test key `<counter>:<user>:<time>` (each test counter's name is its key's
/// literal prefix): the series shard of (counter, user).
fn shard_of(key: &[u8], shards: u32) -> u32 {
    let text = std::str::from_utf8(key).expect("test keys are text");
    let mut parts = text.split(':');
    let (name, user) = (parts.next().unwrap(), parts.next().unwrap());
    series_shard(name, &[user], shards)
}

fn utc(ms: i64, format: &str) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).expect("test time in range");
    t.format(format).to_string()
}

/// The `hits` key of an event and its expected stored expiry: window end + retention, spread
/// by the default spread (a tenth of 3 min).
fn hits_key(user: &str, ts: i64) -> (String, i64) {
    let start = ts.div_euclid(MINUTE) * MINUTE;
    let key = format!("hits:{user}:{}", utc(start, "%Y%m%d%H%M"));
    let at = stored_expire_at(key.as_bytes(), start + MINUTE + HITS_RETENTION, 18_000);
    (key, at)
}

/// The `bytes` key of an event and its expected stored expiry (the default spread: a tenth of
/// an hour, capped at 5 min).
fn bytes_key(user: &str, ts: i64) -> (String, i64) {
    let start = ts.div_euclid(HOUR) * HOUR;
    let key = format!("bytes:{user}:{}", utc(start, "%Y%m%d%H"));
    let at = stored_expire_at(key.as_bytes(), start + HOUR, 300_000);
    (key, at)
}

/// A decoder and an aggregator built from `counters` the way the pipeline builds them.
struct Rig {
    decoder: Decoder,
    agg: Aggregator,
}

impl Rig {
    fn new(counters: Vec<CounterConfig>, shards: u32, max_keys_per_call: usize) -> Rig {
        let config = Config {
            counters,
            ..Config::default()
        };
        let model = crate::config::Model::compile(config).expect("test config is valid");
        let (decoder, counters) = stages(&model);
        Rig {
            decoder,
            agg: Aggregator::new(counters, shards, max_keys_per_call),
        }
    }

    /// Decode `{"user": user, "n": n}` with Kafka time `ts` and add it at `offset`.
    fn add(&mut self, p: i32, offset: i64, user: &str, n: i64, ts: i64, now: i64) -> bool {
        self.add_event(p, offset, user, n, ts, now) == Added::Counted
    }

    fn add_event(&mut self, p: i32, offset: i64, user: &str, n: i64, ts: i64, now: i64) -> Added {
        let payload = format!(r#"{{"user":"{user}","n":{n},"other":[1,2]}}"#);
        let decoded = self.decoder.decode(Some(payload.as_bytes()), Some(ts));
        let event = decoded.expect("event decodes");
        self.agg.add(p, offset, &event, now)
    }
}

fn text(key: &[u8]) -> String {
    String::from_utf8(key.to_vec()).expect("test keys are UTF-8")
}

/// Delta per key summed over `units`.
fn totals(units: &[FlushUnit]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (key, d) in units.iter().flat_map(|u| &u.keys) {
        *out.entry(text(key)).or_insert(0) += d.delta;
    }
    out
}

/// `[start, end)` of each unit per (partition, shard), in batch order.
fn chains(units: &[FlushUnit]) -> BTreeMap<(i32, u32), Vec<(i64, i64)>> {
    let mut out: BTreeMap<(i32, u32), Vec<(i64, i64)>> = BTreeMap::new();
    for u in units {
        out.entry((u.partition, u.shard))
            .or_default()
            .push((u.start, u.end));
    }
    out
}

/// Each chain is non-empty per unit and contiguous; returns (first start, last end).
fn assert_contiguous(chain: &[(i64, i64)]) -> (i64, i64) {
    for &(start, end) in chain {
        assert!(end > start, "empty unit [{start}, {end}) in {chain:?}");
    }
    for pair in chain.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "gap or overlap in {chain:?}");
    }
    (chain[0].0, chain[chain.len() - 1].1)
}

#[test]
fn one_delta_per_counter_key_and_window() {
    let mut rig = Rig::new(vec![hits(), bytes()], 1, 1_000);
    rig.agg.assign(0, &[0]);
    let mut want: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for i in 0..300_i64 {
        let user = format!("u{}", i % 3);
        // Minutes 58..62 after T0: four minute windows across two hour windows.
        let ts = T0 + (58 + i * 3 % 4) * MINUTE + i * 13 % MINUTE;
        let n = i % 5;
        assert!(rig.add(0, i, &user, n, ts, T0));
        let (key, expire) = hits_key(&user, ts);
        want.entry(key).or_insert((0, expire)).0 += 1;
        let (key, expire) = bytes_key(&user, ts);
        want.entry(key).or_insert((0, expire)).0 += n;
    }
    assert_eq!(want.len(), 3 * 4 + 3 * 2, "3 users x (4 minutes + 2 hours)");
    let batch = rig.agg.seal(None);
    assert_eq!(batch.units.len(), 1);
    let keys = &batch.units[0].keys;
    assert_eq!((keys.len(), batch.keys), (18, 18), "one entry per key");
    let mut got = BTreeMap::new();
    for (key, d) in keys {
        got.insert(text(key), (d.delta, d.expire_at_ms));
    }
    assert_eq!(got, want);
    assert_eq!(rig.agg.take_stats().counted, vec![300, 300]);
    assert_eq!(rig.agg.take_stats().counted, vec![0, 0], "stats reset");
}

#[test]
fn seal_chains_units_per_partition_and_shard() {
    let mut rig = Rig::new(vec![hits()], 1, 1_000);
    assert_eq!(rig.agg.assign(7, &[100]), 100);
    assert_eq!(rig.agg.assign(8, &[5]), 5);
    for offset in 100..104 {
        assert!(rig.add(7, offset, "a", 1, T0, T0));
    }
    assert!(rig.add(8, 5, "b", 1, T0, T0));
    assert_eq!(rig.agg.pending_keys(), 2);

    let first = rig.agg.seal(Some(&[7, 99]));
    assert_eq!(chains(&first.units)[&(7, 0)], vec![(100, 104)]);
    assert_eq!(first.units.len(), 1, "partition 8 is not sealed");
    assert_eq!(first.ends, vec![(7, 104)]);
    assert_eq!(rig.agg.pending_keys(), 1);

    assert!(rig.add(7, 104, "a", 1, T0, T0));
    rig.agg.skip(7, 105);
    let second = rig.agg.seal(None);
    let got = chains(&second.units);
    assert_eq!(got[&(7, 0)], vec![(104, 106)], "continues the chain");
    assert_eq!(got[&(8, 0)], vec![(5, 6)]);
    assert_eq!(second.ends, vec![(7, 106), (8, 6)]);
    let sent = totals(&second.units)[&hits_key("a", T0).0];
    assert_eq!(sent, 1, "what the first seal took is not re-sent");
    assert_eq!(rig.agg.pending_keys(), 0);

    let empty = rig.agg.seal(None);
    assert!(empty.units.is_empty() && empty.ends.is_empty());
}

/// Feeds one message per offset `start..start + n`, each with its own user, and returns
/// the keys each offset contributed.
fn feed_unique(rig: &mut Rig, p: i32, start: i64, n: i64) -> BTreeMap<i64, Vec<String>> {
    let mut keys = BTreeMap::new();
    for offset in start..start + n {
        let user = format!("user{offset}");
        rig.add(p, offset, &user, 1, T0, T0);
        let day = format!("uniq:{user}:{}", utc(T0, "%Y%m%d"));
        keys.insert(offset, vec![hits_key(&user, T0).0, day]);
    }
    keys
}

#[test]
fn key_limit_cuts_units_on_message_boundaries() {
    let limit = 3;
    let uniq = counter("uniq", "uniq:{user}:{yyyyMMdd}", 86_400, 0, None);
    for shards in [1, 4] {
        let mut rig = Rig::new(vec![hits(), uniq.clone()], shards, limit);
        rig.agg.assign(0, &vec![10; shards as usize]);
        let by_offset = feed_unique(&mut rig, 0, 10, 40);
        assert_eq!(rig.agg.pending_keys(), 80);
        let batch = rig.agg.seal(None);
        let units_of = chains(&batch.units);
        for chain in units_of.values() {
            assert_eq!(assert_contiguous(chain), (10, 50));
        }
        for unit in &batch.units {
            let is_last = units_of[&(0, unit.shard)].last() == Some(&(unit.start, unit.end));
            let n = unit.keys.len();
            // Cut once the limit is reached, after at most one more message's keys.
            assert!(n < limit + 2, "{n} keys in a unit");
            assert!(is_last || n >= limit, "cut early at {n} keys");
            let got: BTreeSet<String> = unit.keys.iter().map(|(k, _)| text(k)).collect();
            let want: BTreeSet<String> = (unit.start..unit.end)
                .flat_map(|o| by_offset[&o].iter())
                .filter(|k| shard_of(k.as_bytes(), shards) == unit.shard)
                .cloned()
                .collect();
            assert_eq!(got, want, "unit [{}, {})", unit.start, unit.end);
        }
        if shards == 1 {
            // Each message adds 2 keys to the one shard: 3 keys, then a 4th, then the cut.
            assert_eq!(units_of[&(0, 0)].len(), 20);
            let pairs = batch.units.iter().all(|u| u.end - u.start == 2);
            assert!(pairs && batch.units.iter().all(|u| u.keys.len() == 4));
        }
        assert_eq!(rig.agg.pending_keys(), 0);
    }
}

#[test]
fn replay_skips_what_each_shard_already_applied() {
    let shards = 4;
    let applied = [10, 14, 12, 40];
    let mut rig = Rig::new(vec![hits()], shards, 1_000);
    assert_eq!(rig.agg.assign(3, &applied), 10, "starts at the lowest");
    let by_offset = feed_unique(&mut rig, 3, 10, 20);
    let mut want = BTreeMap::new();
    let mut skipped = 0;
    for (&offset, keys) in &by_offset {
        let key = &keys[0];
        if offset < applied[shard_of(key.as_bytes(), shards) as usize] {
            skipped += 1;
        } else {
            want.insert(key.clone(), 1);
        }
    }
    assert!(skipped > 0 && !want.is_empty(), "both paths are exercised");
    assert_eq!(rig.agg.stats.replay_skipped, skipped);
    assert_eq!(rig.agg.stats.counted, vec![20 - skipped]);
    assert_eq!(rig.agg.pending_keys(), want.len());

    let batch = rig.agg.seal(None);
    assert_eq!(totals(&batch.units), want);
    let got = chains(&batch.units);
    for s in 0..3 {
        assert_eq!(got[&(3, s)], vec![(applied[s as usize], 30)]);
    }
    assert!(!got.contains_key(&(3, 3)), "shard 3 is ahead: {got:?}");
    assert_eq!(batch.ends, vec![(3, 30)]);

    feed_unique(&mut rig, 3, 30, 15);
    let got = chains(&rig.agg.seal(None).units);
    for s in 0..3 {
        assert_eq!(got[&(3, s)], vec![(30, 45)]);
    }
    assert_eq!(got[&(3, 3)], vec![(40, 45)], "shard 3 resumes");
}

#[test]
fn late_skipped_stale_and_unknown_messages() {
    let mut rig = Rig::new(vec![hits(), bytes()], 1, 1_000);
    rig.agg.assign(0, &[0]);
    // hits expires at minute end + 2 min, bytes at the hour end.
    let expire_hits = T0 + MINUTE + HITS_RETENTION;
    assert!(rig.add(0, 0, "a", 5, T0, expire_hits - 1));
    assert!(rig.add(0, 1, "b", 5, T0, expire_hits));
    assert!(rig.add(0, 2, "c", 5, T0, T0 + HOUR));
    assert_eq!(rig.agg.stats.late, vec![2, 1]);
    assert_eq!(rig.agg.stats.counted, vec![1, 2]);

    rig.agg.skip(0, 3);
    rig.agg.skip(0, 1);
    assert_eq!(rig.agg.position(0), Some(4), "skip only moves forward");
    assert!(!rig.add(0, 3, "d", 1, T0, T0), "offset already processed");
    assert!(!rig.add(1, 0, "d", 1, T0, T0), "unknown partition");
    rig.agg.skip(1, 0);
    assert_eq!(rig.agg.position(1), None);
    assert!(!rig.agg.owns(1));
    assert!(rig.add(0, 6, "e", 1, T0, T0), "a gap in offsets is fine");

    let batch = rig.agg.seal(None);
    let want = BTreeMap::from([
        (hits_key("a", T0).0, 1),
        (bytes_key("a", T0).0, 5),
        (bytes_key("b", T0).0, 5),
        (hits_key("e", T0).0, 1),
        (bytes_key("e", T0).0, 1),
    ]);
    assert_eq!(totals(&batch.units), want);
    assert_eq!(chains(&batch.units)[&(0, 0)], vec![(0, 7)]);
}

#[test]

fn large_values_do_not_overflow_the_delta() {
    let mut rig = Rig::new(vec![bytes()], 1, 1_000);
    rig.agg.assign(0, &[0]);
    // Both values decode (they fit i64); their sum does not: the second event is refused.
    assert!(rig.add(0, 0, "a", i64::MAX, T0, T0));
    assert_eq!(rig.add_event(0, 1, "a", 1, T0, T0), Added::Overflow);
    let batch = rig.agg.seal(None);
    let deltas: Vec<i64> = batch.units[0].keys.iter().map(|(_, d)| d.delta).collect();
    assert_eq!(deltas, vec![i64::MAX]);
}

#[test]
fn revoke_drops_pending_keys_of_that_partition() {
    let mut rig = Rig::new(vec![hits()], 2, 2);
    rig.agg.assign(0, &[0, 0]);
    rig.agg.assign(1, &[0, 0]);
    feed_unique(&mut rig, 0, 0, 9);
    feed_unique(&mut rig, 1, 0, 5);
    assert_eq!(rig.agg.pending_keys(), 14, "full units are pending too");
    rig.agg.revoke(0);
    assert_eq!(rig.agg.pending_keys(), 5);
    assert!(!rig.agg.owns(0));
    // Re-assigning drops what was pending for the partition too.
    rig.agg.assign(1, &[3, 3]);
    assert_eq!(rig.agg.pending_keys(), 0);
    feed_unique(&mut rig, 1, 3, 2);
    let batch = rig.agg.seal(None);
    assert_eq!(batch.keys, 2);
    assert!(batch.units.iter().all(|u| u.partition == 1 && u.start == 3));
    assert_eq!(rig.agg.pending_keys(), 0);
}

#[test]
fn series_shards_are_stable_and_spread_series() {
    assert_eq!(series_shard("c", &["anything"], 1), 0);
    assert_eq!(series_shard("c", &["anything"], 0), 0);
    // FNV-1a 64 of "a\xff", computed independently: a restarted replica must agree with older ones.
    let fnv = |name: &str, values: &[&str], n: u32| u64::from(series_shard(name, values, n));
    assert_eq!(fnv("a", &[], 1_000_003), 0x089b_c907_b544_c769 % 1_000_003);
    assert_ne!(
        fnv("ab", &["c"], 977),
        fnv("a", &["bc"], 977),
        "framed, not concatenated"
    );
    let mut per_shard = [0_u32; 16];
    for i in 0..10_000 {
        let (app, ip) = (
            format!("app{}", i % 7),
            format!("10.0.{}.{}", i / 256, i % 256),
        );
        let dev = format!("dev{i}");
        let shard = series_shard("flow", &[&app, &dev, &ip], 16);
        assert_eq!(shard, series_shard("flow", &[&app, &dev, &ip], 16));
        per_shard[shard as usize] += 1;
    }
    let even = per_shard.iter().all(|&n| (400..=850).contains(&n));
    assert!(even, "{per_shard:?}");
    let agg = Aggregator::new(Vec::new(), 0, 10);
    assert_eq!(agg.shard_count(), 1);
}

#[test]
fn capped_seals_stay_bounded_rotate_and_lose_nothing() {
    let mut rig = Rig::new(vec![hits()], 1, 1_000);
    for p in 0..4 {
        rig.agg.assign(p, &[0]);
        feed_unique(&mut rig, p, 0, 10);
    }
    // 40 keys pending over 4 partitions; cap at 15: two partitions per batch.
    let first = rig.agg.seal_up_to(None, 15);
    assert!(!first.complete);
    assert_eq!(
        first.keys, 20,
        "stops after the partition that reaches the cap"
    );
    let second = rig.agg.seal_up_to(None, 15);
    assert!(second.complete, "the rest fits");
    let mut covered: Vec<i32> = first.ends.iter().chain(&second.ends).map(|e| e.0).collect();
    covered.sort_unstable();
    assert_eq!(
        covered,
        vec![0, 1, 2, 3],
        "every partition sealed exactly once"
    );
    assert_eq!(rig.agg.pending_keys(), 0);
    // Round robin: the second batch started where the first stopped, and the next full round
    // starts with the partitions the second batch did not reach.
    assert_eq!(
        first.ends.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(
        second.ends.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![2, 3]
    );
    for p in 0..4 {
        feed_unique(&mut rig, p, 10, 10);
    }
    let third = rig.agg.seal_up_to(None, 15);
    assert_eq!(
        third.ends.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![0, 1]
    );
    let fourth = rig.agg.seal_up_to(None, 15);
    assert_eq!(
        fourth.ends.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![2, 3]
    );
}

#[test]
fn overflowing_sum_skips_the_whole_event() {
    let mut rig = Rig::new(vec![hits(), bytes()], 1, 1000);
    rig.agg.assign(0, &[0]);
    assert!(rig.add(0, 0, "u", i64::MAX, T0, T0));
    // Same hour, next minute: `hits` creates a new key before `bytes` overflows.
    let next = T0 + MINUTE;
    assert_eq!(rig.add_event(0, 1, "u", 5, next, T0), Added::Overflow);
    assert_eq!(rig.add_event(0, 2, "u", i64::MIN, next, T0), Added::Counted);
    let stats = rig.agg.take_stats();
    assert_eq!(
        stats.counted,
        vec![2, 2],
        "the overflowing event counted nowhere"
    );
    let batch = rig.agg.seal(None);
    let got = totals(&batch.units);
    let mut want = BTreeMap::new();
    want.insert(hits_key("u", T0).0, 1);
    want.insert(hits_key("u", next).0, 1);
    want.insert(bytes_key("u", T0).0, -1);
    assert_eq!(got, want);
    assert_eq!(
        batch.keys, 3,
        "the key created for the skipped event is gone"
    );
    assert_eq!(
        batch.ends,
        vec![(0, 3)],
        "the skipped message still advances the offset"
    );
}

#[path = "props.rs"]
mod props;
