//! Dead letters: undecodable messages copied, as they were, to a Kafka topic with headers saying
//! why and where they came from. Delivery is at-least-once: a replay after a crash may send a
//! message again.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};

use crate::config::KafkaConfig;
use crate::ops::metrics::Metrics;

/// Counts deliveries.
pub struct DeliveryCounter {
    metrics: Metrics,
}

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.metrics.decode.dead_letters.inc(),
            Err((e, _)) => {
                self.metrics.decode.dead_letter_errors.inc();
                tracing::warn!(error = %e, "dead-letter delivery failed");
            }
        }
    }
}

/// Producer of dead letters for one source topic.
pub struct DeadLetters {
    producer: ThreadedProducer<DeliveryCounter>,
    topic: String,
    source_topic: String,
    metrics: Metrics,
}

/// Properties shared by consumer and producer (security, networking); consumer-only ones are left out.
fn shared_property(key: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "security.",
        "sasl.",
        "ssl.",
        "ssl_",
        "client.",
        "socket.",
        "broker.",
        "metadata.",
        "api.version",
        "reconnect.",
        "retry.",
        "debug",
        "log_level",
        "enable.ssl",
        "topic.metadata.",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p))
}

impl DeadLetters {
    /// A producer to `topic` of copies of `source`'s messages, using the consumer's brokers
    /// and security settings.
    pub fn new(
        kafka: &KafkaConfig,
        source: &str,
        topic: &str,
        metrics: Metrics,
    ) -> rdkafka::error::KafkaResult<DeadLetters> {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &kafka.brokers)
            .set("linger.ms", "20");
        for (k, v) in kafka.properties.iter().filter(|(k, _)| shared_property(k)) {
            cc.set(k, v);
        }
        let producer = cc.create_with_context(DeliveryCounter {
            metrics: metrics.clone(),
        })?;
        Ok(DeadLetters {
            producer,
            topic: topic.to_string(),
            source_topic: source.to_string(),
            metrics,
        })
    }

    /// Queue a copy of a skipped message. Never blocks: when the local queue is full the
    /// message is counted as a dead-letter error.
    pub fn send(
        &self,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        reason: &str,
    ) {
        let partition_text = partition.to_string();
        let offset_text = offset.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "tally-reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "tally-source-topic",
                value: Some(self.source_topic.as_str()),
            })
            .insert(Header {
                key: "tally-source-partition",
                value: Some(partition_text.as_str()),
            })
            .insert(Header {
                key: "tally-source-offset",
                value: Some(offset_text.as_str()),
            });
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic).headers(headers);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(p) = payload {
            record = record.payload(p);
        }
        if let Err((e, _)) = self.producer.send(record) {
            self.metrics.decode.dead_letter_errors.inc();
            tracing::warn!(error = %e, "cannot queue a dead letter");
        }
    }

    /// Wait up to `timeout` for queued dead letters to be delivered.
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer.flush(timeout) {
            tracing::warn!(error = %e, "dead letters not all delivered before shutdown");
        }
    }
}
