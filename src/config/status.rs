//! `[status]`: the live status page (`GET /`, `GET /v1/status`, `tally top`).

use serde::{Deserialize, Serialize};

use super::validate::ensure;
use super::ConfigError;

/// What the live status keeps.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Keys the heavy-hitters summary of the hottest counter keys holds (0: none kept). A shown
    /// count is at most (N − held) / (hot_keys + 1) below the truth, N being every delta
    /// summarised; it is fed once per flush, and costs one hash lookup per flushed key.
    pub hot_keys: usize,
}

impl Default for StatusConfig {
    fn default() -> Self {
        StatusConfig { hot_keys: 100 }
    }
}

impl StatusConfig {
    /// At most 10 000 keys (memory is bounded by this).
    pub fn validate(&self) -> Result<(), ConfigError> {
        ensure(
            self.hot_keys <= 10_000,
            "status.hot_keys",
            "must be at most 10000 (0 turns the summary off)",
        )
    }
}
