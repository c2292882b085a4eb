//! Synthetic events for the demo, the load generator, tests and benchmarks.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// One synthetic event's dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dims {
    /// `app<k % apps>`.
    pub app_id: String,
    /// `dev<k>`.
    pub device_id: String,
    /// An IPv4 address derived from k.
    pub ip: String,
}

/// Draws key indexes from a Zipf-like distribution (exponent `skew`; 0 = uniform) over `keys`.
pub struct EventGen {
    rng: SmallRng,
    keys: u64,
    zipf: Option<Zipf<f64>>,
}

impl EventGen {
    /// A deterministic generator for `seed`.
    pub fn new(keys: u64, skew: f64, seed: u64) -> EventGen {
        let keys = keys.max(1);
        EventGen {
            rng: SmallRng::seed_from_u64(seed),
            keys,
            zipf: (skew > 0.0).then(|| Zipf::new(keys as f64, skew).expect("keys >= 1, skew > 0")),
        }
    }

    /// Next key index in `0..keys`.
    pub fn next_key(&mut self) -> u64 {
        match &self.zipf {
            Some(z) => (z.sample(&mut self.rng) as u64)
                .saturating_sub(1)
                .min(self.keys - 1),
            None => self.rng.random_range(0..self.keys),
        }
    }

    /// Dimensions of key index `k`.
    pub fn dims(k: u64) -> Dims {
        Dims {
            app_id: format!("app{}", k % 50),
            device_id: format!("dev{k}"),
            ip: format!("10.{}.{}.{}", (k >> 16) & 255, (k >> 8) & 255, k & 255),
        }
    }

    /// Write the JSON event for key `k` at `ts_ms` into `out` (cleared first), ~100 bytes.
    pub fn write_json(out: &mut Vec<u8>, k: u64, ts_ms: i64) {
        use std::io::Write;
        out.clear();
        let _ = write!(
            out,
            r#"{{"app_id":"app{}","device_id":"dev{}","ip":"10.{}.{}.{}","ts":{},"bytes":{}}}"#,
            k % 50,
            k,
            (k >> 16) & 255,
            (k >> 8) & 255,
            k & 255,
            ts_ms,
            64 + (k % 1000)
        );
    }
}
