//! Configuration: plain serde data, layered defaults → TOML file → `TALLY_…` environment → CLI
//! flags, and validated as a whole before anything connects.
//!
//! Environment variables use `__` between nesting levels: `TALLY_KAFKA__BROKERS`,
//! `TALLY_REDIS__URL`, `TALLY_FLUSH__INTERVAL=250ms`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

mod jobs;
mod model;
mod redact;
mod request;

pub use jobs::{JobsConfig, ReconcileConfig, TtlAuditConfig};
pub use model::Model;
pub use request::{OnceConfig, PoolConfig, QuotaConfig, RequestConfig, UniqueConfig};
pub use tally_counters::config::{
    CounterConfig, CounterKind, DistinctMode, RedisConfig, RedisMode, Storage,
};
mod validate;

use validate::invalid;

/// Exit code for a configuration error (EX_USAGE from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// The whole configuration of one tally process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where events come from.
    pub kafka: KafkaConfig,
    /// Where counters go.
    pub redis: RedisConfig,
    /// How a message becomes an event.
    pub decode: DecodeConfig,
    /// When and how pending deltas are written.
    pub flush: FlushConfig,
    /// The metrics and health endpoint.
    pub http: HttpConfig,
    /// What to do when tally's state in Redis is missing or inconsistent.
    pub recovery: RecoveryConfig,
    /// The counters maintained from each event.
    pub counters: Vec<CounterConfig>,
    /// The request path: rate limits, quotas, once, unique, pools.
    pub request: RequestConfig,
    /// Jobs run by one replica at a time (TTL auditor).
    pub jobs: JobsConfig,
}

/// Kafka consumer settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `bootstrap.servers`: comma-separated host:port list.
    pub brokers: String,
    /// The topic to count.
    pub topic: String,
    /// Consumer group; replicas with the same group share the partitions.
    pub group_id: String,
    /// Where a partition with no applied offset in Redis and no committed offset starts.
    pub start_from: StartFrom,
    /// Extra librdkafka properties (SASL, SSL, tuning), passed through verbatim.
    pub properties: BTreeMap<String, String>,
    /// Not ready (`/health/ready` 503) once no broker has been reachable for this long, so an
    /// orchestrator sees a replica cut off from Kafka.
    #[serde(with = "humantime_serde")]
    pub unreachable_after: Duration,
    /// Consumer lanes in this process: each is a member of the group with its own thread,
    /// decoder, aggregator and Redis connection, and owns the partitions Kafka assigns it
    /// (like Kafka Streams' `num.stream.threads`). More lanes use more cores for decoding and
    /// aggregation; `"auto"` is one per core. `flush.max_pending_keys` bounds the lanes
    /// together.
    pub consumers: Consumers,
}

/// How many consumer lanes a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Consumers {
    /// This many (1 to 64).
    Count(u16),
    /// `"auto"`: one per core the process may use.
    Auto(AutoWord),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoWord {
    /// `"auto"`.
    Auto,
}

