//! Recovery: partitions halted or rebuilt because of what Redis and Kafka hold, and resume
//! points outside a partition's retained range.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter, counter_vec, gauge, gauge_vec};

super::labels::labels!(
    /// Why a partition is not counted (`tally_partitions_halted{reason}`).
    HaltReason {
        /// Redis did not answer in time (clears by itself).
        RedisUnavailable => "redis_unavailable",
        /// Kafka did not answer in time (clears by itself).
        KafkaUnavailable => "kafka_unavailable",
        /// The applied offset is gone while the rest of the state is there.
        FenceMissing => "fence_missing",
        /// The applied offset or state marker is not an offset.
        FenceCorrupt => "fence_corrupt",
        /// Redis lost the state and `recovery.on_state_lost = "halt"`.
        StateLost => "state_lost",
        /// The applied offset lies beyond the end of the topic.
        BeyondEnd => "beyond_end",
    }
);

super::labels::labels!(
    /// A resume point outside a partition's retained range (`tally_offset_resets_total{reason}`).
    ResetReason {
        /// Redis has applied offsets the topic does not have.
        BeyondEnd => "beyond_end",
        /// Retention deleted offsets before tally counted them.
        BeforeLogStart => "before_log_start",
        /// librdkafka reset a position it was reading.
        AutoReset => "auto_reset",
    }
);

super::labels::labels!(
    /// What the fence check found in Redis instead of the applied offsets that landed
    /// (`tally_state_rollbacks_total{found}`).
    Rollback {
        /// An older offset: Redis lost acknowledged writes (a failover to a replica that
        /// lagged, a restore from an older copy).
        Behind => "behind",
        /// A newer offset: another process counted the partition.
        Ahead => "ahead",
        /// No offset, or not an offset: the state is gone or damaged.
        Lost => "lost",
    }
);

/// Partitions that could not simply resume where they stopped.
#[derive(Clone)]
pub struct RecoveryMetrics {
    /// Partitions not counted because their state in Redis needs an operator (or Redis/Kafka
    /// did not answer), by reason. The partitions are named in the log and `/health/ready`.
    pub partitions_halted: IntGaugeVec,
    /// Partitions recounted from the earliest retained offset after Redis lost tally's state.
    pub state_rebuilds: IntCounter,
    /// Offsets the partitions being rebuilt still have to read.
    pub rebuild_remaining: IntGauge,
    /// Resume points outside the topic's retained range, by reason.
    pub offset_resets: IntCounterVec,
    /// Partitions whose applied offsets in Redis differed from what landed, found by the
    /// fence check, by what was found; each is replayed from Kafka.
    pub state_rollbacks: IntCounterVec,
    /// Offset ranges of landed flushes that Redis had lost, applied again from memory.
    pub reapplied_ranges: IntCounter,
}

impl RecoveryMetrics {
    pub(super) fn new(registry: &Registry) -> RecoveryMetrics {
        let m = RecoveryMetrics {
            partitions_halted: gauge_vec(
                registry,
                "tally_partitions_halted",
                "Partitions not counted because their state in Redis needs an operator (see `tally state`) or Redis/Kafka did not answer, by reason.",
                &["reason"],
            ),
            state_rebuilds: counter(
                registry,
                "tally_state_rebuilds_total",
                "Partitions recounted from the earliest retained offset after Redis lost tally's state.",
            ),
            rebuild_remaining: gauge(
                registry,
                "tally_rebuild_remaining_offsets",
                "Offsets the partitions being rebuilt after a loss of tally's state still have to read.",
            ),
            offset_resets: counter_vec(
                registry,
                "tally_offset_resets_total",
                "Resume points outside the retained range of a partition, by reason: beyond_end, before_log_start, auto_reset.",
                &["reason"],
            ),
            state_rollbacks: counter_vec(
                registry,
                "tally_state_rollbacks_total",
                "Partitions whose applied offsets in Redis differed from what tally had landed, found by the fence check (recovery.fence_check_interval, and after each reconnection), by what was found: behind (Redis lost acknowledged writes: a failover with replication lag, a restore), ahead (another writer), lost. Each is replayed from Kafka at once.",
                &["found"],
            ),
            reapplied_ranges: counter(
                registry,
                "tally_reapplied_ranges_total",
                "Offset ranges (a partition's events in one flush) that Redis acknowledged and then lost (a failover to a replica that lagged, an older copy restored), applied again from the flushes tally keeps in memory (recovery.reapply_keys) instead of replaying them from Kafka.",
            ),
        };
        for r in HaltReason::ALL {
            m.partitions_halted.with_label_values(&[r.label()]);
        }
        for r in Rollback::ALL {
            m.state_rollbacks.with_label_values(&[r.label()]);
        }
        for r in ResetReason::ALL {
            m.offset_resets.with_label_values(&[r.label()]);
        }
        m
    }

    /// Count a resume point outside the retained range.
    pub fn offset_reset(&self, reason: ResetReason) {
        self.offset_resets
            .with_label_values(&[reason.label()])
            .inc();
    }
}
