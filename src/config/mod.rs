//! Configuration: plain serde data, layered defaults → TOML file → `TALLY_…` environment → CLI
//! flags, and validated as a whole before anything connects.
//!
//! Environment variables use `__` between nesting levels: `TALLY_KAFKA__BROKERS`,
//! `TALLY_REDIS__URL`, `TALLY_FLUSH__INTERVAL=250ms`.

//!
//! Each section lives in its own file with its `validate()`; [`Config::validate`] runs them in
//! file order and then checks the counters, the one section whose rules span the others.

use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format as _, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

mod avro;
mod cel;
mod decode;
mod fields;
mod flush;
mod http;
mod jobs;
mod kafka;
pub mod limits;
mod log;
mod model;
mod patterns;
mod proto;
mod redact;
mod request;
mod rlqs;
mod rls;
mod status;
mod tls;
mod topics;
mod validate;

pub use avro::{schema as avro_schema, SchemaError as AvroSchemaError};
pub use cel::{EvalError, Program, Val};
pub use decode::{
    CompiledDecode, DecodeConfig, Format, RegistryConfig, RegistrySettings, SchemaSource,
    TimeFormat,
};
pub use fields::{FieldSource, Segment};
pub use flush::FlushConfig;
pub use http::HttpConfig;
pub use jobs::{JobsConfig, PublishConfig, ReconcileConfig, TtlAuditConfig};
pub use kafka::{statistics_interval_ms, AutoWord, Consumers, KafkaConfig, StartFrom};
pub use limits::{Limits, LimitsError};
pub use log::{LogConfig, LogFormat, DEFAULT_LOG};
pub use model::{Model, Tokens, Topic};
pub use patterns::TopicPattern;
pub use proto::{
    message as descriptor_message, within_budget as descriptor_within_budget,
    TooLarge as DescriptorTooLarge,
};
pub use request::{
    BatchConfig, OnceConfig, OnceWindowError, PoolConfig, QuotaConfig, RequestConfig, UniqueConfig,
};
pub use rlqs::{RlqsBucket, RlqsConfig};
pub use rls::{RlsConfig, Spread};
pub use status::StatusConfig;
pub use tally_counters::config::{
    CounterConfig, CounterKind, DistinctMode, OutputConfig, OutputLate, OutputWhen, RedisConfig,
    RedisConfigError, RedisMode, Storage,
};
pub use tls::TlsFiles;
pub use topics::{counter_reads, TopicConfig, TopicRef};

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
    /// The live status page.
    pub status: StatusConfig,
    /// Envoy's rate limit service (`tally serve`).
    pub rls: RlsConfig,
    /// Envoy's rate limit quota service, on the RLS port (`tally serve`).
    pub rlqs: RlqsConfig,
    /// What is logged.
    pub log: LogConfig,
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
    /// How often the applied offsets of every owned partition are re-read and compared with
    /// what tally knows landed (also after every reconnection to Redis): a failover to a replica
    /// that lagged takes them back with the counts, and a partition without new events would
    /// otherwise keep the hole until its next flush. A partition found behind is replayed from
    /// Kafka at once.
    #[serde(with = "humantime_serde")]
    pub fence_check_interval: Duration,
    /// Keys (and other entries) of the last landed flushes kept in memory, shared by the lanes:
    /// after a failover that lost acknowledged flushes they are applied again at once, before
    /// anything else is written, instead of replaying those offsets from Kafka. 0 keeps none.
    pub reapply_keys: usize,
}

impl RecoveryConfig {
    /// A fence check interval between 100 ms and an hour; at most 10 million kept keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate::ensure(
            (Duration::from_millis(100)..=Duration::from_secs(3600))
                .contains(&self.fence_check_interval),
            "recovery.fence_check_interval",
            "must be between 100ms and 1h",
        )?;
        validate::ensure(
            self.reapply_keys <= 10_000_000,
            "recovery.reapply_keys",
            "must be at most 10000000 (each kept key holds about 100 bytes)",
        )
    }
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
            status: StatusConfig::default(),
            rls: RlsConfig::default(),
            rlqs: RlqsConfig::default(),
            log: LogConfig::default(),
        }
    }
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            on_state_lost: OnStateLost::Rebuild,
            fence_check_interval: Duration::from_secs(10),
            reapply_keys: 50_000,
        }
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
    /// What `tally serve` does not use that this configuration sets (differs from the default):
    /// the stream's own sections and keys. Each is a warning at start, not an error: one file
    /// may serve both commands.
    pub fn ignored_by_serve(&self) -> Vec<&'static str> {
        fn differs<T: Serialize>(a: &T, b: &T) -> bool {
            serde_json::to_value(a).ok() != serde_json::to_value(b).ok()
        }
        let d = Config::default();
        [
            ("[flush]", differs(&self.flush, &d.flush)),
            ("[recovery]", differs(&self.recovery, &d.recovery)),
            (
                "kafka.consumers",
                differs(&self.kafka.consumers, &d.kafka.consumers),
            ),
            (
                "kafka.start_from",
                differs(&self.kafka.start_from, &d.kafka.start_from),
            ),
            (
                "kafka.lag_interval",
                self.kafka.lag_interval != d.kafka.lag_interval,
            ),
            ("status.hot_keys", self.status.hot_keys != d.status.hot_keys),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    /// Layer defaults, an optional file, `TALLY_…` environment and `overrides` (CLI flags, as
    /// a partial nested map), then validate.
    pub fn load(file: Option<&Path>, overrides: &serde_json::Value) -> Result<Config, ConfigError> {
        let config = Config::read(file, overrides)?;
        config.validate()?;
        Ok(config)
    }

    /// [`Config::load`] without the validation, for [`Model::compile`], which validates (and
    /// compiles the counters) once.
    pub fn read(file: Option<&Path>, overrides: &serde_json::Value) -> Result<Config, ConfigError> {
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
        Ok(config)
    }

    /// The TOML text of this configuration with secrets masked, as `tally check` prints it.
    /// With `[[kafka.topics]]`, the single-topic `kafka.topic` is left out: its default names a
    /// topic that is not read.
    pub fn to_toml(&self) -> String {
        let rendered = toml::Table::try_from(self.redacted()).map(|mut table| {
            if !self.kafka.topics.is_empty() {
                if let Some(toml::Value::Table(kafka)) = table.get_mut("kafka") {
                    kafka.remove("topic");
                }
            }
            table
        });
        rendered
            .and_then(|t| toml::to_string_pretty(&t))
            .unwrap_or_else(|e| format!("# cannot render: {e}"))
    }
}
