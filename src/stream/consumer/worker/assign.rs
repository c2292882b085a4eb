//! The worker's side of a rebalance: open what is assigned, flush what is revoked.

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::super::TallyContext;
use super::Worker;

impl Worker {
    /// Partitions were assigned: each starts where Redis says (its offset is set in `tpl`), or
    /// is parked. The caller pauses what is parked once the assignment takes effect.
    pub(in crate::stream::consumer) fn on_assign(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &mut TopicPartitionList,
    ) {
        let parts = self.partitions_of(tpl);
        if parts.is_empty() {
            return;
        }
        for (p, result) in self.open_partitions(consumer, &parts) {
            match result {
                Ok(start) => {
                    let lane = self.parts.lane();
                    tracing::info!(partition = p, start, lane, "partition assigned");
                    if let Err(e) = tpl.set_partition_offset(&self.topic, p, Offset::Offset(start))
                    {
                        tracing::error!(partition = p, error = %e, "cannot set start offset");
                    }
                    self.commits.assigned(p, start);
                }
                Err(halt) => self.park(None, p, halt),
            }
        }
    }

    /// Partitions are being revoked: flush and commit what they hold before they are released.
    pub(in crate::stream::consumer) fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &TopicPartitionList,
    ) {
        let parts = self.partitions_of(tpl);
        self.parts.revoking(&parts);
        let grace = self.flusher.grace();
        self.drain(consumer, grace, CommitMode::Sync);
        let (units, keys) = self.start_flush(Some(&parts), usize::MAX);
        let landed = self.drain(consumer, grace, CommitMode::Sync);
        tracing::info!(partitions = ?parts, units, keys, landed, "flushed partitions being revoked");
        for &p in &parts {
            self.agg.revoke(p);
            if self.schema_waits.forget(p) {
                // Paused for its schema: not paused when it is assigned again.
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&self.topic, p);
                let _ = consumer.resume(&tpl);
            }
            self.commits.revoked(p);
            self.parts.revoked(p, &mut self.gauges);
            self.metrics.status.revoked(self.parts.lane(), p);
            let labels = [self.topic.as_str(), &p.to_string()];
            let consumer = &self.metrics.consumer;
            let _ = consumer.consumer_lag.remove_label_values(&labels);
            let _ = consumer.lag_seconds.remove_label_values(&labels);
            let _ = consumer.committed_offset.remove_label_values(&labels);
        }
        self.parts.revoke_done();
    }

    /// After a rebalance error: stop counting the partitions of `tpl`.
    pub(in crate::stream::consumer) fn release(&mut self, tpl: &TopicPartitionList) {
        for p in self.partitions_of(tpl) {
            self.agg.revoke(p);
            self.schema_waits.forget(p);
        }
    }

    /// Pause what must not be read once an assignment takes effect: everything while
    /// backpressure holds, and every parked partition.
    pub(in crate::stream::consumer) fn pause_assigned(
        &self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &TopicPartitionList,
    ) {
        if self.flusher.paused() {
            let _ = consumer.pause(tpl);
        }
        let mut parked = TopicPartitionList::new();
        for p in self.parts.parked() {
            parked.add_partition(&self.topic, p);
        }
        if parked.count() > 0 {
            if let Err(e) = consumer.pause(&parked) {
                tracing::warn!(error = %e, "cannot pause parked partitions");
            }
        }
    }

    /// The number of partitions assigned to this lane, for its gauge.
    pub(in crate::stream::consumer) fn set_assigned(&mut self, partitions: usize) {
        self.gauges.assigned.set(partitions as i64);
    }

    fn partitions_of(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect()
    }
}
