//! `[flush]`: batching, flushing and backpressure.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::ensure;
use super::ConfigError;

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

impl FlushConfig {
    /// Sizes in range and consistent with each other, positive intervals.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ensure(self.max_keys > 0, "flush.max_keys", "must be positive")?;
        ensure(
            self.max_pending_keys >= self.max_keys,
            "flush.max_pending_keys",
            format!("must be at least flush.max_keys ({})", self.max_keys),
        )?;
        ensure(
            (1..=100_000).contains(&self.max_keys_per_call),
            "flush.max_keys_per_call",
            "must be between 1 and 100000",
        )?;
        ensure(
            self.max_keys_per_merged_call <= 100_000,
            "flush.max_keys_per_merged_call",
            "must be at most 100000 (0 turns merging off)",
        )?;
        ensure(
            self.ttl_check_every > 0,
            "flush.ttl_check_every",
            "must be at least 1",
        )?;
        ensure(
            !self.interval.is_zero(),
            "flush.interval",
            "must be positive",
        )?;
        ensure(
            !self.retry_initial.is_zero() && self.retry_max >= self.retry_initial,
            "flush.retry_max",
            "need 0 < retry_initial <= retry_max",
        )
    }
}
