//! What the worker counts about its input between two metric publications, and where bad
//! messages go: counted per batch, not per message (the hot path touches no metric).

use std::time::{Duration, Instant};

use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::Metrics;
use crate::stream::decode::{DecodeError, Skips};

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
    /// Events a counter did not take (its filter, a field it needs), by counter and
    /// [`Skips::REASONS`]; grown on the first skip.
    skipped: Vec<[u64; Skips::REASONS.len()]>,
    /// When the counts were last published.
    last_publish: Instant,
}

impl DecodeTally {
    pub(super) fn new() -> DecodeTally {
        DecodeTally {
            consumed: 0,
            decode_errors: [0; DecodeError::ALL.len()],
            log: LogLimiter::new(),
            dead_letters: None,
            skipped: Vec::new(),
            last_publish: Instant::now(),
        }
    }

    /// Whether `every` has passed since the counts were last published.
    pub(super) fn publish_due(&self, every: Duration) -> bool {
        self.last_publish.elapsed() >= every
    }

    /// Counters that did not take a counted event, by reason.
    #[inline]
    pub(super) fn skipped(&mut self, skips: &Skips) {
        if skips.all() == 0 {
            return;
        }
        for (reason, mask) in skips.masks().into_iter().enumerate() {
            let mut m = mask;
            while m != 0 {
                let ci = m.trailing_zeros() as usize;
                m &= m - 1;
                if self.skipped.len() <= ci {
                    self.skipped.resize(ci + 1, [0; Skips::REASONS.len()]);
                }
                self.skipped[ci][reason] += 1;
            }
        }
    }

    /// Add the per-counter skips to the metrics (`names` by counter index).
    pub(super) fn publish_skips<'n>(
        &mut self,
        metrics: &Metrics,
        names: impl Fn(usize) -> &'n str,
    ) {
        for (ci, reasons) in self.skipped.iter_mut().enumerate() {
            for (r, n) in reasons.iter_mut().enumerate() {
                if *n > 0 {
                    metrics
                        .aggregate
                        .events_skipped
                        .with_label_values(&[names(ci), Skips::REASONS[r]])
                        .inc_by(std::mem::take(n));
                }
            }
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
        self.last_publish = Instant::now();
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
