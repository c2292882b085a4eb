//! The publisher's Kafka clients: one idempotent producer for every record it writes (window
//! results, late records, tombstones), a metadata client (watermarks, topics), and with
//! `jobs.publish.create_topics` an admin client that creates the topics that are missing.

use super::PublishError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use super::topics::TopicError;
use crate::config::Model;

/// One record to produce.
pub struct Outgoing<'a> {
    /// The record key (a counter key).
    pub key: &'a str,
    /// The value; None: a tombstone.
    pub payload: Option<&'a str>,
    /// Headers (late records say why they are there).
    pub headers: Option<OwnedHeaders>,
    /// The record's Kafka timestamp (its window's end), Unix ms.
    pub timestamp: i64,
}

/// The clients, built once per process.
pub struct Kafka {
    /// Idempotent, `acks=all`, murmur2 partitioner: every record the publisher writes.
    producer: FutureProducer,
    /// Kafka metadata and end offsets (no group, nothing consumed).
    pub consumer: BaseConsumer,
    /// Creates missing topics; None when `jobs.publish.create_topics` is off.
    admin: Option<AdminClient<DefaultClientContext>>,
    /// Every topic the publisher writes is known to exist (checked once per process, after
    /// which a deleted topic is the broker's business again).
    topics_ready: AtomicBool,
    /// `jobs.publish.send_timeout`.
    send_timeout: Duration,
}

impl Kafka {
    pub fn new(model: &Model) -> Result<Kafka, PublishError> {
        let kafka = &model.config.kafka;
        let publish = &model.config.jobs.publish;
        let mut c = ClientConfig::new();
        for (k, v) in &kafka.properties {
            // Consumer settings mean nothing to a producer or a metadata client.
            if !k.starts_with("session.")
                && !k.starts_with("heartbeat.")
                && !k.starts_with("fetch.")
            {
                c.set(k, v);
            }
        }
        c.set("bootstrap.servers", &kafka.brokers);
        let consumer: BaseConsumer = c
            .clone()
            .set("group.id", format!("{}-publish", kafka.group_id))
            .set("enable.auto.commit", "false")
            // A metadata request never creates the topic it asks about (only `create_topics`
            // does, with the configured partitions).
            .set("allow.auto.create.topics", "false")
            .create()?;
        let admin = match publish.create_topics {
            true => Some(c.create()?),
            false => None,
        };
        // The Java producer's partitioner (murmur2 of the key), unless the user chose one: a
        // join with topics written by Java clients meets the same key on the same partition
        // (librdkafka's default, crc32, does not).
        if !kafka.properties.contains_key("partitioner") {
            c.set("partitioner", "murmur2_random");
        }
        let timeout = publish.send_timeout.as_millis().to_string();
        let producer: FutureProducer = c
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", timeout)
            .create()?;
        Ok(Kafka {
            producer,
            consumer,
            admin,
            topics_ready: AtomicBool::new(false),
            send_timeout: publish.send_timeout,
        })
    }

    /// With `create_topics`, create the topics of `model`'s outputs that do not exist (once per
    /// process); without, nothing.
    pub async fn ensure_topics(&self, model: &Model) -> Result<(), TopicError> {
        let Some(admin) = &self.admin else {
            return Ok(());
        };
        if self.topics_ready.load(Ordering::Relaxed) {
            return Ok(());
        }
        super::topics::create_missing(admin, &self.consumer, model).await?;
        self.topics_ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Produce `records` to `topic` and wait for Kafka's acknowledgement of every one.
    pub async fn send(&self, topic: &str, records: Vec<Outgoing<'_>>) -> Result<(), TopicError> {
        let sends = records.into_iter().map(|r| {
            let mut rec = FutureRecord::<str, str>::to(topic)
                .key(r.key)
                .timestamp(r.timestamp);
            if let Some(p) = r.payload {
                rec = rec.payload(p);
            }
            if let Some(h) = r.headers {
                rec = rec.headers(h);
            }
            self.producer.send(rec, self.send_timeout)
        });
        for result in join_all(sends).await {
            if let Err((e, _)) = result {
                let topic = topic.to_string();
                let reason = e.to_string();
                return Err(TopicError::Send { topic, reason });
            }
        }
        Ok(())
    }
}
