//! When to flush and when to stop reading: a pure policy over what is pending, shared by the
//! consumer and the benchmark, unit-tested without Kafka or Redis.

use std::time::Duration;

use crate::config::FlushConfig;

/// The flush and backpressure rules of `[flush]`.
#[derive(Debug, Clone, Copy)]
pub struct FlushPolicy {
    /// Flush at least this long after the oldest unflushed message was read.
    interval: Duration,
    /// Flush as soon as this many keys are pending (and cap one flush near it).
    max_keys: usize,
    /// Stop reading while a flush is in flight and this many keys wait in memory and in flight.
    max_pending_keys: usize,
}

/// What is waiting right now.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pending {
    /// How long ago the oldest unflushed message was read (None: nothing unflushed).
    pub oldest: Option<Duration>,
    /// Keys held in memory.
    pub keys: usize,
    /// Keys of the flush in flight (None: no flush in flight).
    pub in_flight: Option<usize>,
    /// The consumer has read everything available: nothing is gained by waiting.
    pub caught_up: bool,
    /// How long the last flush took to land.
    pub flush_takes: Duration,
}

impl FlushPolicy {
    /// The policy of a validated `[flush]` section.
    pub fn new(flush: &FlushConfig) -> FlushPolicy {
        FlushPolicy {
            interval: flush.interval,
            max_keys: flush.max_keys,
            max_pending_keys: flush.max_pending_keys,
        }
    }

    /// Keys a regular flush seals at most (revoke and shutdown flush everything).
    pub fn batch_keys(&self) -> usize {
        self.max_keys
    }

    /// Start a flush now? At the interval, at `max_keys`, or as soon as the consumer has caught
    /// up (the end of a burst is visible at once instead of after the interval). Only one flush
    /// is in flight at a time, which keeps each partition's units in order.
    ///
    /// The interval bounds when the oldest pending event becomes visible, not when its flush
    /// starts: a flush starts as much earlier as the last one took to land (at most half the
    /// interval), so that it lands about one interval after the oldest event was read.
    pub fn flush_due(&self, p: &Pending) -> bool {
        let lead = p.flush_takes.min(self.interval / 2);
        p.in_flight.is_none()
            && (p
                .oldest
                .is_some_and(|age| age + lead >= self.interval || p.caught_up)
                || p.keys >= self.max_keys)
    }

    /// Stop reading until the flush in flight lands? Memory stays bounded while Redis is slow
    /// or down; without a flush in flight, the next flush relieves the pressure instead.
    pub fn pause(&self, p: &Pending) -> bool {
        p.in_flight
            .is_some_and(|f| p.keys + f >= self.max_pending_keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> FlushPolicy {
        FlushPolicy::new(&FlushConfig {
            interval: Duration::from_secs(1),
            max_keys: 100,
            max_pending_keys: 1_000,
            ..FlushConfig::default()
        })
    }

    #[test]
    fn flush_is_due_by_age_or_size_never_while_one_is_in_flight() {
        let p = policy();
        let young = Pending {
            oldest: Some(Duration::from_millis(999)),
            keys: 99,
            in_flight: None,
            caught_up: false,
            flush_takes: Duration::ZERO,
        };
        assert!(!p.flush_due(&young));
        assert!(!p.flush_due(&Pending::default()), "nothing pending");
        let old = Pending {
            oldest: Some(Duration::from_secs(1)),
            ..young
        };
        assert!(p.flush_due(&old));
        let big = Pending { keys: 100, ..young };
        assert!(p.flush_due(&big));
        assert!(!p.flush_due(&Pending {
            in_flight: Some(1),
            ..big
        }));
        let idle = Pending {
            caught_up: true,
            ..young
        };
        assert!(p.flush_due(&idle), "caught up: no wait for the interval");
        assert!(!p.flush_due(&Pending {
            in_flight: Some(1),
            ..idle
        }));
        assert!(!p.flush_due(&Pending {
            oldest: None,
            ..idle
        }));
    }

    #[test]
    fn a_flush_starts_as_much_earlier_as_the_last_one_took_at_most_half_the_interval() {
        let p = policy();
        let at = |age_ms: u64, takes_ms: u64| Pending {
            oldest: Some(Duration::from_millis(age_ms)),
            keys: 1,
            in_flight: None,
            caught_up: false,
            flush_takes: Duration::from_millis(takes_ms),
        };
        assert!(!p.flush_due(&at(939, 60)));
        assert!(
            p.flush_due(&at(940, 60)),
            "lands about one interval after the oldest event"
        );
        assert!(
            !p.flush_due(&at(499, 5_000)),
            "never earlier than half the interval"
        );
        assert!(p.flush_due(&at(500, 5_000)));
    }

    #[test]
    fn pauses_only_above_the_bound_with_a_flush_in_flight() {
        let p = policy();
        let mut load = Pending {
            oldest: Some(Duration::ZERO),
            keys: 900,
            in_flight: Some(99),
            caught_up: false,
            flush_takes: Duration::ZERO,
        };
        assert!(!p.pause(&load));
        load.in_flight = Some(100);
        assert!(p.pause(&load));
        load.in_flight = None;
        load.keys = 5_000;
        assert!(!p.pause(&load), "the next flush relieves it");
    }
}
