//! Partitions waiting for the schema registry. An event whose schema is not known within a
//! short wait ([`DecodeError::Unavailable`](crate::stream::decode::DecodeError)) pauses its
//! partition only: the lane keeps polling Kafka and counting the other partitions, and the
//! registry is asked on a thread of its own. Nothing of the partition moves past the event:
//! its later messages already fetched are dropped unread, and once a fetch settles the
//! partition is sought back to the aggregator's position (the event's offset, or the first
//! offset after the last it took) and resumed, so its events are read again in offset order.

use std::collections::BTreeMap;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::ops::metrics::Metrics;
use crate::stream::decode::Decoder;

use super::super::{TallyContext, KAFKA_TIMEOUT};
use crate::stream::aggregate::Aggregator;

/// The partitions paused for a schema, and what the worker published of the schema cache.
#[derive(Default)]
pub(super) struct SchemaWaits {
    /// Each waiting partition, with the decoder's fetches settled when it began to wait: it
    /// is read again once more have settled.
    parts: BTreeMap<i32, u64>,
    /// Schemas forgotten by the decoder's cache, as published to the metrics.
    evicted: u64,
}

impl SchemaWaits {
    /// Whether `partition` waits for a schema (its messages are not read meanwhile).
    pub(super) fn holds(&self, partition: i32) -> bool {
        self.parts.contains_key(&partition)
    }

    /// `partition` no longer waits (revoked, parked or reopened); true if it did.
    pub(super) fn forget(&mut self, partition: i32) -> bool {
        self.parts.remove(&partition).is_some()
    }

    /// Add the schemas the decoder forgot since the last call to the metrics.
    pub(super) fn publish(&mut self, decoder: &Decoder, metrics: &Metrics) {
        let evicted = decoder.schema_news().evicted;
        if evicted > self.evicted {
            metrics
                .decode
                .schema_evictions
                .inc_by(evicted - self.evicted);
            self.evicted = evicted;
        }
    }
}

/// What the waits read of the lane: its consumer, topic and decoder.
pub(super) struct WaitingLane<'w> {
    pub(super) consumer: &'w BaseConsumer<TallyContext>,
    pub(super) topic: &'w str,
    pub(super) decoder: &'w Decoder,
}

impl SchemaWaits {
    /// The event at `offset` of `partition` waits for its schema: pause the partition.
    pub(super) fn wait(&mut self, lane: &WaitingLane<'_>, partition: i32, offset: i64) {
        let missed_at = lane.decoder.schema_news().missed_at;
        self.parts.insert(partition, missed_at);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(lane.topic, partition);
        if let Err(e) = lane.consumer.pause(&tpl) {
            // Still held: its messages are dropped unread until the schema is known.
            tracing::warn!(partition, error = %e, "cannot pause partition");
        }
        tracing::debug!(
            partition,
            offset,
            "partition paused until the schema registry answers"
        );
    }

    /// Read the waiting partitions again once a fetch settled since they began to wait: each
    /// sought back to `agg`'s position, and resumed where `may_resume` allows it.
    pub(super) fn retry(
        &mut self,
        lane: &WaitingLane<'_>,
        agg: &Aggregator,
        may_resume: impl Fn(i32) -> bool,
    ) {
        if self.parts.is_empty() {
            return;
        }
        let settled = lane.decoder.schema_news().settled;
        let due: Vec<i32> = self
            .parts
            .iter()
            .filter(|(_, &at)| settled > at)
            .map(|(&p, _)| p)
            .collect();
        for p in due {
            self.parts.remove(&p);
            // Not owned any more: revoked or parked, reopened from Redis when it comes back.
            let Some(position) = agg.position(p) else {
                continue;
            };
            let sought = lane
                .consumer
                .seek(lane.topic, p, Offset::Offset(position), KAFKA_TIMEOUT);
            if let Err(e) = sought {
                tracing::warn!(partition = p, error = %e, "cannot seek; retrying shortly");
                self.parts.insert(p, settled.saturating_sub(1));
                continue;
            }
            if may_resume(p) {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(lane.topic, p);
                let _ = lane.consumer.resume(&tpl);
            }
            tracing::debug!(partition = p, position, "partition reads again");
        }
    }
}
