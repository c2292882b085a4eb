//! The configuration of counters and of the Redis connection: plain serde data, shared by the
//! service's config file and by programs that embed this library. [`RedisConfig::validate`]
//! checks the connection settings before anything connects; its messages never show a password
//! ([`redact_url`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod output;
pub use output::{OutputConfig, OutputLate, OutputWhen};

/// Redis connection settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// One server, a Redis Cluster, or a primary found through Redis Sentinel.
    pub mode: RedisMode,
    /// `redis://host:port/db`, or `rediss://` for TLS. Empty in the demo: a local server is started.
    /// In cluster mode, used as the seed node when `nodes` is empty.
    pub url: String,
    /// Cluster seed nodes (`redis://host:port` or `rediss://`); any reachable one is enough.
    pub nodes: Vec<String>,
    /// Sentinel mode: the sentinels (`redis://host:26379`); any reachable one is enough. Each
    /// new connection asks them for the primary, so a failover is followed on reconnect.
    pub sentinels: Vec<String>,
    /// Sentinel mode: the name the sentinels monitor the primary under.
    pub master_name: String,
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
    /// A primary and its replicas watched by Redis Sentinel: the primary is asked of the
    /// sentinels on every new connection (keys as for a single server).
    Sentinel,
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
    /// How much later than window end + retention a key may expire: each key gets its own
    /// deterministic offset within it, so a window's keys do not all expire at the same instant
    /// (a stall of Redis for every client). Queries and lateness still end the window at window
    /// end + retention. Default: a tenth of window + retention, at most 5 min; `0s`: off.
    #[serde(with = "humantime_serde", default)]
    pub expiry_spread: Option<Duration>,
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
    /// Publish the final value of each key of every closed window to a Kafka topic (`tally run`
    /// with `jobs.publish`); none: the counter is only read from Redis.
    #[serde(default)]
    pub output: Option<OutputConfig>,
    /// A CEL condition an event must meet to count here (e.g. `status >= 500`); none: every
    /// event counts. Fields it reads, and this counter's own fields, may then be missing from
    /// an event: it is skipped here only (counted by reason), not refused as bad input.
    #[serde(default)]
    pub filter: Option<String>,
    /// The topics whose events this counter counts (`kafka.topics` names); empty: every topic.
    /// Another topic's events are not counted here, and need not carry this counter's fields.
    #[serde(default)]
    pub topics: Vec<String>,
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
            sentinels: Vec::new(),
            master_name: String::new(),
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
            expiry_spread: None,
            value_field: None,
            kind: CounterKind::Count,
            member: None,
            distinct: DistinctMode::Hll,
            storage: Storage::String,
            hash_key: None,
            output: None,
            filter: None,
            topics: Vec::new(),
        }
    }
}

/// Why a [`RedisConfig`] was refused: the field to change and what is expected. The reason
/// shows URLs only through [`redact_url`], so it can be printed and logged as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct RedisConfigError {
    /// The field inside the Redis settings, e.g. `tls_key_file` or `nodes[2]`.
    pub field: String,
    /// What is wrong and what is expected.
    pub reason: String,
}

/// `Ok` if `holds`, else a refusal of `field`.
fn ensure(
    holds: bool,
    field: impl Into<String>,
    reason: impl Into<String>,
) -> Result<(), RedisConfigError> {
    match holds {
        true => Ok(()),
        false => Err(RedisConfigError {
            field: field.into(),
            reason: reason.into(),
        }),
    }
}

impl RedisConfig {
    /// Rules serde cannot check: readable TLS files that fit the mode, a shard count in range,
    /// URLs that Redis can parse (one seed at least in cluster mode), and a state prefix that
    /// cannot collide with a hash tag.
    pub fn validate(&self) -> Result<(), RedisConfigError> {
        self.validate_tls()?;
        ensure(
            (1..=1024).contains(&self.cluster_shards),
            "cluster_shards",
            "must be between 1 and 1024",
        )?;
        ensure(
            !(self.mode == RedisMode::Cluster && self.nodes.is_empty() && self.url.is_empty()),
            "nodes",
            "cluster mode needs at least one seed node",
        )?;
        ensure(
            self.mode != RedisMode::Sentinel
                || (!self.sentinels.is_empty() && !self.master_name.is_empty()),
            "sentinels",
            "sentinel mode needs at least one sentinel and master_name",
        )?;
        for (i, url) in self.sentinels.iter().enumerate() {
            check_url(&format!("sentinels[{i}]"), url, &["redis://"], "redis://")?;
        }
        for (i, url) in self.nodes.iter().enumerate() {
            let schemes = ["redis://", "rediss://"];
            check_url(
                &format!("nodes[{i}]"),
                url,
                &schemes,
                "redis:// or rediss://",
            )?;
        }
        if !self.url.is_empty() {
            let schemes = ["redis://", "rediss://", "unix://"];
            check_url("url", &self.url, &schemes, "redis://, rediss:// or unix://")?;
        }
        ensure(
            !self.state_prefix.is_empty() && !self.state_prefix.contains(['{', '}']),
            "state_prefix",
            "must be non-empty and contain no braces",
        )
    }