impl<'de> Deserialize<'de> for Consumers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Consumers, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Consumers;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of consumer lanes (1 to 64) or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Consumers, E> {
                u16::try_from(n)
                    .map(Consumers::Count)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Consumers, E> {
                u64::try_from(n)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Consumers, E> {
                match s {
                    "auto" => Ok(Consumers::Auto(AutoWord::Auto)),
                    _ => s
                        .parse::<u64>()
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(s), &self))
                        .and_then(|n| self.visit_u64(n)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Consumers {
    /// The number of lanes on this machine.
    pub fn resolve(self) -> usize {
        match self {
            Consumers::Count(n) => usize::from(n),
            Consumers::Auto(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Starting point for a partition tally has never counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// Count everything still retained in the topic.
    Earliest,
    /// Count only events produced from now on.
    Latest,
}

/// What to do when tally's own state in Redis is missing or does not fit the topic.
///
/// A partition whose applied offset is gone while the rest of tally's state is there (deleted,
/// partially restored), is corrupt, or lies beyond the end of the topic always halts: replaying
/// it blindly would count twice or skip. `tally state` inspects and repairs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// Redis holds no state for a partition that Kafka says tally counted before (Redis lost
    /// everything: restart without persistence, FLUSHALL, a new server).
    pub on_state_lost: OnStateLost,
}

/// Policy for a partition whose state Redis lost entirely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStateLost {
    /// Recount the partition from the earliest offset the topic retains: exact for every window
    /// whose events are all still retained.
    Rebuild,
    /// Stop the partition (readiness 503) until an operator repairs it with `tally state`.
    Halt,
}

/// Decoding of message payloads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeConfig {
    /// Field holding the event time; absent → the Kafka message timestamp is used.
    pub time_field: Option<String>,
    /// How `time_field` is written.
    pub time_format: TimeFormat,
    /// Larger payloads are rejected as `too_large`.
    pub max_message_bytes: usize,
    /// Longer dimension values are rejected as `too_large` (they would make huge keys).
    pub max_value_bytes: usize,
    /// Kafka topic that receives a copy of every undecodable message (with reason headers).
    pub dead_letter_topic: Option<String>,
    /// Events timed further than this after the current time are rejected as `future_time`
    /// (a wrong clock or unit would otherwise create keys that live for centuries).
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
}

/// Encodings accepted for the event-time field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeFormat {
    /// Integer milliseconds since the Unix epoch.
    EpochMs,
    /// Integer (or fractional) seconds since the Unix epoch.
    EpochS,
    /// An RFC 3339 string such as `2025-08-01T17:03:00Z`.
    Rfc3339,
}

/// Batching, flushing and backpressure.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlushConfig {
    /// Flush when this many distinct keys are pending.
    pub max_keys: usize,
    /// Flush at least this often while events arrive.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Pause consumption while more keys than this are pending (a flush is stuck or slow).
    pub max_pending_keys: usize,
    /// Keys per Lua script call; bounds how long one call blocks Redis.
    pub max_keys_per_call: usize,
    /// Units of several partitions that write to the same shard are merged into one script
    /// call of at most this many keys, their deltas added up: a key popular in every partition
    /// is written once per flush instead of once per partition. 0: no merging.
    pub max_keys_per_merged_call: usize,
    /// First retry delay after a failed flush; doubles up to `retry_max`, with jitter.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    /// Longest delay between flush retries.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// Every this many flushes, existing keys are also checked for a missing expiry (and repaired).
    /// New keys always get theirs; 1 = check on every flush (slower: one more call per key).
    pub ttl_check_every: u32,
    /// Time allowed for the final flush and commit on shutdown or partition revoke.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

/// The HTTP endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address for `/metrics`, `/health/*` and `/v1/count`; empty disables the server. Loopback
    /// by default: nothing is exposed unless asked for.
    pub listen: String,
    /// Time a client has to send a request's headers, counted from connecting or from the
    /// previous answer; slow and idle connections are closed after it, so they cannot pile up.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time allowed to answer one request (a `/v1/count` waiting on Redis); past it the answer
    /// is 503.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Connections served at once; one more is answered 503 and closed. Bounds the memory and
    /// file descriptors clients can take.
    pub max_connections: usize,
    /// Bearer token required for `/v1/*` (`Authorization: Bearer <token>`); `/metrics` and
    /// `/health/*` stay open for scrapers and probes. None: no token.
    pub token: Option<String>,
    /// File holding the token (surrounding whitespace ignored), to keep it out of the config.
    pub token_file: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kafka: KafkaConfig::default(),
            redis: RedisConfig::default(),
            decode: DecodeConfig::default(),
            flush: FlushConfig::default(),
            http: HttpConfig::default(),
            recovery: RecoveryConfig::default(),
            counters: vec![CounterConfig::reference()],
            request: RequestConfig::default(),
            jobs: JobsConfig::default(),
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "localhost:9092".into(),
            topic: "events".into(),
            group_id: "tally".into(),
            start_from: StartFrom::Earliest,
            properties: BTreeMap::new(),
            unreachable_after: Duration::from_secs(15),
            consumers: Consumers::Auto(AutoWord::Auto),
        }
    }
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            on_state_lost: OnStateLost::Rebuild,
        }
    }
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            time_field: None,
            time_format: TimeFormat::EpochMs,
            max_message_bytes: 1 << 20,
            max_value_bytes: 256,
            dead_letter_topic: None,
            max_future: Duration::from_secs(86_400),
        }
    }
}

impl Default for FlushConfig {
    fn default() -> Self {
        FlushConfig {
            max_keys: 100_000,
            interval: Duration::from_secs(1),
            max_pending_keys: 1_000_000,
            max_keys_per_call: 1_000,
            max_keys_per_merged_call: 4_000,
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            ttl_check_every: 10,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:9100".into(),
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_connections: 128,
            token: None,
            token_file: None,
        }
    }
}

impl HttpConfig {
    /// The bearer token for `/v1/*`, from `token` or `token_file`.
    pub fn bearer_token(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.token_file else {
            return Ok(self.token.clone());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("http.token_file", format!("{}: {e}", path.display())))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(invalid(
                "http.token_file",
                format!("{} is empty", path.display()),
            ));
        }
        Ok(Some(token.to_string()))
    }
}

/// Why a configuration was refused. Every variant names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file, environment or flags could not be read into the schema.
    #[error("configuration error: {0}")]
    Load(#[from] Box<figment::Error>),
    /// A value is well-formed but not acceptable.
    #[error("configuration error: `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the key, e.g. `counters[0].window`.
        key: String,
        /// What is wrong and what is expected.
        reason: String,
    },
}

impl Config {
    /// Layer defaults, an optional file, `TALLY_…` environment and `overrides` (CLI flags, as
    /// a partial nested map), then validate.
    pub fn load(file: Option<&Path>, overrides: &serde_json::Value) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(invalid(
                    "--config",
                    format!("file {} does not exist", path.display()),
                ));
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        // Only nested keys come from the environment, so TALLY_CONFIG and TALLY_LOG are left alone.
        fig = fig.merge(
            Env::prefixed("TALLY_")
                .filter(|k| k.as_str().contains("__"))
                .split("__"),
        );
        fig = fig.merge(Serialized::globals(overrides));
        let config: Config = fig
            .extract()
            .map_err(|e| Box::new(redact::figment_error(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// The TOML text of this configuration with secrets masked, as `tally check` prints it.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(&self.redacted()).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }
}
