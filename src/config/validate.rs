//! Validation: rules that span fields or need parsing beyond serde, checked before anything
//! connects. Every error names the key. Each section checks itself beside its definition
//! (`KafkaConfig::validate` in kafka.rs, …; the Redis settings in the library, so embedders get
//! the same rules); the counters are checked here, as their rules span sections. The whole run,
//! [`Config::validate`], is in `model.rs`: it keeps what it compiles for the model.

use std::collections::HashSet;
use std::time::Duration;

use super::cel::Program;
use super::{Config, ConfigError, CounterConfig, RedisConfigError};
use crate::model::CounterSpec;

pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// `Ok` if `holds`, else a refusal of `key`: each rule reads as what must be true.
pub(super) fn ensure(
    holds: bool,
    key: impl Into<String>,
    reason: impl Into<String>,
) -> Result<(), ConfigError> {
    match holds {
        true => Ok(()),
        false => Err(invalid(key, reason)),
    }
}

/// A Kafka topic name: 1 to 249 of letters, digits, '.', '_', '-'.
pub(super) fn legal_topic(t: &str) -> bool {
    let legal = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    !t.is_empty() && t.len() <= 249 && t.bytes().all(legal)
}

impl From<RedisConfigError> for ConfigError {
    /// The library names the field inside the Redis settings; the file has them under `redis`.
    fn from(e: RedisConfigError) -> ConfigError {
        invalid(format!("redis.{}", e.field), e.reason)
    }
}

impl Config {
    /// At least one counter, each with its own well-formed name, compiled, and no two that can
    /// write one key.
    #[allow(clippy::type_complexity)]
    pub(super) fn validate_counters(
        &self,
    ) -> Result<(Vec<CounterSpec>, Vec<Option<Program>>), ConfigError> {
        ensure(
            !self.counters.is_empty(),
            "counters",
            "at least one counter is required",
        )?;
        let mut seen = HashSet::new();
        let mut specs = Vec::with_capacity(self.counters.len());
        let mut filters = Vec::with_capacity(self.counters.len());
        for (i, c) in self.counters.iter().enumerate() {
            let key = format!("counters[{i}].name");
            let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
            ensure(
                !c.name.is_empty() && c.name.bytes().all(allowed),
                &key,
                "use letters, digits, '_' or '-'",
            )?;
            let reason = format!("`{}` is used by two counters", c.name);
            ensure(seen.insert(c.name.as_str()), key, reason)?;
            specs.push(self.validate_counter(i, c)?);
            let filter = c.filter.as_deref().map(Program::filter).transpose();
            filters
                .push(filter.map_err(|e| invalid(format!("counters[{i}].filter"), e.to_string()))?);
        }
        self.validate_counter_topics()?;
        // The decoder keeps per-event flags in 64-bit masks: one bit per counter.
        let rules = self.counters.iter().any(|c| c.filter.is_some())
            || self.topics().iter().any(|t| !t.decode.derive.is_empty())
            || self.restricts_topics();
        ensure(
            !rules || self.counters.len() <= 64,
            "counters",
            "at most 64 counters with filters, derived fields or topics",
        )?;
        self.validate_key_spaces(&specs)?;
        Ok((specs, filters))
    }

    /// One counter, `counters[i]`: its own rules, compiled, and its fields apart from the
    /// other counters' and from the event time.
    fn validate_counter(&self, i: usize, c: &CounterConfig) -> Result<CounterSpec, ConfigError> {
        let at = |field: &str| format!("counters[{i}].{field}");
        ensure(
            !c.dimensions.is_empty(),
            at("dimensions"),
            "list at least one event field",
        )?;
        // Expiry times are i64 milliseconds; a century is far beyond any sensible retention.
        ensure(
            c.retention <= Duration::from_secs(100 * 365 * 86_400),
            at("retention"),
            "must be at most 100 years",
        )?;
        ensure(
            c.expiry_spread.unwrap_or_default() <= Duration::from_secs(100 * 365 * 86_400),
            at("expiry_spread"),
            "must be at most 100 years",
        )?;
        let spec = CounterSpec::compile(c).map_err(|e| invalid(at(e.field()), e.to_string()))?;
        if let Some(v) = &c.value_field {
            let shared =
                |o: &CounterConfig| o.dimensions.contains(v) || o.member.as_ref() == Some(v);
            let reason = format!("`{v}` is also used as a dimension");
            ensure(!self.counters.iter().any(shared), at("value_field"), reason)?;
            for t in self.read_by(c) {
                let reason = format!("`{v}` is also {}.time_field", t.decode_key());
                ensure(
                    t.decode.time_field.as_ref() != Some(v),
                    at("value_field"),
                    reason,
                )?;
            }
        }
        if let Some(o) = &c.output {
            validate_output(o, c, &at)?;
        }
        for topic in self.read_by(c) {
            if let Some(t) = &topic.decode.time_field {
                let reason = || format!("`{t}` is also {}.time_field", topic.decode_key());
                ensure(c.member.as_ref() != Some(t), at("member"), reason())?;
                ensure(!c.dimensions.contains(t), at("dimensions"), reason())?;
            }
        }
        Ok(spec)
    }

