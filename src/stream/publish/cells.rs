//! The keys of a counter's windows and their values. Keys are found with SCAN (MATCH on the
//! template's literal prefix, on every primary) and read back into a window and dimension
//! values (rendering is injective, so decoding is exact); nothing is added to the stream's
//! flush to enumerate them. The cost is on the publisher: one walk over the counter's keys per
//! pass that has a window to close or corrections to look for.

use super::PublishError;
use std::collections::BTreeMap;

use redis::Value;
use tally_counters::conn::Conn;
use tally_counters::model::{untagged, CounterSpec, Kind};
use tally_counters::window::Window;

use crate::key::glob_prefix;

/// One (dimensions, window) of a counter, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// The record key: the counter's key template rendered for the dimensions and window (no
    /// cluster tag; the Redis key itself for string storage).
    pub key: String,
    /// Dimension values, in the counter's dimension order.
    pub dims: Vec<String>,
    /// The count or sum; distinct counters: the number of distinct values; leaderboards: the
    /// number of members.
    pub value: i64,
    /// Leaderboards: the best members and their scores, best first (the query's answer).
    pub top: Option<Vec<(String, i64)>>,
}

impl Cell {
    /// The cell's answer as the publisher records it (the published-values hash): the integer,
    /// or for a leaderboard the JSON of `[value, top]`, comparable as text.
    pub fn answer(&self) -> String {
        match &self.top {
            None => self.value.to_string(),
            Some(top) => serde_json::to_string(&(self.value, top)).expect("plain data serializes"),
        }
    }

    /// The cell stored in the Redis key `stored` (its dimensions decoded from the key; None for
    /// another writer's key under the same prefix).
    fn stored(
        spec: &CounterSpec,
        stored: &[u8],
        value: i64,
        top: Option<Vec<(String, i64)>>,
    ) -> Option<Cell> {
        let key = untagged(stored);
        let (dims, _) = spec.template.decode(key)?;
        Some(Cell {
            key: String::from_utf8_lossy(key).into_owned(),
            dims,
            value,
            top,
        })
    }

    /// The cell of `key` (a record key), `dims`, whose recorded [`Cell::answer`] is `text`.
    pub fn from_answer(key: String, dims: Vec<String>, text: &str) -> Option<Cell> {
        if let Ok(value) = text.parse::<i64>() {
            return Some(Cell {
                key,
                dims,
                value,
                top: None,
            });
        }
        let (value, top) = serde_json::from_str::<(i64, Vec<(String, i64)>)>(text).ok()?;
        Some(Cell {
            key,
            dims,
            value,
            top: Some(top),
        })
    }
}

/// The counter's stored keys per window start: the window and the keys (with their tags).
pub type Found = BTreeMap<i64, (Window, Vec<Vec<u8>>)>;

