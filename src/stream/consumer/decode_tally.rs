//! What the worker counts about its input between two metric publications, and where bad
//! messages go: counted per batch, not per message (the hot path touches no metric).

use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::Metrics;
use crate::stream::decode::DecodeError;

use super::DeadLetters;

/// Messages read and messages skipped as bad input since the last publication.
pub(super) struct DecodeTally {
    /// Messages read (any partition, counted or not).
    consumed: u64,
    /// Messages skipped, by [`DecodeError::index`].
    decode_errors: [u64; DecodeError::ALL.len()],
    /// One warning per interval for a stream of bad messages.
    log: LogLimiter,
    /// Where undecodable messages are copied, if configured.
    dead_letters: Option<DeadLetters>,
}

impl DecodeTally {
    pub(super) fn new() -> DecodeTally {
        DecodeTally {
            consumed: 0,
            decode_errors: [0; DecodeError::ALL.len()],
            log: LogLimiter::new(),
            dead_letters: None,
        }
    }

    /// Copy undecodable messages to a dead-letter topic.
    pub(super) fn set_dead_letters(&mut self, dead_letters: DeadLetters) {
        self.dead_letters = Some(dead_letters);
    }

    /// A message was read.
    pub(super) fn consumed(&mut self) {
        self.consumed += 1;
    }

    /// Count, dead-letter and (rate-limited) log a message skipped as bad input.
    pub(super) fn bad_message(
        &mut self,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        e: DecodeError,
    ) {
        if let Some(dlq) = &self.dead_letters {
            dlq.send(partition, offset, key, payload, e.reason());
        }
        self.decode_errors[e.index()] += 1;
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                partition,
                offset,
                reason = e.reason(),
                skipped = suppressed + 1,
                "skipping undecodable messages"
            );
        }
    }

    /// Add the counts to the metrics and start again from zero.
    pub(super) fn publish(&mut self, metrics: &Metrics) {
        let consumed = std::mem::take(&mut self.consumed);
        metrics.consumer.messages_consumed.inc_by(consumed);
        metrics.status.consumed(consumed);
        let mut invalid = 0;
        for (i, n) in self.decode_errors.iter_mut().enumerate() {
            if *n > 0 {
                invalid += *n;
                metrics
                    .decode
                    .decode_failed(DecodeError::ALL[i].reason(), std::mem::take(n));
            }
        }
        if invalid > 0 {
            metrics.status.invalid(invalid);
        }
    }

    /// Wait up to `timeout` for dead letters still being sent (on shutdown).
    pub(super) fn flush_dead_letters(&self, timeout: std::time::Duration) {
        if let Some(dlq) = &self.dead_letters {
            dlq.flush(timeout);
        }
    }
}
