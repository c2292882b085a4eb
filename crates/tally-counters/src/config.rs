//! The configuration of counters and of the Redis connection: plain serde data, shared by the
//! service's config file and by programs that embed this library.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Redis connection settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// One server, or a Redis Cluster.
    pub mode: RedisMode,
    /// `redis://host:port/db`, or `rediss://` for TLS. Empty in the demo: a local server is started.
    /// In cluster mode, used as the seed node when `nodes` is empty.
    pub url: String,
    /// Cluster seed nodes (`redis://host:port` or `rediss://`); any reachable one is enough.
    pub nodes: Vec<String>,
    /// Cluster mode: hash-tag groups per partition. Keys of one group share a slot, so each flush
    /// unit is atomic; groups are spread evenly over the slot space. Must not change once data exists.
    pub cluster_shards: u32,
    /// ACL user name (overrides one given in the URL).
    pub username: Option<String>,
    /// Password for AUTH (overrides one given in the URL).
    pub password: Option<String>,
    /// PEM file of the CA that signed the server certificate (`rediss://`); default: system roots.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate, for servers that require mutual TLS (with `tls_key_file`).
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<std::path::PathBuf>,
    /// Time allowed to establish a connection.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time allowed for one request (one shard's pipelined flush) to answer before it is retried
    /// on a fresh connection; bounds how long a dead or failed-over node stalls the flushes.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Prefix of tally's own keys (applied offsets), kept apart from counter keys.
    pub state_prefix: String,
    /// Accept a `maxmemory-policy` other than `noeviction`. Evicting a counter or one of tally's
    /// offsets breaks exactness, so tally refuses to write to such a server unless this is set.
    pub allow_eviction: bool,
}

/// Which Redis deployment tally talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// A single server (or a primary with replicas behind one address).
    Standalone,
    /// Redis Cluster: keys carry hash tags, requests follow MOVED/ASK.
    Cluster,
}

/// One counter maintained from every event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterConfig {
    /// Short name, used in metrics labels and queries.
    pub name: String,
    /// Event fields the counter groups by, in template order.
    pub dimensions: Vec<String>,
    /// Key template: dimension placeholders and one time placeholder such as `{yyyyMMddHH}`.
    pub key: String,
    /// Window length; must divide a day (1s … 1d).
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// IANA time zone that window boundaries follow.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    /// Extra lifetime of a key after its window ends (0 = expire at window end).
    #[serde(with = "humantime_serde", default)]
    pub retention: Duration,
    /// Integer field summed instead of counting 1 per event (count: the sum; leaderboard: the
    /// score added to the member).
    #[serde(default)]
    pub value_field: Option<String>,
    /// What the counter keeps per (dimensions, window).
    #[serde(default)]
    pub kind: CounterKind,
    /// Distinct and leaderboard: the event field whose values are counted distinctly or ranked.
    #[serde(default)]
    pub member: Option<String>,
    /// Distinct: HyperLogLog (≤ 12 KB per key, 0.81% standard error) or an exact set.
    #[serde(default)]
    pub distinct: DistinctMode,
    /// Count: one string key per counter, or one hash per (counter, window, shard) with a field
    /// per dimension tuple (`hash_key` names the hash).
    #[serde(default)]
    pub storage: Storage,
    /// Hash storage: the hash's key template, with the time placeholder and no dimensions, e.g.
    /// `flow:h:{yyyyMMddHH}`.
    #[serde(default)]
    pub hash_key: Option<String>,
}

/// What a counter keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterKind {
    /// A count of events, or the sum of `value_field` (INCRBY / HINCRBY).
    #[default]
    Count,
    /// The number of distinct values of `member` (PFADD or SADD).
    Distinct,
    /// A sorted set of `member` values scored by count or by the sum of `value_field` (ZINCRBY).
    Leaderboard,
}

/// How distinct values are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DistinctMode {
    /// A HyperLogLog: 0.81% standard error, at most 12 KB per key.
    #[default]
    Hll,
    /// A set of the values: exact, memory grows with the values.
    Exact,
}

/// Where a count lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// One string key per counter.
    #[default]
    String,
    /// One hash per (counter, window, shard); a field per dimension tuple.
    Hash,
}

fn default_timezone() -> String {
    "UTC".to_string()
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            mode: RedisMode::Standalone,
            url: "redis://127.0.0.1:6379".into(),
            nodes: Vec::new(),
            cluster_shards: 64,
            username: None,
            password: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            state_prefix: "tally:".into(),
            allow_eviction: false,
        }
    }
}

impl CounterConfig {
    /// The reference design: events per app/device/ip per hour, expiring when the hour ends.
    pub fn reference() -> Self {
        CounterConfig {
            name: "flow".into(),
            dimensions: vec!["app_id".into(), "device_id".into(), "ip".into()],
            key: "flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}".into(),
            window: Duration::from_secs(3600),
            timezone: default_timezone(),
            retention: Duration::ZERO,
            value_field: None,
            kind: CounterKind::Count,
            member: None,
            distinct: DistinctMode::Hll,
            storage: Storage::String,
            hash_key: None,
        }
    }
}
