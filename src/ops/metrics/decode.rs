//! Decoding: messages skipped as bad input, and their copies in the dead-letter topic.

use prometheus::{IntCounter, IntCounterVec, Registry};

use super::{counter, counter_vec};

/// What became of messages that could not be decoded. The reasons are the decoder's
/// (`DecodeError::reason`), registered by [`DecodeMetrics::register_reasons`].
#[derive(Clone)]
pub struct DecodeMetrics {
    /// Messages skipped because they could not be decoded, by reason.
    pub decode_errors: IntCounterVec,
    /// Undecodable messages delivered to the dead-letter topic.
    pub dead_letters: IntCounter,
    /// Dead letters that could not be queued or delivered.
    pub dead_letter_errors: IntCounter,
    /// Compiled registry schemas forgotten to keep within `decode.max_schemas`.
    pub schema_evictions: IntCounter,
}

impl DecodeMetrics {
    pub(super) fn new(registry: &Registry) -> DecodeMetrics {
        DecodeMetrics {
            decode_errors: counter_vec(
                registry,
                "tally_decode_errors_total",
                "Messages skipped because they could not be decoded, by reason.",
                &["reason"],
            ),
            dead_letters: counter(
                registry,
                "tally_dead_letters_total",
                "Undecodable messages delivered to the dead-letter topic.",
            ),
            dead_letter_errors: counter(
                registry,
                "tally_dead_letter_errors_total",
                "Dead letters that could not be queued or delivered.",
            ),
            schema_evictions: counter(
                registry,
                "tally_schema_evictions_total",
                "Compiled schemas of a schema registry forgotten to stay within decode.max_schemas (fetched again when an event carries them).",
            ),
        }
    }

    /// Show every reason at 0 from the start, so a rate over it exists before the first error.
    pub fn register_reasons(&self, reasons: impl IntoIterator<Item = &'static str>) {
        for reason in reasons {
            self.decode_errors.with_label_values(&[reason]);
        }
    }

    /// Count `n` messages skipped as bad input for `reason` (a bounded set: the decoder's).
    pub fn decode_failed(&self, reason: &'static str, n: u64) {
        self.decode_errors.with_label_values(&[reason]).inc_by(n);
    }
}
