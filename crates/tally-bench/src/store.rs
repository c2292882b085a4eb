//! Where part 2's tally writes: one `redis-server`, or a Redis Cluster of primaries. Gives
//! tally's `[redis]` configuration and what the parent reads from each server: applied offsets,
//! `INFO` work, and the counter keys.

use std::collections::HashMap;

use anyhow::{bail, Context as _};

use tally::config::Config;
use tally::model::layout::{key_slot, shard_tags, Layout};
use tally::model::state_keys::fence_key;
use tally_testkit::local_redis::LocalCluster;

use crate::redis_stats::{redis_conn, sum_counters};
use crate::COUNTER_PATTERN;

/// One server, or every primary of a cluster.
pub enum Store {
    Standalone {
        /// `redis://127.0.0.1:<port>` of the server.
        url: String,
    },
    Cluster {
        /// The primaries, with the slot ranges each serves (read once: the benchmark does not
        /// reshard).
        primaries: Vec<Primary>,
        /// `redis.cluster_shards` (tally's default).
        shards: u32,
    },
}

/// A cluster primary.
pub struct Primary {
    /// `redis://127.0.0.1:<port>`.
    pub url: String,
    /// Inclusive slot ranges served by this primary.
    pub slots: Vec<(u16, u16)>,
}

impl Store {
    pub fn standalone(url: &str) -> Store {
        Store::Standalone {
            url: url.to_string(),
        }
    }

    /// Every primary of `cluster` and the slots it serves (its own line of `CLUSTER NODES`),
    /// with tally's default number of shards.
    pub fn cluster(cluster: &LocalCluster) -> anyhow::Result<Store> {
        let mut primaries = Vec::new();
        for port in cluster.primaries() {
            let url = format!("redis://127.0.0.1:{port}");
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut redis_conn(&url)?)?;
            let me = nodes
                .lines()
                .find(|l| {
                    l.split_whitespace()
                        .nth(2)
                        .is_some_and(|f| f.contains("myself"))
                })
                .context("CLUSTER NODES has no `myself` line")?;
            // Fields 9… are slots: `a-b` or `a`; `[…]` marks a slot being migrated.
            let slots = me
                .split_whitespace()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    Ok((a.parse()?, b.parse()?))
                })
                .collect::<anyhow::Result<Vec<(u16, u16)>>>()?;
            primaries.push(Primary { url, slots });
        }
        let served: u32 = primaries
            .iter()
            .flat_map(|p| &p.slots)
            .map(|(a, b)| u32::from(b - a) + 1)
            .sum();
        if served != 16_384 {
            bail!("the cluster's primaries serve {served} slots, not 16384");
        }
        Ok(Store::Cluster {
            primaries,
            shards: Config::default().redis.cluster_shards,
        })
    }

    /// The body of tally's `[redis]` section.
    pub fn redis_toml(&self) -> String {
        match self {
            Store::Standalone { url } => format!("url = \"{url}\""),
            Store::Cluster { primaries, .. } => {
                let nodes: Vec<String> =
                    primaries.iter().map(|p| format!("\"{}\"", p.url)).collect();
                format!("mode = \"cluster\"\nnodes = [{}]", nodes.join(", "))
            }
        }
    }

    /// One connection per server (per primary of a cluster), in a fixed order.
    pub fn connect(&self) -> anyhow::Result<Vec<redis::Connection>> {
        match self {
            Store::Standalone { url } => Ok(vec![redis_conn(url)?]),
            Store::Cluster { primaries, .. } => {
                primaries.iter().map(|p| redis_conn(&p.url)).collect()
            }
        }
    }

    /// Counter keys and the sum of their values on each server, by SCAN. On a cluster, every
    /// key must carry the hash tag the documented layout gives its plain key; `mistagged`
    /// counts those that do not.
    pub fn counters(&self, conns: &mut [redis::Connection]) -> anyhow::Result<Counted> {
        let mut counted = Counted::default();
        match self {
            Store::Standalone { .. } => {
                let (keys, sum) = sum_counters(&mut conns[0])?;
                counted.keys.push(keys);
                counted.sum = sum;
            }
            Store::Cluster { shards, .. } => {
                let layout = Layout::cluster(*shards);
                for conn in conns {
                    let (keys, sum, mistagged) = sum_tagged_counters(conn, &layout)?;
                    counted.keys.push(keys);
                    counted.sum += sum;
                    counted.mistagged += mistagged;
                }
            }
        }
        Ok(counted)
    }
}

/// What the counter keys add up to.
#[derive(Debug, Default, Clone)]
pub struct Counted {
    /// Counter keys per server.
    pub keys: Vec<u64>,
    /// Sum of all counter values.
    pub sum: i64,
    /// Cluster keys whose hash tag is not their plain key's.
    pub mistagged: u64,
}

