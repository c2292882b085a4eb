//! Readiness, for `/health/ready`: Kafka reachable, Redis usable, no partition halted.
//!
//! Kafka counts as reachable while a broker has been seen within `kafka.unreachable_after`:
//! librdkafka's statistics (every `statistics.interval.ms`) list a connected broker, a message
//! was fetched, or a rebalance completed. Nothing is sent to Kafka to find out, and a broker
//! that fails is noticed however librdkafka's reconnect attempts go.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::statistics::Statistics;

/// Whether the process' connections are usable.
#[derive(Debug)]
pub struct Health {
    /// When a Kafka broker was last reachable.
    pub kafka: KafkaHealth,
    /// Last Redis request succeeded.
    pub redis: AtomicBool,
    /// Partitions stopped because tally's state in Redis needs an operator, with the reason
    /// (e.g. `partition 3: fence missing`), each with the consumer lane that halted it. Not
    /// ready while any is listed.
    pub halted: parking_lot::Mutex<Vec<(usize, String)>>,
    /// Partitions being replayed from Kafka after they reopened behind where they were (Redis
    /// took their applied offsets back, or refused a unit), each with its lane: not ready until
    /// they caught up.
    pub replaying: parking_lot::Mutex<Vec<(usize, String)>>,
    /// The process does not consume (`tally serve`): Kafka is not part of readiness.
    pub without_kafka: bool,
}

impl Health {
    /// Nothing reachable yet; Kafka is given up on after `unreachable_after` without a broker.
    pub fn new(unreachable_after: Duration) -> Health {
        Health {
            kafka: KafkaHealth::new(unreachable_after),
            redis: AtomicBool::new(false),
            halted: parking_lot::Mutex::new(Vec::new()),
            replaying: parking_lot::Mutex::new(Vec::new()),
            without_kafka: false,
        }
    }

    /// For a process that serves the request path only: ready while Redis answers.
    pub fn without_kafka() -> Health {
        Health {
            without_kafka: true,
            ..Health::default()
        }
    }

    /// Ready = Kafka reachable, Redis usable, no partition halted or replaying a rollback.
    pub fn ready(&self) -> bool {
        (self.without_kafka || self.kafka.is_reachable())
            && self.redis.load(Ordering::Relaxed)
            && self.halted.lock().is_empty()
            && self.replaying.lock().is_empty()
    }

    /// Replace what consumer lane `lane` reports as replaying.
    pub fn set_replaying(&self, lane: usize, replaying: impl IntoIterator<Item = String>) {
        replace_lane(&self.replaying, lane, replaying);
    }

    /// Replace what consumer lane `lane` reports as halted (lanes own disjoint partitions).
    pub fn set_halted(&self, lane: usize, halted: impl IntoIterator<Item = String>) {
        replace_lane(&self.halted, lane, halted);
    }

    /// Every halted partition, as readiness lists it.
    pub fn halted_list(&self) -> Vec<String> {
        self.halted.lock().iter().map(|(_, h)| h.clone()).collect()
    }

    /// The readiness answer: `kafka=… redis=…`, then a line per reason for not being ready.
    pub fn describe(&self) -> String {
        self.describe_at(self.kafka.now_ms())
    }

    fn describe_at(&self, now_ms: u64) -> String {
        let kafka = self.kafka.reachable_at(now_ms);
        let redis = self.redis.load(Ordering::Relaxed);
        if self.without_kafka {
            return format!("redis={redis}\n");
        }
        let mut text = format!("kafka={kafka} redis={redis}\n");
        if !kafka {
            let _ = writeln!(text, "kafka: {}", self.kafka.why_not(now_ms));
        }
        for (_, halted) in self.halted.lock().iter() {
            let _ = writeln!(text, "halted: {halted}");
        }
        for (_, replaying) in self.replaying.lock().iter() {
            let _ = writeln!(text, "replaying: {replaying}");
        }
        text
    }
}

/// Replace what consumer lane `lane` reports in `list` (lanes own disjoint partitions).
fn replace_lane(
    list: &parking_lot::Mutex<Vec<(usize, String)>>,
    lane: usize,
    items: impl IntoIterator<Item = String>,
) {
    let mut list = list.lock();
    list.retain(|(l, _)| *l != lane);
    list.extend(items.into_iter().map(|r| (lane, r)));
}

impl Default for Health {
    /// With the default `kafka.unreachable_after`.
    fn default() -> Health {
        Health::new(crate::config::KafkaConfig::default().unreachable_after)
    }
}

/// When a Kafka broker was last reachable, on a monotonic clock.
#[derive(Debug)]
pub struct KafkaHealth {
    /// Base of `last_seen_ms`.
    epoch: Instant,
    /// Milliseconds after `epoch` when a broker was last seen, plus one (0: never).
    last_seen_ms: AtomicU64,
    /// Set by the first assignment: until the consumer has joined its group, tally is not
    /// ready even with brokers up.
    joined: AtomicBool,
    /// `kafka.unreachable_after`: how long without a broker is tolerated.
    unreachable_after: Duration,
    /// librdkafka's last authentication failure (SASL credentials refused), until the group is
    /// joined: without it, readiness could only say "not joined yet".
    auth_failure: parking_lot::Mutex<Option<String>>,
}

