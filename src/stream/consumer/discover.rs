//! Topic patterns at run time: the cluster's topics, listed on a client of their own (it never
//! joins the group), and which of them the patterns of `kafka.topics` read. The process starts
//! lanes for new matches ([`crate::config::Model::pattern_topic`] compiles each); `tally state`
//! lists the fences of the topics matched now.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::ClientConfig;

use crate::config::{KafkaConfig, Model};

/// Lists the cluster's topics.
pub struct TopicLister {
    /// A consumer that only asks for metadata (no subscription, no commits).
    consumer: BaseConsumer,
}

/// What the patterns make of the cluster's topics, by pattern (position in `Model::patterns`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Matches {
    /// Topics a pattern reads (matched, and read by some counter), in name order.
    pub read: Vec<(String, usize)>,
    /// Matched topics no counter reads (not consumed), per pattern.
    pub unread: BTreeMap<usize, usize>,
}

impl TopicLister {
    /// A metadata client for `kafka`'s brokers, with the user's properties (SASL, SSL).
    pub fn new(kafka: &KafkaConfig) -> Result<TopicLister, KafkaError> {
        let mut c = ClientConfig::new();
        for (k, v) in &kafka.properties {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &kafka.brokers)
            .set("group.id", format!("{}-topics", kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("statistics.interval.ms", "0");
        Ok(TopicLister {
            consumer: c.create()?,
        })
    }

    /// Every topic of the cluster that has partitions and no error (blocking, up to
    /// `timeout`).
    pub fn list(&self, timeout: Duration) -> Result<Vec<String>, KafkaError> {
        let meta = self.consumer.fetch_metadata(None, timeout)?;
        let usable = meta
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty());
        Ok(usable.map(|t| t.name().to_string()).collect())
    }
}

/// Which of `names` the patterns of `model` read, and which they match but no counter reads.
pub fn matches(model: &Model, names: &[String]) -> Matches {
    let mut out = Matches::default();
    let mut sorted: Vec<&String> = names.iter().collect();
    sorted.sort();
    for name in sorted {
        let Some(p) = model.config.pattern_for(&model.patterns, name) else {
            continue;
        };
        match model.pattern_topic(name) {
            Some(_) => out.read.push((name.clone(), p)),
            None => *out.unread.entry(p).or_default() += 1,
        }
    }
    out
}
