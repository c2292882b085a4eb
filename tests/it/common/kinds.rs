//! Ground truth and Redis dumps for the counter kinds of [`super::stream::COUNTERS`]: distinct
//! (exact and HyperLogLog), leaderboard and hash storage. Keys are compared without their
//! cluster tag, so one comparison serves a server and a cluster.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{TimeZone, Utc};

use super::stream::Stream;

/// What the kinds hold, by plain key (hash storage: by hash key, then field).
#[derive(Debug, Default, PartialEq)]
pub struct Kinds {
    pub uniq: BTreeMap<String, BTreeSet<String>>,
    pub hll: BTreeMap<String, u64>,
    pub top: BTreeMap<String, BTreeMap<String, i64>>,
    pub hashed: BTreeMap<String, BTreeMap<String, i64>>,
}

impl Stream {
    /// The kinds' truth, computed from the events (not from tally's key code).
    pub fn kinds_truth(&self) -> Kinds {
        let mut k = Kinds::default();
        for i in 0..self.n {
            let e = self.event(i);
            let hour = Utc
                .timestamp_millis_opt(e.ts)
                .unwrap()
                .format("%Y%m%d%H")
                .to_string();
            k.uniq
                .entry(format!("ek:uniq:{}:{hour}", e.app))
                .or_default()
                .insert(e.device.clone());
            *k.top
                .entry(format!("ek:top:{}:{hour}", e.app))
                .or_default()
                .entry(e.device.clone())
                .or_default() += e.bytes;
            *k.hashed
                .entry(format!("ek:h:{hour}"))
                .or_default()
                .entry(format!("{}:{}", e.app, e.ip))
                .or_default() += 1;
        }
        k.hll = k
            .uniq
            .iter()
            .map(|(key, set)| (key.replace("ek:uniq:", "ek:hll:"), set.len() as u64))
            .collect();
        k
    }
}

fn plain(key: &str) -> String {
    key.rsplit_once(":{").map_or(key, |(p, _)| p).to_string()
}

/// Add what one node holds to `into` (hashes of several shards merge by field).
pub fn dump(conn: &mut redis::Connection, into: &mut Kinds) {
    let keys: Vec<String> = redis::cmd("KEYS").arg("ek:*").query(conn).unwrap();
    for key in keys {
        let p = plain(&key);
        if p.starts_with("ek:uniq:") {
            let members: BTreeSet<String> = redis::cmd("SMEMBERS").arg(&key).query(conn).unwrap();
            into.uniq.entry(p).or_default().extend(members);
        } else if p.starts_with("ek:hll:") {
            let n: u64 = redis::cmd("PFCOUNT").arg(&key).query(conn).unwrap();
            into.hll.insert(p, n);
        } else if p.starts_with("ek:top:") {
            let scores: Vec<(String, i64)> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)
                .unwrap();
            into.top.entry(p).or_default().extend(scores);
        } else if p.starts_with("ek:h:") {
            let fields: BTreeMap<String, i64> =
                redis::cmd("HGETALL").arg(&key).query(conn).unwrap();
            into.hashed.entry(p).or_default().extend(fields);
        } else {
            panic!("unexpected key {key}");
        }
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).unwrap();
        assert!(ttl > 0, "{key} has no expiry");
    }
}

/// Mismatches between `got` and `want`: exact for sets, scores and hash fields; HyperLogLog
/// counts within 3 standard errors (3 × 0.81%) plus one.
pub fn compare(got: &Kinds, want: &Kinds) -> usize {
    let mut bad = Vec::new();
    for (k, w) in &want.uniq {
        if got.uniq.get(k) != Some(w) {
            let g = got.uniq.get(k).map(BTreeSet::len);
            bad.push(format!("distinct {k}: want {} members, got {g:?}", w.len()));
        }
    }
    for (k, w) in &want.hll {
        let g = got.hll.get(k).copied().unwrap_or(0) as f64;
        if (g - *w as f64).abs() > 3.0 * 0.0081 * *w as f64 + 1.0 {
            bad.push(format!("hll {k}: want about {w}, got {g}"));
        }
    }
    for (k, w) in &want.top {
        if got.top.get(k) != Some(w) {
            bad.push(format!(
                "leaderboard {k}: scores differ ({} members wanted)",
                w.len()
            ));
        }
    }
    for (k, w) in &want.hashed {
        if got.hashed.get(k) != Some(w) {
            let g = got.hashed.get(k).map(BTreeMap::len);
            bad.push(format!("hash {k}: want {} fields, got {g:?}", w.len()));
        }
    }
    let unexpected = got
        .uniq
        .keys()
        .filter(|k| !want.uniq.contains_key(*k))
        .count()
        + got
            .hll
            .keys()
            .filter(|k| !want.hll.contains_key(*k))
            .count()
        + got
            .top
            .keys()
            .filter(|k| !want.top.contains_key(*k))
            .count()
        + got
            .hashed
            .keys()
            .filter(|k| !want.hashed.contains_key(*k))
            .count();
    for b in bad.iter().take(10) {
        eprintln!("mismatch {b}");
    }
    bad.len() + unexpected
}
