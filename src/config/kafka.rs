//! `[kafka]`: where events come from, and how many consumer lanes read them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::topics::TopicConfig;
use super::validate::ensure;
use super::ConfigError;

/// Kafka consumer settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `bootstrap.servers`: comma-separated host:port list.
    pub brokers: String,
    /// The topic to count (the single-topic form; see `topics`).
    pub topic: String,
    /// Several topics, each with its own decoding (`[[kafka.topics]]`); empty: `topic`, decoded
    /// per `[decode]`. Each topic gets `consumers` lanes of its own, all in one group.
    pub topics: Vec<TopicConfig>,
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
    /// together. With `topics`, this many lanes per topic.
    pub consumers: Consumers,
    /// How often the end of every partition this process owns is asked of the broker (one
    /// ListOffsets request), with the age of the oldest message not yet counted: the lag on
    /// `/metrics`, the status page and `tally top`, paused and halted partitions included.
    #[serde(with = "humantime_serde")]
    pub lag_interval: Duration,
    /// With a topic pattern (`kafka.topics[].pattern`): how often the cluster's topics are
    /// listed, so a topic created later is read within this long.
    #[serde(with = "humantime_serde")]
    pub topics_refresh: Duration,
    /// With a topic pattern: the most topics the patterns read together. The process' bounds
    /// (pending keys, prefetch) are shared by the lanes of the listed topics and this many
    /// more; matches beyond it are not read (`tally_pattern_topics{state="over_limit"}`).
    pub max_pattern_topics: usize,
    /// Static membership: a name for this process that stays the same across its restarts (a
    /// StatefulSet pod's name, `TALLY_KAFKA__INSTANCE_ID` from `metadata.name`). Each lane
    /// joins as `group.instance.id` `<instance_id>-<lane>`; a lane restarted within
    /// `session.timeout.ms` gets its partitions back without a rebalance, so set that timeout
    /// (in `properties`) longer than a restart. Empty: dynamic membership (each start is a new
    /// member; with the default cooperative-sticky assignment only moved partitions pause).
    pub instance_id: String,
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

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "localhost:9092".into(),
            topic: "events".into(),
            topics: Vec::new(),
            group_id: "tally".into(),
            start_from: StartFrom::Earliest,
            properties: BTreeMap::new(),
            unreachable_after: Duration::from_secs(15),
            consumers: Consumers::Auto(AutoWord::Auto),
            lag_interval: Duration::from_secs(5),
            topics_refresh: Duration::from_secs(30),
            max_pattern_topics: 16,
            instance_id: String::new(),
        }
    }
}

/// librdkafka properties tally sets itself; overriding them would break exactness.
const MANAGED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
];

impl KafkaConfig {
    /// Names that must be there, properties tally manages itself, a lane count in range, and
    /// readiness that hears of the brokers often enough.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ensure(
            !self.brokers.trim().is_empty(),
            "kafka.brokers",
            "must list at least one host:port",
        )?;
        ensure(
            !self.topic.trim().is_empty() || !self.topics.is_empty(),
            "kafka.topic",
            "must name a topic",
        )?;
        ensure(
            !self.group_id.trim().is_empty(),
            "kafka.group_id",
            "must not be empty",
        )?;
        for key in self.properties.keys() {
            ensure(
                !MANAGED_PROPERTIES.contains(&key.as_str()),
                format!("kafka.properties.\"{key}\""),
                "is managed by tally (use kafka.brokers / kafka.group_id / kafka.start_from)",
            )?;
        }
        if let Consumers::Count(n) = self.consumers {
            ensure(
                (1..=64).contains(&n),
                "kafka.consumers",
                format!("must be between 1 and 64, or \"auto\" (got {n})"),
            )?;
        }
        ensure(
            self.unreachable_after >= Duration::from_secs(1),
            "kafka.unreachable_after",
            "must be at least 1s (e.g. \"15s\")",
        )?;
        ensure(
            self.lag_interval >= Duration::from_millis(100),
            "kafka.lag_interval",
            "must be at least 100ms (e.g. \"5s\")",
        )?;
        ensure(
            self.topics_refresh >= Duration::from_millis(100),
            "kafka.topics_refresh",
            "must be at least 100ms (e.g. \"30s\")",
        )?;
        ensure(
            (1..=256).contains(&self.max_pattern_topics),
            "kafka.max_pattern_topics",
            format!(
                "must be between 1 and 256 (got {})",
                self.max_pattern_topics
            ),
        )?;
        // Readiness hears of connected brokers from librdkafka's statistics.
        if let Some(ms) = self.properties.get("statistics.interval.ms") {
            let most = self.unreachable_after.as_millis() / 2;
            ensure(
                ms.parse::<u128>().is_ok_and(|ms| ms > 0 && ms <= most),
                "kafka.properties.\"statistics.interval.ms\"",
                format!("must be between 1 and {most} (half of kafka.unreachable_after): readiness follows the brokers through the statistics"),
            )?;
        }
        Ok(())
    }
}

/// librdkafka's statistics interval for `unreachable_after`: a third of it, 100 ms to 5 s.
pub fn statistics_interval_ms(unreachable_after: std::time::Duration) -> u128 {
    (unreachable_after.as_millis() / 3).clamp(100, 5_000)
}
