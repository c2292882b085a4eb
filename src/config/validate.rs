//! Validation: rules that span fields or need parsing beyond serde, checked before anything
//! connects. Every error names the key.

use std::net::SocketAddr;
use std::time::Duration;

use super::redact::redact_url;
use super::{Config, ConfigError, RedisMode};

pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// librdkafka properties tally sets itself; overriding them would break exactness.
const MANAGED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
];

impl Config {
    /// Rules that span fields or need parsing beyond serde.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kafka.brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "must list at least one host:port"));
        }
        if self.kafka.topic.trim().is_empty() {
            return Err(invalid("kafka.topic", "must name a topic"));
        }
        if self.kafka.group_id.trim().is_empty() {
            return Err(invalid("kafka.group_id", "must not be empty"));
        }
        for key in self.kafka.properties.keys() {
            if MANAGED_PROPERTIES.contains(&key.as_str()) {
                return Err(invalid(
                    format!("kafka.properties.\"{key}\""),
                    "is managed by tally (use kafka.brokers / kafka.group_id / kafka.start_from)",
                ));
            }
        }
        if let crate::config::Consumers::Count(n) = self.kafka.consumers {
            if !(1..=64).contains(&n) {
                return Err(invalid(
                    "kafka.consumers",
                    format!("must be between 1 and 64, or \"auto\" (got {n})"),
                ));
            }
        }
        if self.kafka.unreachable_after < Duration::from_secs(1) {
            return Err(invalid(
                "kafka.unreachable_after",
                "must be at least 1s (e.g. \"15s\")",
            ));
        }
        // Readiness hears of connected brokers from librdkafka's statistics.
        if let Some(ms) = self.kafka.properties.get("statistics.interval.ms") {
            let most = self.kafka.unreachable_after.as_millis() / 2;
            if !ms.parse::<u128>().is_ok_and(|ms| ms > 0 && ms <= most) {
                return Err(invalid(
                    "kafka.properties.\"statistics.interval.ms\"",
                    format!("must be between 1 and {most} (half of kafka.unreachable_after): readiness follows the brokers through the statistics"),
                ));
            }
        }
        for (key, file) in [
            ("redis.tls_ca_file", &self.redis.tls_ca_file),
            ("redis.tls_cert_file", &self.redis.tls_cert_file),
            ("redis.tls_key_file", &self.redis.tls_key_file),
        ] {
            if let Some(f) = file {
                if !f.is_file() {
                    return Err(invalid(
                        key,
                        format!("{} is not a readable file", f.display()),
                    ));
                }
            }
        }
        if self.redis.mode == RedisMode::Cluster
            && (self.redis.tls_ca_file.is_some() || self.redis.tls_cert_file.is_some())
        {
            return Err(invalid(
                "redis.tls_ca_file",
                "custom certificate files work in standalone mode; in cluster mode add the CA to the system trust store",
            ));
        }
        if self.redis.tls_cert_file.is_some() != self.redis.tls_key_file.is_some() {
            return Err(invalid(
                "redis.tls_key_file",
                "tls_cert_file and tls_key_file go together",
            ));
        }
        if self.redis.cluster_shards == 0 || self.redis.cluster_shards > 1024 {
            return Err(invalid(
                "redis.cluster_shards",
                "must be between 1 and 1024",
            ));
        }
        if self.redis.mode == RedisMode::Cluster
            && self.redis.nodes.is_empty()
            && self.redis.url.is_empty()
        {
            return Err(invalid(
                "redis.nodes",
                "cluster mode needs at least one seed node",
            ));
        }
        // URLs appear in messages only with their passwords masked.
        for (i, url) in self.redis.nodes.iter().enumerate() {
            let shown = redact_url(url);
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                return Err(invalid(
                    format!("redis.nodes[{i}]"),
                    format!("`{shown}` must start with redis:// or rediss://"),
                ));
            }
            redis::parse_redis_url(url).ok_or_else(|| {
                invalid(
                    format!("redis.nodes[{i}]"),
                    format!("`{shown}` is not a valid Redis URL"),
                )
            })?;
        }
        if !self.redis.url.is_empty() {
            let url = &self.redis.url;
            let shown = redact_url(url);
            if !(url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("unix://"))
            {
                return Err(invalid(
                    "redis.url",
                    format!("`{shown}` must start with redis://, rediss:// or unix://"),
                ));
            }
            redis::parse_redis_url(url).ok_or_else(|| {
                invalid("redis.url", format!("`{shown}` is not a valid Redis URL"))
            })?;
        }
        if self.redis.state_prefix.is_empty() || self.redis.state_prefix.contains(['{', '}']) {
            return Err(invalid(
                "redis.state_prefix",
                "must be non-empty and contain no braces",
            ));
        }
        if self.decode.max_message_bytes == 0 || self.decode.max_value_bytes == 0 {
            return Err(invalid(
                "decode.max_message_bytes",
                "limits must be positive",
            ));
        }
        if self.decode.max_future.is_zero() {
            return Err(invalid(
                "decode.max_future",
                "must be positive (e.g. \"1d\")",
            ));
        }
        let f = &self.flush;
        if f.max_keys == 0 {
            return Err(invalid("flush.max_keys", "must be positive"));
        }
        if f.max_pending_keys < f.max_keys {
            return Err(invalid(
                "flush.max_pending_keys",
                format!("must be at least flush.max_keys ({})", f.max_keys),
            ));
        }
        if f.max_keys_per_call == 0 || f.max_keys_per_call > 100_000 {
            return Err(invalid(
                "flush.max_keys_per_call",
                "must be between 1 and 100000",
            ));
        }
        if f.max_keys_per_merged_call > 100_000 {
            return Err(invalid(
                "flush.max_keys_per_merged_call",
                "must be at most 100000 (0 turns merging off)",
            ));
        }
        if f.ttl_check_every == 0 {
            return Err(invalid("flush.ttl_check_every", "must be at least 1"));
        }
        if f.interval.is_zero() {
            return Err(invalid("flush.interval", "must be positive"));
        }
        if f.retry_initial.is_zero() || f.retry_max < f.retry_initial {
            return Err(invalid(
                "flush.retry_max",
                "need 0 < retry_initial <= retry_max",
            ));
        }
        if !self.http.listen.is_empty() && self.http.listen.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "http.listen",
                format!("`{}` is not an ip:port address", self.http.listen),
            ));
        }
        self.validate_http()?;
        self.request.validate()?;
        self.jobs.validate()?;
        self.validate_counters()
    }

    fn validate_http(&self) -> Result<(), ConfigError> {
        let h = &self.http;
        if h.header_timeout.is_zero() {
            return Err(invalid("http.header_timeout", "must be positive"));
        }
        if h.request_timeout.is_zero() {
            return Err(invalid("http.request_timeout", "must be positive"));
        }
        if h.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be at least 1"));
        }
        if h.token.is_some() && h.token_file.is_some() {
            return Err(invalid(
                "http.token_file",
                "set http.token or http.token_file, not both",
            ));
        }
        if h.token
            .as_ref()
            .is_some_and(|t| t.trim().is_empty() || t.trim() != t)
        {
            return Err(invalid(
                "http.token",
                "must be non-empty, without surrounding whitespace",
            ));
        }
        // Read it now, so a missing or empty file fails before anything connects.
        h.bearer_token()?;
        Ok(())
    }

    fn validate_counters(&self) -> Result<(), ConfigError> {
        if self.counters.is_empty() {
            return Err(invalid("counters", "at least one counter is required"));
        }
        let mut seen = std::collections::HashSet::new();
        let mut specs = Vec::with_capacity(self.counters.len());
        for (i, c) in self.counters.iter().enumerate() {
            let at = |field: &str| format!("counters[{i}].{field}");
            if c.name.is_empty()
                || !c
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(at("name"), "use letters, digits, '_' or '-'"));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(invalid(
                    at("name"),
                    format!("`{}` is used by two counters", c.name),
                ));
            }
            if c.dimensions.is_empty() {
                return Err(invalid(at("dimensions"), "list at least one event field"));
            }
            // Expiry times are i64 milliseconds; a century is far beyond any sensible retention.
            if c.retention > std::time::Duration::from_secs(100 * 365 * 86_400) {
                return Err(invalid(at("retention"), "must be at most 100 years"));
            }
            specs.push(
                crate::model::CounterSpec::compile(c)
                    .map_err(|e| invalid(at(e.field()), e.to_string()))?,
            );
            if let Some(v) = &c.value_field {
                if self
                    .counters
                    .iter()
                    .any(|o| o.dimensions.contains(v) || o.member.as_ref() == Some(v))
                {
                    return Err(invalid(
                        at("value_field"),
                        format!("`{v}` is also used as a dimension"),
                    ));
                }
                if self.decode.time_field.as_ref() == Some(v) {
                    return Err(invalid(
                        at("value_field"),
                        format!("`{v}` is also decode.time_field"),
                    ));
                }
            }
            if let Some(t) = &self.decode.time_field {
                if c.member.as_ref() == Some(t) {
                    return Err(invalid(
                        at("member"),
                        format!("`{t}` is also decode.time_field"),
                    ));
                }
                if c.dimensions.contains(t) {
                    return Err(invalid(
                        at("dimensions"),
                        format!("`{t}` is also decode.time_field"),
                    ));
                }
            }
        }
        self.validate_key_spaces(&specs)
    }

    /// No two counters may write one key (their counts would merge and the first expiry would
    /// win), and no counter may write where tally keeps its own state.
    fn validate_key_spaces(&self, specs: &[crate::model::CounterSpec]) -> Result<(), ConfigError> {
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

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
