//! Reconciliation: recount recently closed windows from Kafka and compare with Redis.
//!
//! A pass takes, for every count or sum counter with a retention, the last `windows` windows
//! that closed at least `grace` ago and have not expired. It snapshots how far Redis has
//! applied each partition (the minimum of its fences over the shards), reads every partition
//! from its start up to that offset with a consumer of its own (no group, nothing committed),
//! decodes each message as the stream path does, and sums the events of those windows per key.
//! Every key's sum is compared with Redis; a difference is counted in
//! `tally_reconcile_mismatches_total{counter}` and logged with the key and both values. Nothing
//! is "fixed": a mismatch means something wrote to tally's keys, or a bug, and needs a human.
//!
//! Limits: the recount needs the windows' events still retained in Kafka (a partition whose
//! start was deleted is reported as partial); events arriving after the snapshot are not in
//! either figure; distinct and leaderboard counters are not recounted.

use super::JobError;
use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::sync::Arc;

use tally_counters::model::Kind;
use tally_counters::request::Client;

use crate::config::{Model, Topic};
use crate::ops::metrics::Metrics;
use crate::stream::decode::{Decoder, Event, Record};

/// One reconciler, built once per leadership.
pub struct Reconciler {
    /// Counters, key layout and fence scope, compiled once for the process.
    model: Arc<Model>,
    client: Client,
    metrics: Metrics,
    /// Decodes recounted messages as the stream path does: one per topic, in model order.
    decoders: Vec<Decoder>,
}

/// A key (and hash field) and how to read it.
type RecountCell = (Vec<u8>, Option<Vec<u8>>);

/// The recount: per cell, the counter index and the sum of its events.
type Recount = BTreeMap<RecountCell, (usize, i64)>;

impl Reconciler {
    /// For a validated configuration.
    pub fn new(model: Arc<Model>, client: &Client, metrics: &Metrics) -> Reconciler {
        Reconciler {
            decoders: model
                .topics
                .iter()
                .map(|t| Decoder::for_topic(&model, t))
                .collect(),
            model,
            client: client.clone(),
            metrics: metrics.clone(),
        }
    }

