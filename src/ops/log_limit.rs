//! Rate-limited logging: at most one line per interval for a thing that can repeat without end
//! (a broker that is down makes librdkafka report every reconnect attempt; a topic full of bad
//! messages fails to decode each one; a full accept queue refuses every connection).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU64};

/// How far apart two lines of one limiter are at least.
const EVERY_MS: i64 = 10_000;

/// At most one log line per 10 s; counts what it held back. Shared by reference across threads
/// (librdkafka calls its callbacks from its own threads), hence atomics rather than `&mut`.
pub(crate) struct LogLimiter {
    /// When the last line was allowed (unix ms).
    last_ms: AtomicI64,
    /// Lines held back since then.
    suppressed: AtomicU64,
}

impl LogLimiter {
    /// A limiter whose first line is allowed at once.
    pub(crate) fn new() -> LogLimiter {
        LogLimiter {
            last_ms: AtomicI64::new(i64::MIN / 2),
            suppressed: AtomicU64::new(0),
        }
    }

    /// A limiter whose first line comes one interval from now (periodic progress reports,
    /// where a line at once would repeat what the start already said).
    pub(crate) fn after_interval() -> LogLimiter {
        LogLimiter {
            last_ms: AtomicI64::new(unix_ms()),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(suppressed since the last line)` when a line may be logged now.
    pub(crate) fn allow(&self) -> Option<u64> {
        let now = unix_ms();
        let last = self.last_ms.load(Relaxed);
        if now - last >= EVERY_MS
            && self
                .last_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }
}

use tally_counters::clock::unix_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_then_silence_counting_what_was_held_back() {
        let log = LogLimiter::new();
        assert_eq!(log.allow(), Some(0));
        assert_eq!(log.allow(), None);
        assert_eq!(log.allow(), None);
        assert_eq!(log.suppressed.load(Relaxed), 2);
        // One interval later the next line reports both.
        log.last_ms.fetch_sub(EVERY_MS, Relaxed);
        assert_eq!(log.allow(), Some(2));
        assert_eq!(log.allow(), None);
    }

    #[test]
    fn after_interval_holds_the_first_line_back() {
        let log = LogLimiter::after_interval();
        assert_eq!(log.allow(), None);
        log.last_ms.fetch_sub(EVERY_MS, Relaxed);
        assert_eq!(log.allow(), Some(1));
    }
}
