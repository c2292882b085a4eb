//! Role `memprobe`: the memory of 1,000,000 pending keys, and of flushing them: all at once
//! (revoke, shutdown), or one regular flush capped at `flush.max_keys`.

use serde::{Deserialize, Serialize};

use tally::sink::script::apply_cmd;
use tally_testkit::gen::EventGen;

use crate::pipeline_loop::{fence_scope, load_bench_config, new_aggregator};
use crate::proc_stats::{proc_status_mb, unix_ms};

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct MemResult {
    pub keys: u64,
    /// Distinct keys pending in the aggregator.
    pub pending: u64,
    pub rss_before_mb: f64,
    /// With every key pending.
    pub rss_pending_mb: f64,
    /// Peak, while one flush of them is sealed and encoded.
    pub hwm_mb: f64,
    /// Keys in that flush: all pending keys, or about `flush.max_keys` (`--capped`).
    pub flush_keys: u64,
    /// Size of that flush's packed pipeline.
    pub encoded_mb: f64,
}

pub fn role_memprobe(keys: u64, partitions: i32, capped: bool) -> anyhow::Result<()> {
    let config = load_bench_config("redis://127.0.0.1:1")?;
    let (decoder, mut agg) = new_aggregator(&config, partitions)?;
    let rss_before_mb = proc_status_mb(None, "VmRSS");
    let now = unix_ms();
    let mut buf = Vec::with_capacity(128);
    for k in 0..keys {
        EventGen::write_json(&mut buf, k, now);
        let event = decoder.decode(Some(&buf), Some(now))?;
        let p = (k % partitions as u64) as i32;
        agg.add(p, (k / partitions as u64) as i64, &event, now);
    }
    let pending = agg.pending_keys() as u64;
    let rss_pending_mb = proc_status_mb(None, "VmRSS");
    // Flush them as the sink does (`Sink::prepare`, then the connection): the sealed units
    // become one script call each in a pipeline, each unit dropped once encoded; the pipeline
    // is packed into one buffer, and that buffer copied into the connection's write buffer
    // (redis-rs' codec) — the last three alive at the same moment.
    let max_keys = if capped {
        config.flush.max_keys
    } else {
        usize::MAX
    };
    let batch = agg.seal_up_to(None, max_keys);
    let flush_keys = batch.keys as u64;
    let sha = "0".repeat(40);
    let scope = fence_scope(&config);
    let mut pipe = redis::pipe();
    for u in batch.units {
        pipe.add_command(apply_cmd(
            &sha,
            &scope.keys(u.partition, u.shard),
            &u,
            false,
        ));
    }
    let packed = pipe.get_packed_pipeline();
    let write_buffer = packed.clone();
    let r = MemResult {
        keys,
        pending,
        rss_before_mb,
        rss_pending_mb,
        hwm_mb: proc_status_mb(None, "VmHWM"),
        flush_keys,
        encoded_mb: (packed.len() as f64) / 1024.0 / 1024.0,
    };
    drop((pipe, packed, write_buffer));
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}
