//! A rate-limit policy: its algorithm, its size, what it does without Redis, and the key it
//! decides on. Decided by [`super::limit`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::{default_spread_ms, stored_expire_at};

/// How a policy counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Windows aligned to the epoch; `limit` per window.
    Fixed,
    /// An exact log of admitted units over the last `window`.
    SlidingLog,
    /// The current and previous window's counts, the previous weighted by its overlap.
    SlidingCounter,
    /// Generic cell rate algorithm: `limit` per `window` evenly, bursts up to `burst`.
    Gcra,
}

impl Algorithm {
    pub(super) fn code(self) -> u8 {
        match self {
            Algorithm::Fixed => 1,
            Algorithm::SlidingLog => 2,
            Algorithm::SlidingCounter => 3,
            Algorithm::Gcra => 4,
        }
    }

    /// The key kind of a policy's state. Each algorithm keeps another Redis type (hash, sorted
    /// set, string), so a policy whose algorithm changes starts from new keys instead of failing
    /// on the old ones (WRONGTYPE was taken for an unreachable Redis: it failed open).
    pub(super) fn key_kind(self) -> &'static str {
        match self {
            Algorithm::Fixed => "limit.fixed",
            Algorithm::SlidingLog => "limit.log",
            Algorithm::SlidingCounter => "limit.counter",
            Algorithm::Gcra => "limit.gcra",
        }
    }
}

/// What a policy decides when Redis cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Admit (availability over the limit).
    #[default]
    Open,
    /// Deny (the limit over availability).
    Closed,
}

/// One named rate-limit policy (config data).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitPolicy {
    /// Name: part of the key, metric label, `RateLimit-Policy` name.
    pub name: String,
    /// How it counts.
    pub algorithm: Algorithm,
    /// Units admitted per window.
    pub limit: u64,
    /// Window length.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// GCRA only: the largest burst, in units (default: `limit`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Decide and record, but never deny (to try a policy on live traffic).
    #[serde(default)]
    pub shadow: bool,
    /// What to decide when Redis is unreachable.
    #[serde(default)]
    pub on_redis_error: FailureMode,
    /// Replicas that must have this policy's charges before a decision is answered (else the
    /// client's). A call naming several policies waits for the most any of them asks.
    #[serde(default)]
    pub durability: Option<super::Durability>,
}

/// Largest `limit` of a sliding log (its memory is one entry per admitted unit).
pub const MAX_LOG_LIMIT: u64 = 1_000_000;

/// Largest `cost` of one call to a sliding log: each unit is one sorted-set entry written by the
/// script, so a cost of 1M held Redis for about a second.
pub const MAX_LOG_COST: u64 = 1_000;

/// Why a policy's numbers cannot be used; the message names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// An empty name.
    #[error("name: must not be empty")]
    EmptyName,
    /// A limit of 0, or too large to count in microunits.
    #[error("limit: {0} is out of range")]
    LimitOutOfRange(u64),
    /// A window of 0 or over 366 days.
    #[error("window: must be between 1ms and 366 days")]
    WindowOutOfRange,
    /// A sliding log longer than [`MAX_LOG_LIMIT`] entries.
    #[error("limit: a sliding_log keeps one entry per unit; at most {MAX_LOG_LIMIT}")]
    LogTooLong,
    /// A GCRA emission interval under a microsecond.
    #[error("window / limit must be at least 1µs")]
    GcraTooFine,
    /// A burst of 0.
    #[error("burst: must be at least 1")]
    ZeroBurst,
    /// A burst on an algorithm that has none.
    #[error("burst: only the gcra algorithm has a burst")]
    BurstWithoutGcra,
}

impl LimitPolicy {
    /// Check the policy's numbers; the error names the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.name.is_empty() {
            return Err(PolicyError::EmptyName);
        }
        if self.limit == 0 || self.limit > i64::MAX as u64 / 1_000_000 {
            return Err(PolicyError::LimitOutOfRange(self.limit));
        }
        let ms = self.window.as_millis();
        if ms == 0 || ms > 366 * 86_400_000 {
            return Err(PolicyError::WindowOutOfRange);
        }
        if self.algorithm == Algorithm::SlidingLog && self.limit > MAX_LOG_LIMIT {
            return Err(PolicyError::LogTooLong);
        }
        if self.algorithm == Algorithm::Gcra && (ms * 1000) / u128::from(self.limit) == 0 {
            return Err(PolicyError::GcraTooFine);
        }
        match self.burst {
            Some(0) => Err(PolicyError::ZeroBurst),
            Some(_) if self.algorithm != Algorithm::Gcra => Err(PolicyError::BurstWithoutGcra),
            _ => Ok(()),
        }
    }

    pub(super) fn window_ms(&self) -> u64 {
        self.window.as_millis() as u64
    }

    /// How much later than its window boundary the state at `key` expires: the fixed and
    /// sliding-counter states expire at a boundary every subject shares, so each key's expiry
    /// is spread by its hash (`model::stored_expire_at`, the default spread of the window).
    /// Exact all the same: both keep the window index in the state and never read a stale
    /// window as the current one. The log and GCRA expire relative to each request's time.
    pub(super) fn expiry_offset_ms(&self, key: &str) -> i64 {
        match self.algorithm {
            Algorithm::Fixed | Algorithm::SlidingCounter => {
                let spread = default_spread_ms(self.window_ms().min(i64::MAX as u64) as i64);
                stored_expire_at(key.as_bytes(), 0, spread)
            }
            Algorithm::SlidingLog | Algorithm::Gcra => 0,
        }
    }
}
