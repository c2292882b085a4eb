//! Rebalances: a partition starts at the offset Redis has applied, and a revoked partition is
//! flushed and committed before it is released.

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::recovery::Halt;
use super::worker::Worker;
use super::{TallyContext, KAFKA_TIMEOUT};

impl Worker {
    /// Drop what is pending for `partition` and restart it from Redis' state (after a refused
    /// unit); park it if the state does not allow a safe start.
    pub(super) fn resync(&mut self, consumer: &BaseConsumer<TallyContext>, partition: i32) {
        self.agg.revoke(partition);
        for (p, result) in self.open_partitions(consumer, &[partition]) {
            match result {
                Ok(start) => {
                    if let Err(e) =
                        consumer.seek(&self.topic, p, Offset::Offset(start), KAFKA_TIMEOUT)
                    {
                        tracing::warn!(partition = p, error = %e, "cannot seek; retrying shortly");
                        self.park(Some(consumer), p, Halt::KafkaUnavailable(e.to_string()));
                    }
                }
                Err(halt) => self.park(Some(consumer), p, halt),
            }
        }
    }

    pub(super) fn on_assign(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &mut TopicPartitionList,
    ) {
        let parts: Vec<i32> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        if parts.is_empty() {
            return;
        }
        for (p, result) in self.open_partitions(consumer, &parts) {
            match result {
                Ok(start) => {
                    tracing::info!(
                        partition = p,
                        start,
                        lane = self.states.access.lane,
                        "partition assigned"
                    );
                    if let Err(e) = tpl.set_partition_offset(&self.topic, p, Offset::Offset(start))
                    {
                        tracing::error!(partition = p, error = %e, "cannot set start offset");
                    }
                    // Kafka's commit follows Redis even if no flush lands before the partition
                    // moves on (the previous owner's last commit may have failed in the
                    // rebalance): committed at the next tick and again on shutdown.
                    self.landed.insert(p, start);
                    self.commit_landed = true;
                }
                // Paused by the caller right after the assignment takes effect.
                Err(halt) => self.park(None, p, halt),
            }
        }
    }

    pub(super) fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        tpl: &TopicPartitionList,
    ) {
        let parts: Vec<i32> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        self.revoking = parts.clone();
        let grace = self.flush.shutdown_grace;
        self.drain(consumer, grace, CommitMode::Sync);
        let (units, keys) = self.start_flush(Some(&parts), usize::MAX);
        let landed = self.drain(consumer, grace, CommitMode::Sync);
        tracing::info!(partitions = ?parts, units, keys, landed, "flushed partitions being revoked");
        for &p in &parts {
            self.agg.revoke(p);
            self.landed.remove(&p);
            self.unpark(p);
            self.states.rebuilding.remove(&p);
            let _ = self
                .metrics
                .committed_offset
                .remove_label_values(&[&p.to_string()]);
            let _ = self
                .metrics
                .consumer_lag
                .remove_label_values(&[&p.to_string()]);
        }
        self.revoking.clear();
    }
}
