//! What a run measured: the figures `orchestrate.rs` collects and `report/` prints. Plain data,
//! so that both depend on this file and neither on the other's side.

use crate::e2e::{E2e, Shape};
use crate::pipeline::PipelineResult;
use crate::raw::RawResult;
use crate::Variant;

/// The machine and the run, for the report's first lines.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub redis: String,
    pub load_start: String,
    pub load_end: String,
    pub secs: f64,
    pub quick: bool,
    pub total: u64,
    pub partitions: i32,
    pub compression: String,
}

/// Every part measured on one workload.
pub struct VariantResults {
    pub variant: Variant,
    pub raw_read: RawResult,
    pub raw_parse: RawResult,
    pub e2e: E2e,
    /// Part 2 against a 3-primary cluster (`--cluster`).
    pub cluster: Option<E2e>,
    /// Part 2 with more lanes or replicas (`orchestrate::SHAPES`).
    pub scaling: Vec<(Shape, E2e)>,
    pub pipe: PipelineResult,
}

impl VariantResults {
    pub fn raw_parse_rate(&self) -> f64 {
        self.raw_parse.messages as f64 / self.raw_parse.secs
    }

    /// Milliseconds per 100,000 keys over all flushes of part 3 (+ flush).
    pub fn pipe_ms_per_100k(&self) -> f64 {
        let secs: f64 = self.pipe.flush.flush_secs.iter().sum();
        let keys: u64 = self.pipe.flush.flush_keys.iter().sum();
        secs / keys.max(1) as f64 * 1e5 * 1e3
    }
}
