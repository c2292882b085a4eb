//! Jobs that run on one replica at a time (leadership through a lock): the TTL auditor.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::invalid;
use super::ConfigError;

/// `[jobs]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// `[jobs.ttl_audit]`: find counter keys without expiry and give them the one their
    /// window implies.
    pub ttl_audit: TtlAuditConfig,
    /// `[jobs.reconcile]`: recount recently closed windows from Kafka and report differences.
    pub reconcile: ReconcileConfig,
    /// `[jobs.publish]`: the publisher of closed windows (runs when a counter has an `output`).
    pub publish: PublishConfig,
}

/// The publisher of window results (see the README's "Window results downstream").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// Time between two passes (each reads the watermarks, publishes what closed).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Leadership lease; a publisher killed mid-publish is replaced after at most this long.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Time allowed for Kafka to acknowledge one window's records before the pass is retried.
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// How often windows already published are read again for late changes (corrections)
    /// when none closes; a closing window is always followed by a look.
    #[serde(with = "humantime_serde")]
    pub corrections_every: Duration,
    /// Create the output topics (and late topics) that do not exist, with the settings below,
    /// through Kafka's admin API, before the first window is published. A topic that cannot be
    /// created (no CreateTopics, no permission) is an ERROR, and nothing is published until it
    /// can be. Off: a missing topic is the broker's business (auto-creation, or the sends time
    /// out and the pass is retried).
    pub create_topics: bool,
    /// Partitions of a created topic; unset: the broker's `num.partitions` (Kafka 2.4+).
    pub topic_partitions: Option<u32>,
    /// Replication factor of a created topic; unset: the broker's `default.replication.factor`
    /// (Kafka 2.4+).
    pub topic_replication: Option<u16>,
    /// Topic configuration of a created topic, e.g. `"cleanup.policy" = "compact"`.
    pub topic_config: BTreeMap<String, String>,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            interval: Duration::from_secs(1),
            lease: Duration::from_secs(10),
            send_timeout: Duration::from_secs(30),
            corrections_every: Duration::from_secs(60),
            create_topics: false,
            topic_partitions: None,
            topic_replication: None,
            topic_config: BTreeMap::new(),
        }
    }
}

/// The reconciler.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileConfig {
    /// Run it (on one replica at a time; needs Kafka: `tally run` only).
    pub enabled: bool,
    /// Time between two passes.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How long after a window ends it is checked (late events settle).
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Closed windows checked per counter and pass (the most recent ones that still exist).
    pub windows: usize,
    /// Leadership lease.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            enabled: false,
            interval: Duration::from_secs(3600),
            grace: Duration::from_secs(60),
            windows: 1,
            lease: Duration::from_secs(60),
        }
    }
}

/// The TTL auditor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TtlAuditConfig {
    /// Run it (on one replica at a time).
    pub enabled: bool,
    /// Time between two passes over the keys.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Most keys inspected per second (SCAN batches are paced to it).
    pub keys_per_second: u64,
    /// Leadership lease; the leader renews it every third of it.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
}

impl Default for TtlAuditConfig {
    fn default() -> Self {
        TtlAuditConfig {
            enabled: false,
            interval: Duration::from_secs(600),
            keys_per_second: 10_000,
            lease: Duration::from_secs(30),
        }
    }
}

impl JobsConfig {
    /// Numbers in range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.ttl_audit;
        if t.interval < Duration::from_millis(10) {
            return Err(invalid("jobs.ttl_audit.interval", "must be at least 10ms"));
        }
        if t.keys_per_second == 0 {
            return Err(invalid(
                "jobs.ttl_audit.keys_per_second",
                "must be at least 1",
            ));
        }
        if t.lease < Duration::from_millis(100) || t.lease > Duration::from_secs(3600) {
            return Err(invalid(
                "jobs.ttl_audit.lease",
                "must be between 100ms and 1h",
            ));
        }
        let p = &self.publish;
        if p.interval < Duration::from_millis(10) {
            return Err(invalid("jobs.publish.interval", "must be at least 10ms"));
        }
        if p.lease < Duration::from_millis(100) || p.lease > Duration::from_secs(3600) {
            return Err(invalid(
                "jobs.publish.lease",
                "must be between 100ms and 1h",
            ));
        }
        if p.send_timeout < Duration::from_secs(1) {
            return Err(invalid("jobs.publish.send_timeout", "must be at least 1s"));
        }
        if p.corrections_every < p.interval {
            return Err(invalid(
                "jobs.publish.corrections_every",
                "must be at least jobs.publish.interval (a pass is when it looks)",
            ));
        }
        if p.topic_partitions
            .is_some_and(|n| !(1..=i32::MAX as u32).contains(&n))
        {
            return Err(invalid(
                "jobs.publish.topic_partitions",
                "must be between 1 and 2147483647 (unset: the broker's default)",
            ));
        }
        if p.topic_replication == Some(0) {
            return Err(invalid(
                "jobs.publish.topic_replication",
                "must be at least 1 (unset: the broker's default)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_topics_need_a_partition_and_a_replica() {
        let refused = |p: PublishConfig| match (JobsConfig {
            publish: p,
            ..JobsConfig::default()
        })
        .validate()
        {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let ok = PublishConfig {
            create_topics: true,
            topic_partitions: Some(1),
            topic_replication: Some(1),
            ..PublishConfig::default()
        };
        let jobs = JobsConfig {
            publish: ok.clone(),
            ..JobsConfig::default()
        };
        assert!(jobs.validate().is_ok());
        let none = PublishConfig {
            topic_partitions: Some(0),
            ..ok.clone()
        };
        assert_eq!(refused(none), "jobs.publish.topic_partitions");
        let many = PublishConfig {
            topic_partitions: Some(u32::MAX),
            ..ok.clone()
        };
        assert_eq!(refused(many), "jobs.publish.topic_partitions");
        let none = PublishConfig {
            topic_replication: Some(0),
            ..ok
        };
        assert_eq!(refused(none), "jobs.publish.topic_replication");
    }
}