/// Every stored key of `spec` on every node, grouped by window.
pub async fn scan(conn: &mut Conn, spec: &CounterSpec) -> Result<Found, PublishError> {
    let pattern = glob_prefix(spec.written_template().literal_prefix());
    let mut found = Found::new();
    for node in conn.primaries().await? {
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, keys): (u64, Vec<Vec<u8>>) = conn.query_on(&node, &scan).await?;
            for key in keys {
                // Another writer's key under the same prefix is not one of the counter's.
                if let Some(window) = spec.window_of_key(&key) {
                    let entry = found
                        .entry(window.start_ms)
                        .or_insert_with(|| (window, Vec::new()));
                    entry.1.push(key);
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(found)
}

/// The cells of `window` stored in `keys` (as [`scan`] found them), sorted by record key.
pub async fn read(
    conn: &mut Conn,
    spec: &CounterSpec,
    window: &Window,
    keys: &[Vec<u8>],
) -> Result<Vec<Cell>, PublishError> {
    let mut time = String::new();
    spec.template.format_time(window.local_start, &mut time);
    let mut cells = match &spec.kind {
        Kind::HashCount { .. } => read_hashes(conn, spec, &time, keys).await?,
        Kind::Leaderboard { .. } => read_boards(conn, spec, keys).await?,
        kind => {
            let command = match kind {
                Kind::Distinct { exact: true, .. } => "SCARD",
                Kind::Distinct { exact: false, .. } => "PFCOUNT",
                _ => "GET",
            };
            let cmds = keys
                .iter()
                .map(|k| {
                    let mut cmd = redis::cmd(command);
                    cmd.arg(k);
                    (k.clone(), cmd)
                })
                .collect();
            let replies = conn.pipe_keyed(cmds).await?;
            let mut cells = Vec::with_capacity(keys.len());
            for (key, reply) in keys.iter().zip(replies) {
                // Expired or not an integer (another writer): nothing to publish.
                let cell = integer(&reply).and_then(|value| Cell::stored(spec, key, value, None));
                cells.extend(cell);
            }
            cells
        }
    };
    cells.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(cells)
}

/// Leaderboards: per key the number of members and the best `output.top` (as a query answers:
/// ZREVRANGE, best first, equal scores in reverse member order).
async fn read_boards(
    conn: &mut Conn,
    spec: &CounterSpec,
    keys: &[Vec<u8>],
) -> Result<Vec<Cell>, PublishError> {
    let top = spec
        .output
        .as_ref()
        .and_then(|o| o.top)
        .unwrap_or(crate::model::DEFAULT_TOP);
    let mut cmds = Vec::with_capacity(keys.len() * 2);
    for k in keys {
        let mut card = redis::cmd("ZCARD");
        card.arg(k);
        let mut best = redis::cmd("ZREVRANGE");
        best.arg(k).arg(0).arg(top - 1).arg("WITHSCORES");
        cmds.push((k.clone(), card));
        cmds.push((k.clone(), best));
    }
    let replies = conn.pipe_keyed(cmds).await?;
    let mut cells = Vec::with_capacity(keys.len());
    for (key, pair) in keys.iter().zip(replies.chunks(2)) {
        // Expired (no member) or not a sorted set (another writer): nothing to publish.
        let Some(value) = integer(&pair[0]).filter(|&n| n > 0) else {
            continue;
        };
        let Ok(best) = redis::from_redis_value_ref::<Vec<(String, i64)>>(&pair[1]) else {
            continue;
        };
        cells.extend(Cell::stored(spec, key, value, Some(best)));
    }
    Ok(cells)
}

/// Hash storage: every field of the window's hashes (one per shard).
async fn read_hashes(
    conn: &mut Conn,
    spec: &CounterSpec,
    time: &str,
    keys: &[Vec<u8>],
) -> Result<Vec<Cell>, PublishError> {
    let mut cells = Vec::new();
    let mut rendered = Vec::new();
    for hash in keys {
        let fields: Vec<(Vec<u8>, Value)> = conn.query(redis::cmd("HGETALL").arg(hash)).await?;
        for (field, reply) in fields {
            let Some(value) = integer(&reply) else {
                continue;
            };
            let dims: Option<Vec<String>> = field
                .split(|&b| b == b':')
                .map(tally_counters::key::unescape)
                .collect();
            let Some(dims) = dims.filter(|d| d.len() == spec.dimensions.len()) else {
                continue;
            };
            let values: Vec<&str> = dims.iter().map(String::as_str).collect();
            spec.template.render(&mut rendered, &values, time);
            let key = String::from_utf8_lossy(&rendered).into_owned();
            cells.push(Cell {
                key,
                dims,
                value,
                top: None,
            });
        }
    }
    Ok(cells)
}

/// An integer reply (GET answers text), or None (nil, or not a number).
fn integer(reply: &Value) -> Option<i64> {
    redis::from_redis_value_ref::<Option<i64>>(reply)
        .ok()
        .flatten()
}
