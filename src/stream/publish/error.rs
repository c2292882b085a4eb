//! Why a publishing pass, or one counter's part of it, failed.

use super::topics::TopicError;

/// Why a publishing pass (or one counter's part of it) failed. A pass goes on with the other
/// counters and is tried again at the next interval.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// An output or late topic cannot be used (logged at ERROR by the pass, rate limited).
    #[error(transparent)]
    Topic(#[from] TopicError),
    /// No connection to Redis.
    #[error(transparent)]
    Connect(#[from] tally_counters::request::RequestError),
    /// Redis failed, or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Kafka's metadata or offsets could not be read, or a client could not be made.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A topic read by the counters has no partitions (its watermark is unknown).
    #[error("topic {0} has no partitions")]
    NoPartitions(String),
}
