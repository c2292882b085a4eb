//! Kafka commits: they follow Redis. A partition's offset is committed once the flush that
//! covers it has landed (or, after an assignment, at the start Redis gave), so that lag
//! monitoring works; Redis stays the source of truth, so a failed commit is only logged.

use std::collections::{BTreeMap, HashSet};

use prometheus::IntGaugeVec;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::stream::aggregate::Aggregator;

use super::TallyContext;

/// The commit side of the worker.
pub(super) struct Committer {
    /// The topic consumed, for the partition lists committed.
    topic: String,
    /// The last offset committed (asynchronously) per partition: committed again, and waited
    /// for, on shutdown, so a commit in flight is not lost when the consumer closes.
    landed: BTreeMap<i32, i64>,
    /// Partitions were assigned: commit `landed` at the next tick.
    commit_landed: bool,
    /// `tally_committed_offset`, by partition.
    committed_offset: IntGaugeVec,
}

impl Committer {
    pub(super) fn new(topic: String, committed_offset: IntGaugeVec) -> Committer {
        Committer {
            topic,
            landed: BTreeMap::new(),
            commit_landed: false,
            committed_offset,
        }
    }

    /// A flush landed: commit where each partition it covered is complete up to (`ends`),
    /// except the `refused` partitions, which start again from Redis' state.
    pub(super) fn flush_landed(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        ends: &[(i32, i64)],
        refused: &HashSet<i32>,
        mode: CommitMode,
    ) {
        let mut tpl = TopicPartitionList::new();
        for &(p, end) in ends {
            if refused.contains(&p) {
                continue;
            }
            // Kafka's committed offset is the next message to read, like our `end`.
            if tpl
                .add_partition_offset(&self.topic, p, Offset::Offset(end))
                .is_ok()
            {
                self.committed_offset
                    .with_label_values(&[&self.topic, &p.to_string()])
                    .set(end);
                self.landed.insert(p, end);
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, mode) {
                // Harmless for exactness (Redis holds the applied offsets); lag may read high.
                commit_failed(&e);
            }
        }
    }

    /// A partition was assigned at `start`. Kafka's commit follows Redis even if no flush
    /// lands before the partition moves on (the previous owner's last commit may have failed
    /// in the rebalance): committed at the next tick and again on shutdown.
    pub(super) fn assigned(&mut self, partition: i32, start: i64) {
        self.landed.insert(partition, start);
        self.commit_landed = true;
    }

    /// A partition was revoked: forget its offset and its gauge.
    pub(super) fn revoked(&mut self, partition: i32) {
        self.landed.remove(&partition);
        let _ = self
            .committed_offset
            .remove_label_values(&[&self.topic, &partition.to_string()]);
    }

    /// Commit the starts of partitions assigned since the last tick.
    pub(super) fn tick(&mut self, consumer: &BaseConsumer<TallyContext>, agg: &Aggregator) {
        if std::mem::take(&mut self.commit_landed) {
            self.commit_landed_offsets(consumer, agg, CommitMode::Async);
        }
    }

    /// Commit the last landed offset (or assigned start) of every owned partition.
    pub(super) fn commit_landed_offsets(
        &self,
        consumer: &BaseConsumer<TallyContext>,
        agg: &Aggregator,
        mode: CommitMode,
    ) {
        let mut tpl = TopicPartitionList::new();
        for (&p, &end) in &self.landed {
            if agg.owns(p) {
                let _ = tpl.add_partition_offset(&self.topic, p, Offset::Offset(end));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, mode) {
                commit_failed(&e);
            }
        }
    }
}

/// Log a failed commit: a warning, unless the group is rebalancing (the commit of a generation
/// that is ending is refused; the next owner commits where Redis says, so nothing is lost).
fn commit_failed(e: &rdkafka::error::KafkaError) {
    use rdkafka::error::RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(C::RebalanceInProgress | C::IllegalGeneration | C::UnknownMemberId) => {
            tracing::debug!(error = %e, "kafka offset commit refused during a rebalance");
        }
        _ => tracing::warn!(error = %e, "kafka offset commit failed"),
    }
}
