//! The check before an event is applied: the event is added to every counter or to none, so
//! [`Aggregator::add`](super::Aggregator::add) finds out whether a pending sum would overflow
//! i64 before it changes anything.
//!
//! Checking every key of every event would render each key twice. Instead, each partition keeps
//! a bound: the sum of the magnitudes (`|delta|`) of every contribution added since its units
//! were last sealed. No pending sum can be larger than that bound, so while the bound plus the
//! event's own weight ([`Weights`]) stays within i64, nothing can overflow and the event is
//! applied at once. Past it (values near 2^63, in practice only a broken producer), every
//! contribution is checked against its key ([`fits`]) until the partition's next seal.

use super::counter::{Counter, HotKind};
use super::target::{target, Render};
use super::PartitionState;
use crate::stream::decode::Event;

/// The largest bound that cannot overflow a pending sum.
pub(super) const MAX_BOUND: u64 = i64::MAX as u64;

/// How much one event can move the counters' sums: one per counter that counts events, the
/// magnitude of the value for those that sum one (distinct members move nothing).
#[derive(Default)]
pub(super) struct Weights {
    /// Counters that add 1 per event.
    ones: u64,
    /// The `Event::nums` slots of the values summed (one per counter that sums one).
    values: Vec<usize>,
}

impl Weights {
    /// The weights of `counters`.
    pub(super) fn of(counters: &[Counter]) -> Weights {
        let mut weights = Weights::default();
        for c in counters {
            match (&c.kind, c.value) {
                (HotKind::Distinct { .. }, _) => {}
                (_, Some(slot)) => weights.values.push(slot),
                (_, None) => weights.ones += 1,
            }
        }
        weights
    }

    /// An upper bound of what `event` adds to the magnitudes of the sums it touches (counters
    /// that skip it included: a bound only needs to be large enough).
    #[inline]
    pub(super) fn of_event(&self, event: &Event<'_>) -> u64 {
        self.values.iter().fold(self.ones, |sum, &slot| {
            sum.saturating_add(event.nums[slot].unsigned_abs())
        })
    }
}

/// Whether every contribution of `event` (at `offset`) fits its key in `part`'s open units: no
/// pending sum would overflow. Changes nothing but the counters' window caches and `render`.
pub(super) fn fits(
    counters: &mut [Counter],
    render: &mut Render,
    part: &PartitionState,
    offset: i64,
    event: &Event<'_>,
    now_ms: i64,
) -> bool {
    let skips = event.skips.all();
    for (ci, counter) in counters.iter_mut().enumerate() {
        if skips.checked_shr(ci as u32).unwrap_or(0) & 1 == 1 {
            continue;
        }
        let Some(target) = target(counter, event, now_ms, render) else {
            continue;
        };
        let open = &part.shards[target.shard as usize].open;
        if offset >= open.start && !open.fits(counter, &render.buf, &target) {
            return false;
        }
    }
    true
}
