//! Gauges that several consumer lanes of one process add up to.
//!
//! Each lane (`kafka.consumers`) owns its partitions, its pending keys and its pause state; the
//! process exports one gauge per quantity. A lane never sets the gauge: it moves it by the
//! change of its own part, so the gauge always shows the sum over lanes, and a lane that ends
//! takes its part back.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

use super::{HaltReason, Metrics};

/// One lane's part of a process-wide gauge.
#[derive(Debug)]
pub struct GaugeShare {
    gauge: IntGauge,
    mine: i64,
    /// Set: the gauge is 1 while any lane's part is non-zero (this sums the parts instead).
    any: Option<Arc<AtomicI64>>,
}

impl GaugeShare {
    /// A part of `gauge`, zero for now.
    pub fn new(gauge: &IntGauge) -> GaugeShare {
        GaugeShare {
            gauge: gauge.clone(),
            mine: 0,
            any: None,
        }
    }

    /// A part of a 0/1 gauge that is 1 while any lane's part is non-zero; `sum` adds the parts.
    pub fn any(gauge: &IntGauge, sum: &Arc<AtomicI64>) -> GaugeShare {
        GaugeShare {
            gauge: gauge.clone(),
            mine: 0,
            any: Some(sum.clone()),
        }
    }

    /// Make this lane's part `value`.
    pub fn set(&mut self, value: i64) {
        let change = value - self.mine;
        self.mine = value;
        match &self.any {
            None => self.gauge.add(change),
            Some(sum) => {
                let total = sum.fetch_add(change, Ordering::Relaxed) + change;
                self.gauge.set(i64::from(total > 0));
            }
        }
    }

    /// This lane's part.
    pub fn get(&self) -> i64 {
        self.mine
    }
}

impl Drop for GaugeShare {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// Every gauge a consumer lane contributes to.
#[derive(Debug)]
pub struct LaneGauges {
    /// `tally_pending_keys`.
    pub pending_keys: GaugeShare,
    /// `tally_backpressure_paused`: 1 while any lane is paused.
    pub paused: GaugeShare,
    /// `tally_assigned_partitions`.
    pub assigned: GaugeShare,
    /// `tally_rebuild_remaining_offsets`.
    pub rebuild_remaining: GaugeShare,
    /// `tally_partitions_halted{reason}`, in `HaltReason::ALL` order.
    pub halted: Vec<GaugeShare>,
}

impl LaneGauges {
    /// A lane's parts of `metrics`' gauges, all zero.
    pub fn new(metrics: &Metrics) -> LaneGauges {
        LaneGauges {
            pending_keys: GaugeShare::new(&metrics.aggregate.pending_keys),
            paused: GaugeShare::any(
                &metrics.consumer.backpressure_paused,
                &metrics.consumer.lanes_paused,
            ),
            assigned: GaugeShare::new(&metrics.consumer.assigned_partitions),
            rebuild_remaining: GaugeShare::new(&metrics.recovery.rebuild_remaining),
            halted: HaltReason::ALL
                .iter()
                .map(|r| {
                    GaugeShare::new(
                        &metrics
                            .recovery
                            .partitions_halted
                            .with_label_values(&[r.label()]),
                    )
                })
                .collect(),
        }
    }

    /// Set this lane's count of partitions halted for `reason`.
    pub fn set_halted(&mut self, reason: HaltReason, partitions: usize) {
        let i = HaltReason::ALL
            .iter()
            .position(|r| *r == reason)
            .expect("every reason is listed");
        self.halted[i].set(partitions as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_add_up_and_a_finished_lane_takes_its_part_back() {
        let metrics = Metrics::new(&["c".to_string()]);
        let mut a = LaneGauges::new(&metrics);
        let mut b = LaneGauges::new(&metrics);
        a.pending_keys.set(10);
        b.pending_keys.set(5);
        assert_eq!(metrics.aggregate.pending_keys.get(), 15);
        a.pending_keys.set(3);
        assert_eq!(metrics.aggregate.pending_keys.get(), 8);
        a.paused.set(1);
        b.paused.set(1);
        assert_eq!(metrics.consumer.backpressure_paused.get(), 1);
        a.paused.set(0);
        assert_eq!(
            metrics.consumer.backpressure_paused.get(),
            1,
            "b is still paused"
        );
        a.set_halted(HaltReason::ALL[0], 2);
        b.set_halted(HaltReason::ALL[0], 1);
        let halted = || {
            metrics
                .recovery
                .partitions_halted
                .with_label_values(&[HaltReason::ALL[0].label()])
                .get()
        };
        assert_eq!(halted(), 3);
        drop(b);
        assert_eq!(
            metrics.consumer.backpressure_paused.get(),
            0,
            "no lane is paused"
        );
        assert_eq!(metrics.aggregate.pending_keys.get(), 3);
        assert_eq!(halted(), 2);
    }
}
