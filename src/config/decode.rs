//! `[decode]`: how a message becomes an event.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cel::Program;
use super::fields::FieldSource;
use super::validate::{ensure, invalid};
use super::ConfigError;

/// Decoding of message payloads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeConfig {
    /// Field holding the event time; absent → the Kafka message timestamp is used.
    pub time_field: Option<String>,
    /// How `time_field` is written.
    pub time_format: TimeFormat,
    /// Larger payloads are rejected as `too_large`.
    pub max_message_bytes: usize,
    /// Longer dimension values are rejected as `too_large` (they would make huge keys).
    pub max_value_bytes: usize,
    /// Kafka topic that receives a copy of every undecodable message (with reason headers).
    pub dead_letter_topic: Option<String>,
    /// Events timed further than this after the current time are rejected as `future_time`
    /// (a wrong clock or unit would otherwise create keys that live for centuries).
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
    /// Where named fields are read from (see [`FieldSource`]): a path into the payload, the
    /// record key, a header, the topic or the partition. A name not listed is the payload's
    /// top-level field of that name.
    pub fields: BTreeMap<String, String>,
    /// Fields computed from other fields with a CEL expression (e.g. `status_class =
    /// 'string(status / 100) + "xx"'`), usable as dimensions, members, values and in filters.
    pub derive: BTreeMap<String, String>,
}

/// Encodings accepted for the event-time field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeFormat {
    /// Integer milliseconds since the Unix epoch.
    EpochMs,
    /// Integer (or fractional) seconds since the Unix epoch.
    EpochS,
    /// An RFC 3339 string such as `2025-08-01T17:03:00Z`.
    Rfc3339,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            time_field: None,
            time_format: TimeFormat::EpochMs,
            max_message_bytes: 1 << 20,
            max_value_bytes: 256,
            dead_letter_topic: None,
            max_future: Duration::from_secs(86_400),
            fields: BTreeMap::new(),
            derive: BTreeMap::new(),
        }
    }
}

impl DecodeConfig {
    /// Size limits and the future bound are positive. (How the time field relates to the
    /// counters' fields is checked with the counters.)
    pub fn validate(&self) -> Result<(), ConfigError> {
        ensure(
            self.max_message_bytes > 0 && self.max_value_bytes > 0,
            "decode.max_message_bytes",
            "limits must be positive",
        )?;
        ensure(
            !self.max_future.is_zero(),
            "decode.max_future",
            "must be positive (e.g. \"1d\")",
        )?;
        for (name, source) in &self.fields {
            let key = || format!("decode.fields.{name}");
            ensure(!name.is_empty(), key(), "a field name is not empty")?;
            FieldSource::parse(source).map_err(|e| invalid(key(), e))?;
        }
        for (name, text) in &self.derive {
            let key = || format!("decode.derive.{name}");
            ensure(
                !self.fields.contains_key(name),
                key(),
                "is also in [decode.fields]: a field is read or derived, not both",
            )?;
            let program = Program::compile(text).map_err(|e| invalid(key(), e))?;
            if let Some(v) = program.vars().iter().find(|v| self.derive.contains_key(*v)) {
                return Err(invalid(
                    key(),
                    format!("reads `{v}`, another derived field: derive from read fields only"),
                ));
            }
        }
        Ok(())
    }

    /// Where the field `name` is read from (validated: an invalid source reads as the
    /// top-level field).
    pub fn source(&self, name: &str) -> FieldSource {
        self.fields
            .get(name)
            .and_then(|s| FieldSource::parse(s).ok())
            .unwrap_or_else(|| FieldSource::top_level(name))
    }
}
