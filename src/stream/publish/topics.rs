//! `jobs.publish.create_topics`: the topics the publisher writes (every output topic, every late
//! topic) that do not exist are created with the configured partitions, replication factor and
//! topic configuration, before anything is produced. A topic that exists is left as it is
//! (its partitions are not compared: a changed count would move keys between partitions, which
//! is for an operator to decide); only missing ones are created, so the publisher needs the
//! CREATE permission only when there is something to create.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};

use crate::config::Model;

/// How long a metadata request or a creation may take.
const TIMEOUT: Duration = Duration::from_secs(10);

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
) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for topic in written(model) {
        let exists = tokio::task::block_in_place(|| exists(consumer, &topic))?;
        if !exists {
            missing.push(topic);
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
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(name) => tracing::info!(topic = %name, partitions, replication, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("cannot create topic {name}: {code}"),
        }
    }
    Ok(())
}

/// Whether the cluster has `topic` (with partitions).
fn exists(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<bool> {
    let meta = consumer.fetch_metadata(Some(topic), TIMEOUT)?;
    let Some(t) = meta.topics().iter().find(|t| t.name() == topic) else {
        return Ok(false);
    };
    match t.error() {
        None => Ok(!t.partitions().is_empty()),
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(false),
        Some(e) => anyhow::bail!("metadata of topic {topic}: {e:?}"),
    }
}
