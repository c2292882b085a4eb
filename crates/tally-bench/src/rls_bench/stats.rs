//! Latencies collected by many callers, and their percentiles.

use std::time::Duration;

/// What one phase measured.
#[derive(Default)]
pub struct Phase {
    /// Every call's latency, microseconds.
    pub micros: Vec<u64>,
    /// Calls that failed (transport error, gRPC error, non-2xx).
    pub errors: u64,
    /// How long the phase ran.
    pub elapsed: Duration,
}

impl Phase {
    pub fn merge(&mut self, other: Phase) {
        self.micros.extend(other.micros);
        self.errors += other.errors;
    }

    pub fn per_second(&self) -> f64 {
        self.micros.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile in milliseconds (nearest rank).
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.micros.is_empty() {
            return f64::NAN;
        }
        self.micros.sort_unstable();
        let i = ((self.micros.len() as f64 * q).ceil() as usize).clamp(1, self.micros.len()) - 1;
        self.micros[i] as f64 / 1000.0
    }
}