    /// The certificate files exist, come as a pair, and are not asked of a cluster.
    fn validate_tls(&self) -> Result<(), RedisConfigError> {
        for (field, file) in [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ] {
            if let Some(f) = file {
                let reason = format!("{} is not a readable file", f.display());
                ensure(f.is_file(), field, reason)?;
            }
        }
        ensure(
            !(self.mode != RedisMode::Standalone
                && (self.tls_ca_file.is_some() || self.tls_cert_file.is_some())),
            "tls_ca_file",
            "custom certificate files work in standalone mode; in cluster and sentinel mode add the CA to the system trust store",
        )?;
        ensure(
            self.tls_cert_file.is_some() == self.tls_key_file.is_some(),
            "tls_key_file",
            "tls_cert_file and tls_key_file go together",
        )
    }
}

/// `url` starts with one of `schemes` (listed in words by `named`) and parses; the message
/// shows it with its password masked.
fn check_url(
    field: &str,
    url: &str,
    schemes: &[&str],
    named: &str,
) -> Result<(), RedisConfigError> {
    let shown = redact_url(url);
    ensure(
        schemes.iter().any(|s| url.starts_with(s)),
        field,
        format!("`{shown}` must start with {named}"),
    )?;
    ensure(
        redis::parse_redis_url(url).is_some(),
        field,
        format!("`{shown}` is not a valid Redis URL"),
    )
}

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// Whether a field or query parameter of this name holds a secret (`password`, `pass`,
/// `client_secret`, `token`, …).
pub fn is_secret_word(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token"].iter().any(|w| name.contains(w))
}

/// `url` with the password of its user info (`redis://user:***@host`) and secret query
/// parameters (`?pass=***`) masked. Text that is not a URL is returned as it is.
pub fn redact_url(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut out = url[..start].to_string();
    match authority.rfind('@') {
        Some(at) => {
            let user = authority[..at].split(':').next().unwrap_or_default();
            if authority[..at].contains(':') {
                out.push_str(user);
                out.push(':');
                out.push_str(MASK);
            } else {
                out.push_str(user);
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[authority_end..];
    match tail.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _)) if is_secret_word(name) => format!("{name}={MASK}"),
                    _ => param.to_string(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(tail),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_masked_and_users_and_hosts_kept() {
        assert_eq!(
            redact_url("redis://tally:s3cret@redis:6379/0"),
            "redis://tally:***@redis:6379/0"
        );
        assert_eq!(redact_url("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact_url("redis://p:a:ss@w@h"), "redis://p:***@h");
        assert_eq!(redact_url("redis://user@h:1"), "redis://user@h:1");
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            redact_url("unix:///run/redis.sock?db=1&pass=pw"),
            "unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(redact_url("u:pw@host:1"), "u:***@host:1");
    }

    fn refusal(change: impl FnOnce(&mut RedisConfig)) -> RedisConfigError {
        let mut config = RedisConfig::default();
        change(&mut config);
        config.validate().expect_err("refused")
    }

    #[test]
    fn the_default_is_valid_and_each_rule_names_its_field() {
        RedisConfig::default().validate().expect("the default");
        let e = refusal(|c| c.url = "http://u:hunter2@h:1".into());
        assert_eq!(e.field, "url");
        assert_eq!(
            e.reason,
            "`http://u:***@h:1` must start with redis://, rediss:// or unix://"
        );
        let e = refusal(|c| c.nodes = vec!["redis://h:1".into(), "tcp://:pw@h".into()]);
        assert_eq!(e.field, "nodes[1]");
        assert_eq!(
            e.reason,
            "`tcp://:***@h` must start with redis:// or rediss://"
        );
        let e = refusal(|c| c.url = "redis://:pw@h:notaport".into());
        assert_eq!(
            e.reason,
            "`redis://:***@h:notaport` is not a valid Redis URL"
        );
        assert_eq!(refusal(|c| c.cluster_shards = 0).field, "cluster_shards");
        assert_eq!(refusal(|c| c.cluster_shards = 1025).field, "cluster_shards");
        assert_eq!(
            refusal(|c| c.state_prefix = "{t}".into()).field,
            "state_prefix"
        );
        let e = refusal(|c| {
            c.mode = RedisMode::Cluster;
            c.url.clear();
        });
        assert_eq!(e.field, "nodes");
    }

    #[test]
    fn tls_files_exist_and_come_in_pairs() {
        let here = std::path::PathBuf::from(file!());
        let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let e = refusal(|c| c.tls_ca_file = Some(here.join("missing.pem")));
        assert_eq!(e.field, "tls_ca_file");
        assert!(e.reason.ends_with("is not a readable file"), "{e}");
        assert_eq!(
            refusal(|c| c.tls_cert_file = Some(file.clone())).field,
            "tls_key_file"
        );
        let e = refusal(|c| {
            c.mode = RedisMode::Cluster;
            c.tls_ca_file = Some(file.clone());
        });
        assert_eq!(e.field, "tls_ca_file");
        assert!(e
            .to_string()
            .starts_with("`tls_ca_file`: custom certificate"));
    }
}
