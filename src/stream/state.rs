//! `tally state`: inspect and repair tally's own state in Redis — each shard's state marker and
//! the applied offset (fence) of every (topic, partition, shard): fences are per topic-partition. A running tally retries halted
//! partitions every few seconds, so a repair takes effect without a restart.

use redis::Value;

use rdkafka::error::KafkaError;

use crate::config::{Config, ConfigError};
use crate::stream::sink::conn::{Conn, Connector};
use crate::stream::sink::{script, FenceScope};

/// One (partition, shard) as Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRow {
    /// Kafka topic.
    pub topic: String,
    /// Kafka partition.
    pub partition: i32,
    /// Shard (0 on standalone Redis).
    pub shard: u32,
    /// The fence's text, `None` if the key is missing, `Some("<wrong type: T>")` for another type.
    pub fence: Option<String>,
    /// The state marker's copy of the fence.
    pub marker_copy: Option<String>,
}

impl FenceRow {
    /// A short verdict: `ok`, `missing`, `corrupt`, `no state`.
    pub fn status(&self) -> &'static str {
        match (&self.fence, &self.marker_copy) {
            (Some(f), _) if f.parse::<i64>().is_ok() => "ok",
            (Some(_), _) => "corrupt",
            (None, Some(_)) => "missing",
            (None, None) => "no state",
        }
    }
}

