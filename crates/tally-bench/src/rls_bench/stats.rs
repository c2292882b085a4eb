//! Latencies collected by many callers, and their percentiles.

use std::time::Duration;

/// What one phase measured.
#[derive(Default)]
pub struct Phase {
    /// Every call's latency from when it was sent, microseconds.
    pub micros: Vec<u64>,
    /// At a fixed offered rate: every call's latency from when it was due (the schedule's
    /// time; includes the wait behind a slow call, and the wake-up of the caller).
    pub due_micros: Vec<u64>,
    /// Calls that failed (transport error, gRPC error, non-2xx).
    pub errors: u64,
    /// How long the phase ran.
    pub elapsed: Duration,
}

impl Phase {
    pub fn merge(&mut self, other: Phase) {
        self.micros.extend(other.micros);
        self.due_micros.extend(other.due_micros);
        self.errors += other.errors;
    }

    pub fn per_second(&self) -> f64 {
        self.micros.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile in milliseconds (nearest rank) of the latency from sending.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        quantile_ms(&mut self.micros, q)
    }

    /// The `q` quantile in milliseconds of the latency from when the call was due.
    pub fn due_quantile_ms(&mut self, q: f64) -> f64 {
        quantile_ms(&mut self.due_micros, q)
    }
}

fn quantile_ms(micros: &mut [u64], q: f64) -> f64 {
    if micros.is_empty() {
        return f64::NAN;
    }
    micros.sort_unstable();
    let i = ((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1;
    micros[i] as f64 / 1000.0
}
