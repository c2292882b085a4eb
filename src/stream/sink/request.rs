//! What the sink is asked to do ([`SinkRequest`]), and why a request or one attempt at it fails.

use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use redis::RedisError;

use super::reply::{FlushOutcome, ReplyError};
use super::script::FenceState;
use crate::stream::aggregate::FlushUnit;

/// Work for the sink task. Replies go over std channels so the consumer thread can wait
/// with a timeout without a runtime.
pub enum SinkRequest {
    /// Apply these units, in order.
    Flush {
        /// Units to apply.
        units: Vec<FlushUnit>,
        /// Receives the outcome; dropped without a reply if the sink was aborted.
        reply: std_mpsc::Sender<FlushOutcome>,
    },
    /// Read the fences of every shard of these partitions, creating those the state has no
    /// record of where asked to (see [`super::script::INIT_LUA`]). Retried until its deadline;
    /// the caller decides what to do when Redis cannot answer by then.
    InitFences {
        /// (partition, where to start it if Redis has no state for it; -1: do not create).
        partitions: Vec<(i32, i64)>,
        /// Retry until then (the caller stops waiting); through a cluster failover, attempts
        /// follow the topology watch like flushes do.
        deadline: Instant,
        /// Receives `(partition, state per shard)`, or why Redis could not answer.
        reply: std_mpsc::Sender<Result<PartitionFences, FenceError>>,
    },
}

/// The state of each shard's fence, per partition.
pub type PartitionFences = Vec<(i32, Vec<FenceState>)>;

/// Why the fences of a request could not be read by its deadline (the caller decides what
/// then happens to its partitions).
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// Redis did not answer before the deadline.
    #[error("no answer from redis in time")]
    NoAnswer,
    /// The sink task has stopped (the process is shutting down).
    #[error("redis sink stopped")]
    SinkStopped,
    /// The last attempt's error, when the retries stopped (deadline or shutdown).
    #[error("{0}")]
    Failed(String),
}

/// Why one attempt failed; every variant but `UnsafeEviction` is retried.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The connection or the command failed.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// The script was not loaded (after a restart or SCRIPT FLUSH); it is loaded again.
    #[error("script not loaded (NOSCRIPT)")]
    NoScript,
    /// A reply outside the script's contract.
    #[error("{0}")]
    Reply(#[from] ReplyError),
    /// A cluster failover during the attempt.
    #[error("the cluster's primaries changed during the attempt (a failover)")]
    TopologyChanged,
    /// Redis may evict keys: refused before anything is written.
    #[error("redis maxmemory-policy is `{0}`: it may evict counters or tally's offsets and break exactness; set it to noeviction (or redis.allow_eviction = true to accept the risk)")]
    UnsafeEviction(String),
}
