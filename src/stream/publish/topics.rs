//! `jobs.publish.create_topics`: the topics the publisher writes (every output topic, every late
//! topic) that do not exist are created with the configured partitions, replication factor and
//! topic configuration, before anything is produced. A topic that exists is left as it is
//! (its partitions are not compared: a changed count would move keys between partitions, which
//! is for an operator to decide); only missing ones are created, so the publisher needs the
//! CREATE permission only when there is something to create.
//!
//! A topic that cannot be created or written is a [`TopicError`], logged at ERROR by the
//! [`TopicAlarm`] at once and then at most every 10 s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};

use crate::config::Model;
use crate::ops::log_limit::LogLimiter;

/// How long a metadata request or a creation may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a topic the publisher writes cannot be used. Nothing more is published to it until the
/// cause is gone, and its counter's windows wait (`tally_publish_behind_seconds` grows).
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// Missing, and `jobs.publish.create_topics` could not create it (or could not tell
    /// whether it exists).
    #[error("cannot create topic {topic}: {reason}")]
    Create { topic: String, reason: String },
    /// Kafka refused a record, or did not acknowledge it within `jobs.publish.send_timeout`.
    #[error("kafka refused a record for topic {topic}: {reason}")]
    Send { topic: String, reason: String },
}

impl TopicError {
    /// The topic (or topics) concerned.
    pub fn topic(&self) -> &str {
        match self {
            TopicError::Create { topic, .. } | TopicError::Send { topic, .. } => topic,
        }
    }
}

/// Topic errors logged at ERROR: at once, then at most one line per topic and interval
/// (a pass runs every `jobs.publish.interval` and meets the same error each time).
#[derive(Default)]
pub struct TopicAlarm {
    /// Per topic (as [`TopicError::topic`] names it), when it was last logged.
    limits: Mutex<BTreeMap<String, LogLimiter>>,
}

impl TopicAlarm {
    pub fn report(&self, e: &TopicError) {
        let mut limits = self.limits.lock();
        let limiter = limits
            .entry(e.topic().to_string())
            .or_insert_with(LogLimiter::new);
        if let Some(repeated) = limiter.allow() {
            tracing::error!(topic = e.topic(), error = %e, repeated, "window results cannot be published to this topic; closed windows wait (tally_publish_behind_seconds)");
        }
    }
}

/// Every topic `model`'s outputs write: output topics and late topics.
pub fn written(model: &Model) -> BTreeSet<String> {
    let outputs = model.counters.iter().filter_map(|c| c.output.as_ref());
    let mut topics = BTreeSet::new();
    for o in outputs {
        topics.insert(o.topic.clone());
        topics.extend(o.late_topic.clone());
    }
    topics
}

/// Create the topics of [`written`] that `consumer`'s metadata says do not exist. A topic that
/// another client created meanwhile counts as created.
pub async fn create_missing(
    admin: &AdminClient<DefaultClientContext>,
    consumer: &BaseConsumer,
    model: &Model,
) -> Result<(), TopicError> {
    let mut missing = Vec::new();
    for topic in written(model) {
        let exists = tokio::task::block_in_place(|| exists(consumer, &topic));
        match exists {
            Ok(true) => {}
            Ok(false) => missing.push(topic),
            Err(e) => return Err(e),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let publish = &model.config.jobs.publish;
    // -1: the broker's default (KIP-464, Kafka 2.4).
    // Validated to fit.
    let partitions = publish
        .topic_partitions
        .map_or(-1, |p| i32::try_from(p).unwrap_or(i32::MAX));
    let replication = publish.topic_replication.map_or(-1, i32::from);
    let new: Vec<NewTopic> = missing
        .iter()
        .map(|name| {
            let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
            for (k, v) in &publish.topic_config {
                t = t.set(k, v);
            }
            t
        })
        .collect();
    // The request's own timeout too: a broker that never answers fails the pass in TIMEOUT,
    // not in librdkafka's default of a minute per attempt.
    let options = AdminOptions::new()
        .operation_timeout(Some(TIMEOUT))
        .request_timeout(Some(TIMEOUT));
    let results = admin.create_topics(&new, &options).await.map_err(|e| {
        // The request as a whole failed: it concerns every missing topic. Unanswered, it names
        // the likely cause (librdkafka only says it timed out).
        let timed_out = matches!(
            e,
            KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut)
        );
        let hint = match timed_out {
            true => " (no answer from the cluster's controller: a broker without the CreateTopics API, or no controller; create the topic yourself, or unset create_topics)",
            false => "",
        };
        TopicError::Create {
            topic: missing.join(", "),
            reason: format!("{e}{hint}"),
        }
    })?;
    for result in results {
        match result {
            Ok(name) => tracing::info!(topic = %name, partitions, replication, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                let reason = code.to_string();
                return Err(TopicError::Create { topic, reason });
            }
        }
    }
    Ok(())
}

/// Whether the cluster has `topic` (with partitions); Err: why its metadata is unknown.
fn exists(consumer: &BaseConsumer, topic: &str) -> Result<bool, TopicError> {
    let unknown = |reason: String| TopicError::Create {
        topic: topic.to_string(),
        reason,
    };
    let meta = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .map_err(|e| unknown(format!("its metadata could not be read: {e}")))?;
    let Some(t) = meta.topics().iter().find(|t| t.name() == topic) else {
        return Ok(false);
    };
    match t.error() {
        None => Ok(!t.partitions().is_empty()),
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(false),
        Some(e) => Err(unknown(format!("its metadata has an error: {e:?}"))),
    }
}
