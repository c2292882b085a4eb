//! Rebalances: a partition starts at the offset Redis has applied, and a revoked partition is
//! flushed and committed before it is released. librdkafka calls this inside `poll`, on the
//! consumer thread, which already holds the worker's (re-entrant) lock.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::TopicPartitionList;

use crate::ops::metrics::RebalanceKind;

use super::TallyContext;

impl ConsumerContext for TallyContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let guard = self.lock();
        let mut worker = guard.borrow_mut();
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.metrics
                    .consumer
                    .rebalanced(RebalanceKind::Assign, tpl.count());
                if !self.shutdown.is_cancelled() {
                    worker.on_assign(consumer, tpl);
                }
                let r = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                worker.pause_assigned(consumer, tpl);
                r
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.metrics
                    .consumer
                    .rebalanced(RebalanceKind::Revoke, tpl.count());
                worker.on_revoke(consumer, tpl);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; releasing all partitions");
                worker.release(tpl);
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "applying the new assignment failed");
        }
        self.health.kafka.joined();
        // While the consumer closes, librdkafka's main thread may be waiting for this callback:
        // asking it for the assignment then blocks forever.
        let assigned = if self.shutdown.is_cancelled() {
            0
        } else {
            consumer.assignment().map_or(0, |a| a.count())
        };
        worker.set_assigned(assigned);
    }
}
