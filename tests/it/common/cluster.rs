//! Helpers for tests against a local Redis Cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use tally::model::layout::Layout;
use tally_testkit::local_redis::LocalCluster;

fn conn(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap()
}

/// Every `eo:*` key on every primary, by primary port: (stored key, value).
pub fn dump_by_primary(cluster: &LocalCluster) -> BTreeMap<u16, Vec<(String, i64)>> {
    let mut out = BTreeMap::new();
    for port in cluster.primaries() {
        let mut c = conn(port);
        let keys: Vec<String> = redis::cmd("KEYS").arg("eo:*").query(&mut c).unwrap();
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.cmd("GET").arg(k);
        }
        let values: Vec<i64> = if keys.is_empty() {
            Vec::new()
        } else {
            pipe.query(&mut c).unwrap()
        };
        out.insert(port, keys.into_iter().zip(values).collect());
    }
    out
}

/// The stored key of a plain `eo:` key of the stream's counters: the tag of its series (counter
/// and dimension values, not the window), so every window of a series shares a slot.
fn expected_stored(layout: &Layout, plain: &str) -> String {
    let parts: Vec<&str> = plain.split(':').collect();
    let counter = match parts[1] {
        "min" => "minute",
        other => other,
    };
    let values = &parts[2..parts.len() - 1];
    let shard = tally::model::layout::series_shard(counter, values, layout.shards());
    format!("{plain}:{{{}}}", layout.tag(shard).unwrap_or_default())
}

/// Compare the cluster's keys with the truth (plain keys), checking each stored key carries the
/// tag the documented layout gives its plain key. Returns (keys compared, mismatches, spread).
pub fn compare(
    cluster: &LocalCluster,
    shards: u32,
    truth: &BTreeMap<String, i64>,
) -> (usize, usize, Vec<usize>) {
    let layout = Layout::cluster(shards);
    let by_primary = dump_by_primary(cluster);
    let spread: Vec<usize> = by_primary.values().map(Vec::len).collect();
    let mut got = BTreeMap::new();
    let mut mismatches = 0;
    for (stored, v) in by_primary.into_values().flatten() {
        let plain = stored
            .rsplit_once(":{")
            .map_or(stored.as_str(), |(p, _)| p)
            .to_string();
        if expected_stored(&layout, &plain) != stored {
            eprintln!("key {stored} does not carry its documented tag");
            mismatches += 1;
        }
        got.insert(plain, v);
    }
    for (k, w) in truth {
        if got.get(k) != Some(w) {
            if mismatches < 10 {
                eprintln!("mismatch {k}: want {w}, got {:?}", got.get(k));
            }
            mismatches += 1;
        }
    }
    mismatches += got.keys().filter(|k| !truth.contains_key(*k)).count();
    (truth.len(), mismatches, spread)
}

/// Minimum applied offset over the shards of each partition (the resume point).
pub fn applied(
    cluster: &LocalCluster,
    shards: u32,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<i64> {
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let Ok(mut c) = client.get_connection() else {
        return vec![-1; partitions as usize];
    };
    let layout = Layout::cluster(shards);
    (0..partitions)
        .map(|p| {
            (0..shards)
                .map(|s| {
                    let key = format!(
                        "tally:applied:{group}:{topic}:{p}:{s}:{{{}}}",
                        layout.tag(s).unwrap()
                    );
                    redis::cmd("GET")
                        .arg(key)
                        .query::<Option<i64>>(&mut c)
                        .ok()
                        .flatten()
                        .unwrap_or(-1)
                })
                .min()
                .unwrap_or(-1)
        })
        .collect()
}
