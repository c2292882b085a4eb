//! One-minute history of the stream's throughput: the stages add to totals per batch
//! (relaxed atomics), a sampler takes their difference every second into a ring.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Seconds of history kept (the sparklines' width).
pub const HISTORY: usize = 60;

/// Running totals of the stream path, bumped per batch by the consumer lanes.
#[derive(Debug, Default)]
pub struct Totals {
    /// Messages read from Kafka.
    pub consumed: AtomicU64,
    /// Keys written by landed flushes.
    pub flushed_keys: AtomicU64,
    /// Flushes that landed.
    pub flushes: AtomicU64,
    /// Messages not counted because they could not be decoded (every reason).
    pub invalid: AtomicU64,
    /// Events not counted because their window had expired.
    pub late: AtomicU64,
}

/// Totals at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub consumed: u64,
    pub flushed_keys: u64,
    pub flushes: u64,
}

impl Totals {
    pub fn read(&self) -> Reading {
        Reading {
            consumed: self.consumed.load(Ordering::Relaxed),
            flushed_keys: self.flushed_keys.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}

/// Per-second differences of the totals, newest last.
#[derive(Debug, Default)]
pub struct History {
    last: Reading,
    seconds: VecDeque<Reading>,
}

impl History {
    /// Record one second's worth: the difference from the previous reading.
    pub fn push(&mut self, now: Reading) {
        let diff = Reading {
            consumed: now.consumed.saturating_sub(self.last.consumed),
            flushed_keys: now.flushed_keys.saturating_sub(self.last.flushed_keys),
            flushes: now.flushes.saturating_sub(self.last.flushes),
        };
        self.last = now;
        if self.seconds.len() == HISTORY {
            self.seconds.pop_front();
        }
        self.seconds.push_back(diff);
    }

    /// One field's values per second, oldest first.
    pub fn series(&self, field: impl Fn(&Reading) -> u64) -> Vec<u64> {
        self.seconds.iter().map(field).collect()
    }

    /// One field's mean per second over the last `n` seconds (fewer if not yet sampled).
    pub fn rate(&self, n: usize, field: impl Fn(&Reading) -> u64) -> f64 {
        let take = self.seconds.len().min(n);
        if take == 0 {
            return 0.0;
        }
        let sum: u64 = self.seconds.iter().rev().take(take).map(field).sum();
        sum as f64 / take as f64
    }
}

/// The last flush durations (µs), for the percentiles.
#[derive(Debug, Default)]
pub struct Latencies {
    recent: VecDeque<u64>,
}

/// Flush durations remembered for the percentiles.
const LATENCIES: usize = 256;

impl Latencies {
    pub fn push(&mut self, micros: u64) {
        if self.recent.len() == LATENCIES {
            self.recent.pop_front();
        }
        self.recent.push_back(micros);
    }

    /// The `q` quantile (0..=1) in milliseconds, nearest rank; None without samples.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.recent.is_empty() {
            return None;
        }
        let mut sorted: Vec<u64> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1] as f64 / 1000.0)
    }

    pub fn samples(&self) -> usize {
        self.recent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_a_minute_of_differences() {
        let mut h = History::default();
        for s in 1..=70u64 {
            h.push(Reading {
                consumed: s * 10,
                flushed_keys: s,
                flushes: 0,
            });
        }
        let series = h.series(|r| r.consumed);
        assert_eq!(series.len(), HISTORY);
        assert!(series.iter().all(|&v| v == 10));
        assert_eq!(h.rate(5, |r| r.flushed_keys), 1.0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut l = Latencies::default();
        assert_eq!(l.quantile_ms(0.5), None);
        for us in 1..=100u64 {
            l.push(us * 1000);
        }
        assert_eq!(l.quantile_ms(0.5), Some(50.0));
        assert_eq!(l.quantile_ms(0.99), Some(99.0));
    }
}