    /// The windows to check: per counter index, their start times.
    fn targets(&self, now_ms: i64) -> Vec<(usize, Vec<i64>)> {
        let r = &self.model.config.jobs.reconcile;
        let grace = r.grace.as_millis() as i64;
        self.model
            .counters
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s.kind, Kind::Count | Kind::HashCount { .. }))
            .filter_map(|(i, s)| {
                let mut w = s.window.window_of(now_ms - grace);
                w = s.window.window_of(w.start_ms - 1);
                let mut starts = Vec::new();
                while starts.len() < r.windows && s.expire_at(w.end_ms) > now_ms + grace {
                    starts.push(w.start_ms);
                    w = s.window.window_of(w.start_ms - 1);
                }
                (!starts.is_empty()).then_some((i, starts))
            })
            .collect()
    }

    /// One pass.
    pub async fn pass(&self) -> Result<(), JobError> {
        let now = chrono::Utc::now().timestamp_millis();
        let targets = self.targets(now);
        if targets.is_empty() {
            return Ok(());
        }
        // Every topic's events add to the same keys: one recount over them all.
        let mut truth = Recount::new();
        for (topic, decoder) in self.model.topics.iter().zip(&self.decoders) {
            let applied = self.applied(topic).await?;
            // librdkafka's polling blocks: keep it off the async workers' feet.
            let partial = tokio::task::block_in_place(|| {
                self.recount(topic, decoder, &targets, &applied, &mut truth)
            })?;
            for p in &partial {
                tracing::warn!(
                    topic = %topic.name,
                    partition = p,
                    "reconcile: the partition's start was deleted; its recount is partial"
                );
            }
        }
        self.compare(&truth).await
    }

    /// How far Redis applied each partition of `topic` (the minimum over its shards; absent:
    /// skipped).
    async fn applied(&self, topic: &Topic) -> Result<BTreeMap<i32, i64>, JobError> {
        let consumer = self.consumer()?;
        let scope = &topic.scope;
        let topic = &topic.name;
        let meta = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let partitions: Vec<i32> = meta
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut out = BTreeMap::new();
        for p in partitions {
            let mut least: Option<i64> = None;
            for shard in 0..self.model.layout.shards() {
                let v: Option<i64> = self
                    .client
                    .query(redis::cmd("GET").arg(scope.key(p, shard)))
                    .await?;
                least = match (least, v) {
                    (None, v) => v,
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (Some(a), None) => Some(a),
                };
            }
            if let Some(a) = least {
                out.insert(p, a);
            }
        }
        Ok(out)
    }

    fn consumer(&self) -> Result<BaseConsumer, JobError> {
        let mut c = ClientConfig::new();
        for (k, v) in &self.model.config.kafka.properties {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.model.config.kafka.brokers)
            .set(
                "group.id",
                format!("{}-reconcile", self.model.config.kafka.group_id),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        Ok(c.create()?)
    }

    /// Add to `truth` the events of the target windows in every partition of `topic` up to its
    /// applied offset; the partitions whose start was deleted.
    fn recount(
        &self,
        topic: &Topic,
        decoder: &Decoder,
        targets: &[(usize, Vec<i64>)],
        applied: &BTreeMap<i32, i64>,
        truth: &mut Recount,
    ) -> Result<Vec<i32>, JobError> {
        let consumer = self.consumer()?;
        let topic = &topic.name;
        let (mut left, partial) = assign_from_start(&consumer, topic, applied)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while !left.is_empty() {
            if std::time::Instant::now() >= deadline {
                return Err(JobError::RecountTooSlow { minutes: 5 });
            }
            let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let msg = msg?;
            let (p, offset) = (msg.partition(), msg.offset());
            let Some(&end) = left.get(&p) else { continue };
            if offset >= end {
                left.remove(&p);
                continue;
            }
            if offset + 1 >= end {
                left.remove(&p);
            }
            let ts = msg.timestamp().to_millis();
            let record = Record {
                key: msg.key(),
                headers: msg.headers(),
                topic: msg.topic(),
                partition: p,
            };
            let event =
                match decoder.decode_record(&record, msg.payload(), ts, ts.unwrap_or(i64::MAX)) {
                    Ok(event) => event,
                    // The schema registry did not answer: this recount would come out short.
                    Err(crate::stream::decode::DecodeError::Unavailable) => {
                        return Err(JobError::RegistryUnavailable)
                    }
                    Err(_) => continue,
                };
            self.add(&event, decoder, targets, truth);
        }
        Ok(partial)
    }

    /// Add `event` to `truth` under every counter whose target windows hold it.
    fn add(
        &self,
        event: &Event,
        decoder: &Decoder,
        targets: &[(usize, Vec<i64>)],
        truth: &mut Recount,
    ) {
        for (i, starts) in targets {
            if event.skips.all().checked_shr(*i as u32).unwrap_or(0) & 1 == 1 {
                continue;
            }
            let spec = &self.model.counters[*i];
            let window = spec.window.window_of(event.ts_ms);
            if !starts.contains(&window.start_ms) {
                continue;
            }
            let values: Vec<&str> = spec
                .dimensions
                .iter()
                .filter_map(|d| decoder.field_index(d).map(|f| &*event.dims[f]))
                .collect();
            let delta = spec
                .value_field
                .as_deref()
                .and_then(|v| decoder.field_index(v))
                .map_or(1, |f| event.nums[f]);
            let (key, field, _) = spec.location_at(&values, event.ts_ms, &self.model.layout);
            let entry = truth.entry((key, field)).or_insert((*i, 0));
            entry.1 = entry.1.saturating_add(delta);
        }
    }

    async fn compare(&self, truth: &Recount) -> Result<(), JobError> {
        let cmds = truth
            .keys()
            .map(|(key, field)| {
                let cmd = match field {
                    Some(f) => redis::cmd("HGET").arg(key).arg(f).clone(),
                    None => redis::cmd("GET").arg(key).clone(),
                };
                (key.clone(), cmd)
            })
            .collect();
        let got: Vec<Option<i64>> = {
            let mut conn = self.client.conn().await?;
            let values = conn.pipe_keyed(cmds).await?;
            values
                .into_iter()
                .map(|v| redis::from_redis_value(v).unwrap_or(None))
                .collect()
        };
        for (((key, field), (i, want)), got) in truth.iter().zip(got) {
            let name = &self.model.counters[*i].name;
            self.metrics
                .jobs
                .reconciled
                .with_label_values(&[name])
                .inc();
            if got != Some(*want) {
                self.metrics
                    .jobs
                    .mismatches
                    .with_label_values(&[name])
                    .inc();
                tracing::warn!(
                    counter = %name,
                    key = %String::from_utf8_lossy(key),
                    field = field.as_deref().map(String::from_utf8_lossy).as_deref().unwrap_or(""),
                    redis = ?got,
                    kafka = want,
                    "reconcile: redis differs from the recount"
                );
            }
        }
        Ok(())
    }
}

/// Assign `consumer` every partition of `topic` from its first retained offset, those with
/// events up to their `applied` offset; answer the partitions left to read with their ends, and
/// the partitions whose start was deleted.
fn assign_from_start(
    consumer: &BaseConsumer,
    topic: &str,
    applied: &BTreeMap<i32, i64>,
) -> Result<(BTreeMap<i32, i64>, Vec<i32>), JobError> {
    let mut tpl = TopicPartitionList::new();
    let mut partial = Vec::new();
    for (&p, &end) in applied {
        let (low, _) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if low > 0 {
            partial.push(p);
        }
        if end > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
        }
    }
    let mut left: BTreeMap<i32, i64> = applied.clone();
    left.retain(|p, _| tpl.find_partition(topic, *p).is_some());
    consumer.assign(&tpl)?;
    Ok((left, partial))
}
