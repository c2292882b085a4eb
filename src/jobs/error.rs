//! Why a job's pass failed: the pass is logged (rate limited), shown on the status page, and
//! run again at the next interval.

use crate::stream::publish::PublishError;

/// Why a job's pass (or its start) failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// Redis could not be reached, or a request-path call failed.
    #[error(transparent)]
    Request(#[from] tally_counters::request::RequestError),
    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Kafka's metadata, offsets or records could not be read.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Publishing window results failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The recount did not reach the applied offsets in time.
    #[error("recount took over {minutes} minutes")]
    RecountTooSlow {
        /// The bound.
        minutes: u64,
    },
    /// The schema registry did not answer: the recount would come out short.
    #[error("schema registry unavailable: recount abandoned")]
    RegistryUnavailable,
}
