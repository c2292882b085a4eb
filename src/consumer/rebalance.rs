//! Rebalances: a partition starts at the offset Redis has applied, and a revoked partition is
//! flushed and committed before it is released.

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use std::sync::mpsc as std_mpsc;

use crate::config::StartFrom;
use crate::sink::SinkRequest;

use super::worker::Worker;
use super::{TallyContext, KAFKA_TIMEOUT};

impl Worker {
    /// Drop what is pending for `partition` and restart it from Redis' applied offsets.
    pub(super) fn resync(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        partition: i32,
        hint: i64,
    ) {
        self.agg.revoke(partition);
        let Some(fences) = self.init_fences(vec![(partition, hint.max(0))]) else {
            return;
        };
        for (p, applied) in fences {
            let start = self.agg.assign(p, &applied);
            if let Err(e) = consumer.seek(&self.topic, p, Offset::Offset(start), KAFKA_TIMEOUT) {
                tracing::error!(partition = p, error = %e, "cannot seek; dropping the partition until the next rebalance");
                self.agg.revoke(p);
            }
        }
    }

    /// Ask the sink for the applied offsets of `partitions`, blocking this thread.
    pub(super) fn init_fences(
        &mut self,
        partitions: Vec<(i32, i64)>,
    ) -> Option<Vec<(i32, Vec<i64>)>> {
        let (tx, rx) = std_mpsc::channel();
        self.sink
            .send(SinkRequest::InitFences {
                partitions,
                reply: tx,
            })
            .ok()?;
        rx.recv().ok()
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
        // Where to start a partition Redis has never seen: Kafka's committed offset, else the
        // configured end of the log.
        let committed = consumer.committed_offsets(tpl.clone(), KAFKA_TIMEOUT).ok();
        let mut initial = Vec::with_capacity(parts.len());
        for &p in &parts {
            let from_commit = committed
                .as_ref()
                .and_then(|c| c.find_partition(&self.topic, p))
                .and_then(|e| match e.offset() {
                    Offset::Offset(n) if n >= 0 => Some(n),
                    _ => None,
                });
            let start = from_commit.unwrap_or_else(|| match consumer.fetch_watermarks(&self.topic, p, KAFKA_TIMEOUT) {
                Ok((low, high)) => match self.start_from {
                    StartFrom::Earliest => low,
                    StartFrom::Latest => high,
                },
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "cannot read watermarks; starting at offset 0");
                    0
                }
            });
            initial.push((p, start));
        }
        let Some(fences) = self.init_fences(initial) else {
            tracing::warn!("redis unavailable while assigning partitions; shutting down");
            return;
        };
        for (p, applied) in fences {
            let start = self.agg.assign(p, &applied);
            tracing::info!(partition = p, start, "partition assigned");
            if let Err(e) = tpl.set_partition_offset(&self.topic, p, Offset::Offset(start)) {
                tracing::error!(partition = p, error = %e, "cannot set start offset");
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
        let before = (
            self.metrics.fence_conflicts.get(),
            self.metrics.units_already_applied.get(),
        );
        let (units, keys) = self.start_flush(Some(&parts), usize::MAX);
        self.drain(consumer, grace, CommitMode::Sync);
        let refused = self.metrics.fence_conflicts.get() + self.metrics.units_already_applied.get()
            - before.0
            - before.1;
        tracing::info!(partitions = ?parts, units, keys, refused, "flushed partitions being revoked");
        for &p in &parts {
            self.agg.revoke(p);
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
