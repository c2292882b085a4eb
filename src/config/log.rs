//! `[log]`: what tally logs.

use serde::{Deserialize, Serialize};

use super::validate::ensure;
use super::ConfigError;

/// The log filter. `TALLY_LOG` in the environment, when set, takes its place (and SIGHUP then
/// keeps it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter: a level (`info`) and per-module levels (`tally::api=debug`), comma
    /// separated. Re-read from the file on SIGHUP by `tally run` and `tally serve`.
    pub level: String,
    /// How each line is written: `text` (for people; colour only on a terminal) or `json` (one
    /// object per line: `timestamp`, `level`, `message`, the event's fields, `target`; for log
    /// shippers). `TALLY_LOG_FORMAT` in the environment takes its place.
    pub format: LogFormat,
}

/// `log.format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    /// The names the configuration file takes (`TALLY_LOG_FORMAT`'s value).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use serde::de::IntoDeserializer;
        LogFormat::deserialize(s.into_deserializer())
            .map_err(|e: serde::de::value::Error| format!("`{s}`: {e}"))
    }
}

/// The filter when none is configured: librdkafka's chatter at warn.
pub const DEFAULT_LOG: &str = "info,librdkafka=warn,rdkafka=warn";

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: DEFAULT_LOG.into(),
            format: LogFormat::Text,
        }
    }
}

impl LogConfig {
    /// A filter `tracing` can parse.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let parsed = tracing_subscriber::EnvFilter::try_new(&self.level);
        ensure(
            parsed.is_ok(),
            "log.level",
            format!(
                "`{}` is not a log filter: {}",
                self.level,
                parsed.err().map(|e| e.to_string()).unwrap_or_default()
            ),
        )
    }
}
