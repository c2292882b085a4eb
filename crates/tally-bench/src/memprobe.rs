//! Role `memprobe`: the memory of 1,000,000 pending keys, and of flushing them: all at once
//! (revoke, shutdown), or one regular flush capped at `flush.max_keys`.

use serde::{Deserialize, Serialize};

use tally::stream::sink::script::apply_cmd;
use tally::stream::sink::CHUNK_KEYS;
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
    /// Size of that flush's packed pipeline (the largest chunk's, unless `--whole`).
    pub encoded_mb: f64,
}

pub fn role_memprobe(keys: u64, partitions: i32, capped: bool, whole: bool) -> anyhow::Result<()> {
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
    // Flush them as the sink does (`Sink::plan`, then `send_group`): the sealed units are
    // kept (compact, for retries) while one chunk of about 10,000 keys at a time becomes script
    // calls in a pipeline, packed into one buffer and copied into the connection's write buffer
    // (redis-rs' codec). `--whole` encodes the whole flush at once, as the sink did before
    // bounded encoding: each unit dropped once encoded, the three copies alive together.
    let max_keys = if capped {
        config.flush.max_keys
    } else {
        usize::MAX
    };
    let batch = agg.seal_up_to(None, max_keys);
    let flush_keys = batch.keys as u64;
    let sha = "0".repeat(40);
    let scope = fence_scope(&config);
    let encode = |pipe: &mut redis::Pipeline, u: &tally::stream::aggregate::FlushUnit| {
        pipe.add_command(apply_cmd(&sha, &scope.keys(u.partition, u.shard), u, false));
    };
    let mut encoded = 0;
    if whole {
        let mut pipe = redis::pipe();
        for u in batch.units {
            encode(&mut pipe, &u);
        }
        let packed = pipe.get_packed_pipeline();
        let write_buffer = packed.clone();
        let r = result(
            keys,
            pending,
            rss_before_mb,
            rss_pending_mb,
            flush_keys,
            packed.len(),
        );
        drop((pipe, packed, write_buffer));
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let mut rest = &batch.units[..];
    while !rest.is_empty() {
        let mut n = 0;
        let mut chunk_keys = 0;
        while n < rest.len() && (n == 0 || chunk_keys + rest[n].items() <= CHUNK_KEYS) {
            chunk_keys += rest[n].items();
            n += 1;
        }
        let mut pipe = redis::pipe();
        for u in &rest[..n] {
            encode(&mut pipe, u);
        }
        let packed = pipe.get_packed_pipeline();
        let write_buffer = packed.clone();
        encoded = encoded.max(packed.len());
        drop((pipe, packed, write_buffer));
        rest = &rest[n..];
    }
    let r = result(
        keys,
        pending,
        rss_before_mb,
        rss_pending_mb,
        flush_keys,
        encoded,
    );
    drop(batch);
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

fn result(
    keys: u64,
    pending: u64,
    rss_before_mb: f64,
    rss_pending_mb: f64,
    flush_keys: u64,
    encoded: usize,
) -> MemResult {
    MemResult {
        keys,
        pending,
        rss_before_mb,
        rss_pending_mb,
        hwm_mb: proc_status_mb(None, "VmHWM"),
        flush_keys,
        encoded_mb: (encoded as f64) / 1024.0 / 1024.0,
    }
}