impl KafkaHealth {
    fn new(unreachable_after: Duration) -> KafkaHealth {
        KafkaHealth {
            epoch: Instant::now(),
            last_seen_ms: AtomicU64::new(0),
            joined: AtomicBool::new(false),
            unreachable_after,
            auth_failure: parking_lot::Mutex::new(None),
        }
    }

    /// The consumer joined its group (an assignment arrived): a broker answered, and any
    /// earlier authentication failure is over.
    pub fn joined(&self) {
        self.joined.store(true, Ordering::Relaxed);
        *self.auth_failure.lock() = None;
        self.seen();
    }

    /// A broker refused the client's credentials; `reason` is librdkafka's text (it names the
    /// broker and the mechanism, never the password).
    pub fn authentication_failed(&self, reason: &str) {
        *self.auth_failure.lock() = Some(reason.to_string());
    }

    /// A broker answered: messages were fetched, or the statistics show a connection.
    pub fn seen(&self) {
        self.seen_at(self.now_ms());
    }

    fn seen_at(&self, now_ms: u64) {
        self.last_seen_ms
            .store(now_ms.saturating_add(1), Ordering::Relaxed);
    }

    /// Record what librdkafka's statistics say: seen when any broker connection is up.
    pub fn observe(&self, statistics: &Statistics) {
        // "internal" and "logical" (group coordinator) entries are not connections of their own.
        let up = statistics
            .brokers
            .values()
            .any(|b| b.state == "UP" && matches!(b.source.as_str(), "learned" | "configured"));
        if up {
            self.seen();
        }
    }

    /// Joined, and a broker seen within `unreachable_after`.
    pub fn is_reachable(&self) -> bool {
        self.reachable_at(self.now_ms())
    }

    fn reachable_at(&self, now_ms: u64) -> bool {
        self.joined.load(Ordering::Relaxed)
            && self
                .unseen_for(now_ms)
                .is_some_and(|d| d <= self.unreachable_after)
    }

    /// Why [`KafkaHealth::is_reachable`] is false at `now_ms`, for the readiness answer.
    fn why_not(&self, now_ms: u64) -> String {
        if !self.joined.load(Ordering::Relaxed) {
            return match self.auth_failure.lock().as_deref() {
                Some(reason) => format!(
                    "consumer group not joined yet: kafka authentication failed (check the sasl.* entries of [kafka.properties]): {reason}"
                ),
                None => "consumer group not joined yet".into(),
            };
        }
        match self.unseen_for(now_ms) {
            None => "no broker reached yet".into(),
            Some(d) => format!(
                "no broker reachable for {}s (kafka.unreachable_after = {})",
                d.as_secs(),
                humantime::format_duration(self.unreachable_after)
            ),
        }
    }

    /// Time since a broker was last seen, at `now_ms`; None if never.
    fn unseen_for(&self, now_ms: u64) -> Option<Duration> {
        match self.last_seen_ms.load(Ordering::Relaxed) {
            0 => None,
            seen => Some(Duration::from_millis(now_ms.saturating_sub(seen - 1))),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_joining_and_while_a_broker_was_seen_recently() {
        let health = Health::new(Duration::from_secs(15));
        let kafka = &health.kafka;
        health.redis.store(true, Ordering::Relaxed);
        assert!(!kafka.reachable_at(0));
        kafka.seen_at(1_000);
        assert!(!kafka.reachable_at(1_000), "brokers up, group not joined");
        assert!(health.describe_at(1_000).contains("not joined"));
        kafka.joined.store(true, Ordering::Relaxed);
        assert!(kafka.reachable_at(1_000));
        assert!(
            kafka.reachable_at(16_000),
            "15 s without a broker is tolerated"
        );
        assert_eq!(health.describe_at(16_000), "kafka=true redis=true\n");

        assert!(!kafka.reachable_at(16_001));
        assert_eq!(
            health.describe_at(18_000),
            "kafka=false redis=true\nkafka: no broker reachable for 17s (kafka.unreachable_after = 15s)\n"
        );
        kafka.seen_at(18_000);
        assert!(kafka.reachable_at(18_000));
    }

    #[test]
    fn an_authentication_failure_is_named_until_the_group_is_joined() {
        let health = Health::new(Duration::from_secs(15));
        health.redis.store(true, Ordering::Relaxed);
        health
            .kafka
            .authentication_failed("SASL authentication error: invalid credentials");
        assert_eq!(
            health.describe_at(0),
            "kafka=false redis=true\nkafka: consumer group not joined yet: kafka authentication failed (check the sasl.* entries of [kafka.properties]): SASL authentication error: invalid credentials\n"
        );
        health.kafka.joined();
        assert!(health.ready());
        assert!(!health.describe().contains("authentication"));
    }

    #[test]
    fn a_halted_partition_is_named() {
        let health = Health::new(Duration::from_secs(15));
        health.redis.store(true, Ordering::Relaxed);
        health.kafka.joined();
        assert!(health.ready());
        health
            .halted
            .lock()
            .push((0, "partition 3: fence missing".into()));
        assert!(!health.ready());
        assert!(health
            .describe()
            .ends_with("\nhalted: partition 3: fence missing\n"));
    }
}
