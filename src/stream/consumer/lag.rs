//! The lag probe: how far behind each partition this process owns is, asked of the broker.
//!
//! librdkafka's statistics carry an end offset and a lag only for partitions it fetches: a paused
//! or halted partition's froze (lag 127 while its backlog grew to 3,277), and between two reports
//! the end trailed the applied offset, so lag read 0 under load. The probe asks instead, every
//! `kafka.lag_interval`, on its own client (no group membership, nothing committed):
//!
//! - the end of every owned partition, in one ListOffsets request;
//! - for each partition with a backlog, the first message not yet counted (a fetch of one small
//!   batch at the applied offset): its timestamp's age is the lag in seconds.
//!
//! It writes `tally_consumer_lag_messages{topic,partition}` (end - applied, applied being what
//! Redis holds), `tally_consumer_lag_seconds{topic,partition}` (0 without a backlog) and the
//! status page's end and lag, for every topic read. A partition no longer owned loses its series.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::config::KafkaConfig;
use crate::ops::metrics::Metrics;

/// How long one round may wait for the first message of every lagging partition.
const FETCH_WAIT: Duration = Duration::from_secs(2);

/// Asks the broker for the owned partitions' ends (see the module).
pub struct LagProbe {
    consumer: BaseConsumer,
    metrics: Metrics,
    every: Duration,
    /// (topic, partition)s with series on `/metrics`, to remove those no longer owned.
    reported: BTreeSet<(String, i32)>,
}

impl LagProbe {
    /// A probe with its own Kafka client: `kafka.properties` (SASL, SSL) apply; small fetches.
    pub fn new(kafka: &KafkaConfig, metrics: Metrics) -> Result<LagProbe, KafkaError> {
        let mut c = ClientConfig::new();
        for (k, v) in &kafka.properties {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &kafka.brokers)
            // Never joins the group (it assigns partitions itself) and never commits.
            .set("group.id", format!("{}-lag-probe", kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest")
            // One small batch per partition: the first message is all it reads.
            .set("max.partition.fetch.bytes", "65536")
            .set("fetch.max.bytes", "1048576")
            .set("queued.max.messages.kbytes", "1024")
            .set("fetch.wait.max.ms", "100")
            .set("statistics.interval.ms", "0");
        Ok(LagProbe {
            consumer: c.create()?,
            metrics,
            every: kafka.lag_interval,
            reported: BTreeSet::new(),
        })
    }

    /// Probe every `kafka.lag_interval` until `shutdown`, or until `wanted` says no (blocking:
    /// run it on its own thread).
    pub fn run(mut self, shutdown: &CancellationToken, wanted: impl Fn() -> bool) {
        let log = crate::ops::log_limit::LogLimiter::new();
        let go_on = || !shutdown.is_cancelled() && wanted();
        while go_on() {
            let started = Instant::now();
            if let Err(e) = self.round() {
                if let Some(suppressed) = log.allow() {
                    tracing::warn!(error = %e, suppressed, "lag probe: kafka did not answer; the lag shown is the last known");
                }
            }
            let rest = self.every.saturating_sub(started.elapsed());
            let deadline = Instant::now() + rest;
            while go_on() && Instant::now() < deadline {
                std::thread::sleep(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(100)),
                );
            }
        }
    }

    /// One round: per topic, the ends, then the age of each backlog's first message.
    fn round(&mut self) -> Result<(), KafkaError> {
        let mut now_reported = BTreeSet::new();
        for (topic, owned) in self.metrics.status.owned() {
            self.round_of(&topic, &owned, &mut now_reported)?;
        }
        let consumer = &self.metrics.consumer;
        for (topic, p) in self.reported.difference(&now_reported) {
            let labels = [topic.as_str(), &p.to_string()];
            let _ = consumer.consumer_lag.remove_label_values(&labels);
            let _ = consumer.lag_seconds.remove_label_values(&labels);
        }
        self.reported = now_reported;
        Ok(())
    }

    /// [`LagProbe::round`] of the `owned` partitions of `topic` (with their applied offsets).
    fn round_of(
        &self,
        topic: &str,
        owned: &[(i32, Option<i64>)],
        reported: &mut BTreeSet<(String, i32)>,
    ) -> Result<(), KafkaError> {
        let parts: Vec<i32> = owned.iter().map(|(p, _)| *p).collect();
        let ends = self.ends(topic, &parts)?;
        let mut behind = BTreeMap::new();
        let mut lags = Vec::new();
        for (p, applied) in owned {
            let Some(&end) = ends.get(p) else { continue };
            self.metrics.status.kafka_end(topic, *p, end);
            let Some(applied) = *applied else { continue };
            let lag = (end - applied).max(0);
            lags.push((*p, lag));
            if lag > 0 {
                behind.insert(*p, applied);
            }
        }
        let ages = self.ages(topic, &behind);
        let consumer = &self.metrics.consumer;
        for (p, lag) in lags {
            let labels = [topic, &p.to_string()];
            consumer.consumer_lag.with_label_values(&labels).set(lag);
            let age = if lag == 0 {
                Some(0.0)
            } else {
                ages.get(&p).copied()
            };
            if let Some(age) = age {
                consumer.lag_seconds.with_label_values(&labels).set(age);
                self.metrics.status.lag_seconds(topic, p, age);
            }
            reported.insert((topic.to_string(), p));
        }
        Ok(())
    }

    /// The end offset of each of `parts`, in one ListOffsets request (the one reopening sends).
    fn ends(&self, topic: &str, parts: &[i32]) -> Result<BTreeMap<i32, i64>, KafkaError> {
        if parts.is_empty() {
            return Ok(BTreeMap::new());
        }
        let answer = super::partitions::list_offsets(&self.consumer, topic, parts, Offset::End)?;
        Ok(answer
            .elements()
            .iter()
            .filter(|e| e.error().is_ok())
            .filter_map(|e| match e.offset() {
                Offset::Offset(n) => Some((e.partition(), n)),
                _ => None,
            })
            .collect())
    }

    /// The age in seconds of the message at each partition's applied offset (the oldest not
    /// yet counted): one fetch at those offsets, at most [`FETCH_WAIT`].
    fn ages(&self, topic: &str, behind: &BTreeMap<i32, i64>) -> BTreeMap<i32, f64> {
        let mut ages = BTreeMap::new();
        if behind.is_empty() {
            return ages;
        }
        let mut tpl = TopicPartitionList::new();
        for (&p, &applied) in behind {
            if tpl
                .add_partition_offset(topic, p, Offset::Offset(applied))
                .is_err()
            {
                return ages;
            }
        }
        if self.consumer.assign(&tpl).is_err() {
            return ages;
        }
        let deadline = Instant::now() + FETCH_WAIT;
        while ages.len() < behind.len() && Instant::now() < deadline {
            let Some(Ok(m)) = self.consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let p = m.partition();
            // The first message at or after the applied offset (one there may have been
            // compacted away, or be a transaction marker).
            if ages.contains_key(&p) || behind.get(&p).is_none_or(|&a| m.offset() < a) {
                continue;
            }
            if let Some(ms) = m.timestamp().to_millis() {
                let now_ms = chrono::Utc::now().timestamp_millis();
                ages.insert(p, ((now_ms - ms).max(0)) as f64 / 1000.0);
            }
        }
        let _ = self.consumer.unassign();
        ages
    }
}