/// Like `sum_counters`, for one cluster node: GET per key (a multi-key MGET must stay in one
/// slot), and each key's tag checked against the layout.
fn sum_tagged_counters(
    conn: &mut redis::Connection,
    layout: &Layout,
) -> anyhow::Result<(u64, i64, u64)> {
    let (mut cursor, mut keys_seen, mut sum, mut mistagged) = (0u64, 0u64, 0i64, 0u64);
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(COUNTER_PATTERN)
            .arg("COUNT")
            .arg(5000)
            .query(conn)?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("GET").arg(key);
                let text = String::from_utf8_lossy(key);
                let plain = text.rsplit_once(":{").map_or(&*text, |(p, _)| p);
                // flow:count:<app>:<device>:<ip>:<hour>: the tag of the series (counter, values).
                let parts: Vec<&str> = plain.split(':').collect();
                let values = parts
                    .get(2..parts.len().saturating_sub(1))
                    .unwrap_or_default();
                let shard = tally::model::layout::series_shard("flow", values, layout.shards());
                let mut want = plain.as_bytes().to_vec();
                layout.append_tag(&mut want, shard);
                if want != *key {
                    mistagged += 1;
                }
            }
            let values: Vec<Option<i64>> = pipe.query(conn)?;
            keys_seen += keys.len() as u64;
            sum += values.into_iter().flatten().sum::<i64>();
        }
        cursor = next;
        if cursor == 0 {
            return Ok((keys_seen, sum, mistagged));
        }
    }
}

/// Reads the applied offsets of one consumer group: one MGET per shard (the keys of a shard
/// share its hash tag, so one slot), sent to the server that holds the shard.
pub struct AppliedOffsets {
    /// Per server: its MGETs, each a shard's keys in partition order.
    mgets: Vec<Vec<Vec<String>>>,
    partitions: usize,
    /// Commands sent to each server so far.
    sent: Vec<f64>,
}

impl AppliedOffsets {
    /// The keys `tally:applied:<group>:<topic>:<partition>:<shard>[:{tag}]` of every partition
    /// and shard, grouped by the server that holds them.
    pub fn new(store: &Store, group: &str, topic: &str, partitions: i32) -> AppliedOffsets {
        let keys = |shard: u32, tag: Option<&str>| -> Vec<String> {
            (0..partitions)
                .map(|p| fence_key("tally:", group, topic, p, shard, tag))
                .collect()
        };
        let mgets = match store {
            Store::Standalone { .. } => vec![vec![keys(0, None)]],
            Store::Cluster { primaries, shards } => {
                let mut by_slot: HashMap<u16, usize> = HashMap::new();
                for (i, p) in primaries.iter().enumerate() {
                    for &(a, b) in &p.slots {
                        for slot in a..=b {
                            by_slot.insert(slot, i);
                        }
                    }
                }
                let mut mgets = vec![Vec::new(); primaries.len()];
                for (shard, tag) in shard_tags(*shards).iter().enumerate() {
                    let slot = key_slot(format!("{{{tag}}}").as_bytes());
                    mgets[by_slot[&slot]].push(keys(shard as u32, Some(tag)));
                }
                mgets
            }
        };
        AppliedOffsets {
            sent: vec![0.0; mgets.len()],
            mgets,
            partitions: partitions as usize,
        }
    }

    /// Whether every partition is applied up to `end` on every shard (the minimum over its
    /// shards, where tally would resume, is `end`). To keep the benchmark's own load on Redis
    /// as small as standalone (one MGET per call), it reads one shard first and the others only
    /// once that one is complete: offsets only grow, and no shard is ever ahead of `end`.
    pub fn all_at(&mut self, conns: &mut [redis::Connection], end: i64) -> anyhow::Result<bool> {
        let Some(server) = self.mgets.iter().position(|m| !m.is_empty()) else {
            return Ok(false);
        };
        let first: Vec<Option<i64>> = redis::cmd("MGET")
            .arg(&self.mgets[server][0])
            .query(&mut conns[server])?;
        self.sent[server] += 1.0;
        if first.iter().any(|a| *a != Some(end)) {
            return Ok(false);
        }
        // `i64::MAX`: the first MGET was the only one.
        Ok(self
            .read_skipping(conns, Some((server, 0)))?
            .iter()
            .all(|a| *a == end || *a == i64::MAX))
    }

    /// The applied offset of each partition: the minimum over its shards (-1 where a shard has
    /// none yet).
    pub fn read(&mut self, conns: &mut [redis::Connection]) -> anyhow::Result<Vec<i64>> {
        self.read_skipping(conns, None)
    }

    /// Like `read`, without MGET `skip` (server, index); a server's MGETs go in one pipeline.
    /// With no MGET left to send, every partition is `i64::MAX`.
    fn read_skipping(
        &mut self,
        conns: &mut [redis::Connection],
        skip: Option<(usize, usize)>,
    ) -> anyhow::Result<Vec<i64>> {
        let mut applied = vec![i64::MAX; self.partitions];
        for (server, (conn, mgets)) in conns.iter_mut().zip(&self.mgets).enumerate() {
            let mut pipe = redis::pipe();
            for (i, keys) in mgets.iter().enumerate() {
                if skip != Some((server, i)) {
                    pipe.cmd("MGET").arg(keys);
                    self.sent[server] += 1.0;
                }
            }
            if pipe.cmd_iter().next().is_none() {
                continue;
            }
            let replies: Vec<Vec<Option<i64>>> = pipe.query(conn)?;
            for offsets in replies {
                for (a, offset) in applied.iter_mut().zip(offsets) {
                    *a = (*a).min(offset.unwrap_or(-1));
                }
            }
        }
        Ok(applied)
    }

    /// Commands sent to server `i` so far.
    pub fn sent_to(&self, i: usize) -> f64 {
        self.sent.get(i).copied().unwrap_or(0.0)
    }
}