    /// The topics counter `c` reads.
    fn read_by(&self, c: &CounterConfig) -> Vec<super::TopicRef<'_>> {
        let mut topics = self.topics();
        topics.retain(|t| t.read_by(c));
        topics
    }

    /// No two counters may write one key (their counts would merge and the first expiry would
    /// win), and no counter may write where tally keeps its own state.
    fn validate_key_spaces(&self, specs: &[CounterSpec]) -> Result<(), ConfigError> {
        use crate::model::overlap;
        let shown = |key: Vec<u8>| String::from_utf8_lossy(&key).into_owned();
        let prefix = &self.redis.state_prefix;
        for (j, b) in specs.iter().enumerate() {
            if let Some(key) = overlap::with_prefix(b.written_template(), prefix) {
                return Err(invalid(
                    format!("counters[{j}].key"),
                    format!(
                        "keys of counter `{}` can start with redis.state_prefix `{prefix}` (e.g. `{}`), where tally keeps its own state; start the template with other literal text",
                        b.name,
                        shown(key)
                    ),
                ));
            }
            for (i, a) in specs[..j].iter().enumerate() {
                if let Some(key) = overlap::clash(a.written_template(), b.written_template()) {
                    return Err(invalid(
                        format!("counters[{j}].key"),
                        format!(
                            "counters `{}` (counters[{i}]) and `{}` can write the same Redis key (e.g. `{}`): their counts would merge; give each counter its own literal prefix, such as `{}:`",
                            a.name,
                            b.name,
                            shown(key),
                            b.name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A counter's `output`: a topic Kafka accepts, a `top` for leaderboards only, and a
/// lateness that leaves the window's keys in Redis until the publisher has read them.
fn validate_output(
    o: &tally_counters::config::OutputConfig,
    c: &CounterConfig,
    at: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    let topic = legal_topic;
    let named = "a Kafka topic name: 1 to 249 of letters, digits, '.', '_', '-'";
    ensure(topic(&o.topic), at("output.topic"), named)?;
    if let Some(late) = &o.late_topic {
        ensure(
            o.late == tally_counters::config::OutputLate::Drop,
            at("output.late_topic"),
            "only dropped changes go to a late topic: set late = \"drop\" (with \"correct\" they are corrections in the output topic)",
        )?;
        ensure(topic(late), at("output.late_topic"), named)?;
        ensure(
            *late != o.topic,
            at("output.late_topic"),
            "must differ from output.topic, whose records stay final",
        )?;
    }
    if let Some(top) = o.top {
        ensure(
            c.kind == tally_counters::config::CounterKind::Leaderboard,
            at("output.top"),
            "only a leaderboard's records list members: remove it",
        )?;
        // The most a query lists (`query::MAX_TOP`; config does not depend on query).
        ensure(
            (1..=1000).contains(&top),
            at("output.top"),
            "must be between 1 and 1000",
        )?;
    }
    ensure(
        o.allowed_lateness < c.retention,
        at("output.allowed_lateness"),
        "must be less than the counter's retention: a window's keys must still exist when it closes (retention is the hard limit for late events, allowed_lateness the soft one)",
    )?;
    ensure(
        o.idle_timeout >= Duration::from_secs(1),
        at("output.idle_timeout"),
        "must be at least 1s",
    )
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