/// Why `tally state` cannot inspect or repair.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The configuration does not compile.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `[redis]` names no usable server.
    #[error("redis configuration: {0}")]
    RedisConfig(redis::RedisError),
    /// No connection to Redis.
    #[error("cannot connect to redis: {0}")]
    Connect(redis::RedisError),
    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Kafka's topics could not be listed (for `kafka.topics[].pattern`).
    #[error("cannot list kafka's topics for kafka.topics[].pattern: {0}")]
    Kafka(#[from] KafkaError),
    /// The listing thread ended without an answer.
    #[error("cannot list kafka's topics: {0}")]
    Listing(#[from] tokio::task::JoinError),
    /// Several topics are read and none was named.
    #[error("several topics are read: name one with --topic")]
    TopicNeeded,
    /// `--topic` names a topic tally does not read.
    #[error("--topic {0}: not a topic tally reads (kafka.topic, kafka.topics[].name, or matched by kafka.topics[].pattern)")]
    NotRead(String),
    /// A negative `--offset`.
    #[error("--offset {0}: offsets are not negative")]
    NegativeOffset(i64),
    /// The marker's copy of the fence is not an offset.
    #[error("shard {shard}: the marker's copy `{copy}` is not an offset; pass --offset")]
    BadCopy {
        /// The shard.
        shard: u32,
        /// What the marker holds.
        copy: String,
    },
    /// The marker holds no copy of the partition's fence.
    #[error("shard {shard}: the state marker holds no copy of partition {partition}'s offset; pass --offset N (e.g. Kafka's committed offset, accepting that events between it and the lost offset are counted again)")]
    NoCopy {
        /// The shard.
        shard: u32,
        /// The partition.
        partition: i32,
    },
}

async fn connect(config: &Config) -> Result<Conn, StateError> {
    let connector = Connector::new(&config.redis).map_err(StateError::RedisConfig)?;
    connector.connect().await.map_err(StateError::Connect)
}

/// The fences of `partitions` of every topic read, plus every partition a state marker names.
/// The topics of `kafka.topics[].pattern` are those the cluster has now (asked of Kafka).
pub async fn inspect(config: &Config, partitions: &[i32]) -> Result<Vec<FenceRow>, StateError> {
    let mut names: Vec<String> = config
        .topics()
        .iter()
        .filter(|t| !t.pattern)
        .map(|t| t.name.to_string())
        .collect();
    names.extend(pattern_topics(config).await?);
    let mut conn = connect(config).await?;
    let mut rows = Vec::new();
    for topic in names {
        let scope = FenceScope::new(&config.redis, &config.kafka.group_id, &topic);
        inspect_topic(&mut conn, &scope, partitions, &mut rows).await?;
    }
    Ok(rows)
}

/// The topics the patterns of `kafka.topics` read now (none without a pattern).
async fn pattern_topics(config: &Config) -> Result<Vec<String>, StateError> {
    let model = crate::config::Model::compile(config.clone())?;
    if model.patterns.is_empty() {
        return Ok(Vec::new());
    }
    let kafka = config.kafka.clone();
    let names = tokio::task::spawn_blocking(move || -> Result<Vec<String>, KafkaError> {
        let lister = crate::stream::consumer::discover::TopicLister::new(&kafka)?;
        lister.list(std::time::Duration::from_secs(10))
    })
    .await??;
    let found = crate::stream::consumer::discover::matches(&model, &names);
    Ok(found.read.into_iter().map(|(name, _)| name).collect())
}

/// [`inspect`] of the topic of `scope`, into `rows`.
async fn inspect_topic(
    conn: &mut Conn,
    scope: &FenceScope,
    partitions: &[i32],
    rows: &mut Vec<FenceRow>,
) -> Result<(), StateError> {
    for shard in 0..scope.layout.shards() {
        let marker = scope.marker(shard);
        let kind: String = conn.query(redis::cmd("TYPE").arg(&marker)).await?;
        let copies: Vec<(String, String)> = if kind == "hash" {
            conn.query(redis::cmd("HGETALL").arg(&marker)).await?
        } else {
            Vec::new()
        };
        let mut parts: Vec<i32> = partitions.to_vec();
        parts.extend(copies.iter().filter_map(|(f, _)| f.parse::<i32>().ok()));
        parts.sort_unstable();
        parts.dedup();
        for p in parts {
            let fence_key = scope.key(p, shard);
            let kind: String = conn.query(redis::cmd("TYPE").arg(&fence_key)).await?;
            let fence = match kind.as_str() {
                "none" => None,
                "string" => conn.query(redis::cmd("GET").arg(&fence_key)).await?,
                other => Some(format!("<wrong type: {other}>")),
            };
            let marker_copy = copies
                .iter()
                .find(|(f, _)| f == &p.to_string())
                .map(|(_, v)| v.clone());
            rows.push(FenceRow {
                topic: scope.topic.clone(),
                partition: p,
                shard,
                fence,
                marker_copy,
            });
        }
    }
    Ok(())
}

/// Set the fence of every shard of `partition` of `topic` (None: the only topic read): to
/// `offset`, or (without it) to the state marker's copy, which the flush script writes in the
/// same atomic step as the fence. Returns what was written per shard.
pub async fn repair(
    config: &Config,
    topic: Option<&str>,
    partition: i32,
    offset: Option<i64>,
) -> Result<Vec<(u32, i64)>, StateError> {
    let topics = config.topics();
    let patterns = config.topic_patterns();
    let topic = match (topic, &topics[..]) {
        (None, [only]) if !only.pattern => only.name,
        (None, _) => return Err(StateError::TopicNeeded),
        (Some(name), _) => match topics.iter().find(|t| !t.pattern && t.name == name) {
            Some(t) => t.name,
            None if config.pattern_for(&patterns, name).is_some() => name,
            None => return Err(StateError::NotRead(name.to_string())),
        },
    };
    let scope = FenceScope::new(&config.redis, &config.kafka.group_id, topic);
    let mut rows = Vec::new();
    inspect_topic(&mut connect(config).await?, &scope, &[partition], &mut rows).await?;
    let mut plan = Vec::new();
    for shard in 0..scope.layout.shards() {
        let row = rows
            .iter()
            .find(|r| r.partition == partition && r.shard == shard);
        let value = match offset {
            Some(n) if n >= 0 => n,
            Some(n) => return Err(StateError::NegativeOffset(n)),
            None => match row.and_then(|r| r.marker_copy.as_deref()) {
                Some(copy) => copy.parse::<i64>().map_err(|_| StateError::BadCopy {
                    shard,
                    copy: copy.to_string(),
                })?,
                None => return Err(StateError::NoCopy { shard, partition }),
            },
        };
        plan.push((shard, value));
    }
    let mut conn = connect(config).await?;
    let now_ms = chrono::Utc::now().timestamp_millis();
    for &(shard, value) in &plan {
        let keys = scope.keys(partition, shard);
        // A fence of another type must go first; SET replaces any type anyway.
        let _: Value = conn
            .query(
                redis::cmd("EVAL")
                    .arg(script::SET_FENCE_LUA)
                    .arg(2)
                    .arg(&keys.fence)
                    .arg(&keys.marker)
                    .arg(partition)
                    .arg(value)
                    .arg(now_ms),
            )
            .await?;
    }
    Ok(plan)
}
