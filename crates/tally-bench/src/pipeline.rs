//! Role `pipeline`: parts 3 (pipeline without Kafka, with and without flushes) and 4
//! (per-message baseline), and the cost of fencing, fed from memory.

use std::time::Instant;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use tally::config::{Config, RedisMode};
use tally::stream::sink::script::APPLY_LUA;

use crate::pipeline_loop::{
    apply_units, fence_scope, load_bench_config, new_aggregator, reset_fences, run_loop, Flusher,
    LoopResult, Messages,
};
use crate::proc_stats::{cpu_self, median, unix_ms};
use crate::raw::RawEvent;
use crate::redis_stats::{flushall, redis_conn, redis_snapshot, sum_counters, RedisWork};
use crate::PipelineArgs;

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct PipelineResult {
    pub messages: u64,
    /// decode → aggregate → seal, one thread (median of the repetitions).
    pub agg_secs: f64,
    pub agg_cpu: f64,
    pub agg_keys: u64,
    /// The same with the Redis Cluster key layout (`--cluster-layout`; 0 when not run).
    pub agg_cluster_secs: f64,
    pub agg_cluster_cpu: f64,
    /// `--hot-keys`: the loop with the heavy-hitters summary fed per batch, and without it,
    /// alternating (medians); 0 when not run.
    #[serde(default)]
    pub agg_hot_secs: f64,
    #[serde(default)]
    pub agg_plain_secs: f64,
    /// The same runs' CPU time (thread), medians: what the summary costs the consumer thread.
    #[serde(default)]
    pub agg_hot_cpu: f64,
    #[serde(default)]
    pub agg_plain_cpu: f64,
    /// The same with flushes to Redis.
    pub flush: LoopResult,
    pub flush_redis: RedisWork,
    pub flush_counted_ok: bool,
    pub distinct_keys: u64,
    /// Fencing: keys applied by one pipeline of units, fenced vs without the CAS (median).
    pub fence_keys: u64,
    pub fence_units: u64,
    pub fenced_secs: f64,
    /// Every repetition of the fenced apply: an isolated flush of ~`flush.max_keys` keys.
    pub fenced_all: Vec<f64>,
    /// The same units through a script doing only INCRBY: the floor of a script-based flush.
    pub incrby_only_secs: f64,
    /// The same units through a script doing INCRBY and PEXPIREAT per key (what a careful
    /// hand-written flush does to keep the expiry).
    pub incrby_expire_secs: f64,
    /// The three scripts again on the same units, every key existing (the steady state: a
    /// window's keys are written by every flush until it ends).
    pub fenced_existing_secs: f64,
    pub incrby_only_existing_secs: f64,
    pub incrby_expire_existing_secs: f64,
    /// Per-message baseline.
    pub base_messages: u64,
    pub base_secs: f64,
    pub base_cpu: f64,
    pub base_redis: RedisWork,
    pub base_counted_ok: bool,
}

/// Only the INCRBYs (no expiry, no lateness check, no fence): what Redis needs at least.
/// Takes `APPLY_LUA`'s arguments: the (delta, expire-at) pairs are the last `2 × keys` of ARGV.
pub const INCRBY_ONLY_LUA: &str = r#"
local base = #ARGV - 2 * (#KEYS - 2)
for i = 3, #KEYS do
  redis.call('INCRBY', KEYS[i], ARGV[base + 2 * i - 5])
end
return {1, 0, 0}
"#;

/// INCRBY and PEXPIREAT for every key, nothing else.
pub const INCRBY_EXPIRE_LUA: &str = r#"
local base = #ARGV - 2 * (#KEYS - 2)
for i = 3, #KEYS do
  redis.call('INCRBY', KEYS[i], ARGV[base + 2 * i - 5])
  redis.call('PEXPIREAT', KEYS[i], ARGV[base + 2 * i - 4])
end
return {1, 0, 0}
"#;

/// What most users write: one call per event.
pub const PER_MESSAGE_LUA: &str = r#"
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return v
"#;

/// The in-memory loop `reps` times; the run of median duration.
fn median_run(
    config: &Config,
    msgs: &Messages,
    partitions: i32,
    reps: u32,
) -> anyhow::Result<LoopResult> {
    let mut runs = Vec::new();
    for _ in 0..reps {
        runs.push(run_loop(config, msgs, partitions, None, None)?);
    }
    runs.sort_by(|x, y| x.secs.total_cmp(&y.secs));
    Ok(runs.swap_remove(runs.len() / 2))
}

pub fn role_pipeline(a: &PipelineArgs) -> anyhow::Result<()> {
    let config = load_bench_config(&a.redis_url)?;
    let msgs = Messages::generate(a.keys, a.skew, a.seed, a.messages, a.partitions);
    let mut res = PipelineResult {
        messages: a.messages,
        ..Default::default()
    };

    // 3a: in memory, one thread.
    let reps = a.only_aggregate.unwrap_or(3).max(1);
    let mid = median_run(&config, &msgs, a.partitions, reps)?;
    res.agg_secs = mid.secs;
    res.agg_cpu = mid.cpu;
    res.agg_keys = mid.keys_sealed;
    if a.cluster_layout {
        let mut cluster = config.clone();
        cluster.redis.mode = RedisMode::Cluster;
        let mid = median_run(&cluster, &msgs, a.partitions, reps)?;
        res.agg_cluster_secs = mid.secs;
        res.agg_cluster_cpu = mid.cpu;
    }
    if let Some(capacity) = a.hot_keys {
        // Side by side in one process, alternating, so machine noise hits both alike.
        let (mut plain, mut hot) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            plain.push(run_loop(&config, &msgs, a.partitions, None, None)?);
            let status = tally::ops::status::Status::new(capacity);
            hot.push(run_loop(&config, &msgs, a.partitions, None, Some(&status))?);
        }
        res.agg_plain_secs = median(plain.iter().map(|r| r.secs).collect());
        res.agg_hot_secs = median(hot.iter().map(|r| r.secs).collect());
        res.agg_plain_cpu = median(plain.iter().map(|r| r.cpu).collect());
        res.agg_hot_cpu = median(hot.iter().map(|r| r.cpu).collect());
    }
    if a.only_aggregate.is_some() {
        println!("{}", serde_json::to_string(&res)?);
        return Ok(());
    }

    // 3b: with the flush to Redis.
    let mut conn = redis_conn(&a.redis_url)?;
    flushall(&mut conn)?;
    let flusher = Flusher::start(&a.redis_url, &config, a.partitions)?;
    let snap0 = redis_snapshot(&mut conn)?;
    res.flush = run_loop(&config, &msgs, a.partitions, Some(&flusher), None)?;
    let snap1 = redis_snapshot(&mut conn)?;
    res.flush_redis = snap0.work_until(&snap1, 3.0);
    drop(flusher.tx);
    let _ = flusher.thread.join();
    let (distinct, sum) = sum_counters(&mut conn)?;
    res.distinct_keys = distinct;
    res.flush_counted_ok = sum == a.messages as i64;

    // Script cost: the first flush's worth of units through tally's script and an INCRBY-only one.
    let (decoder, mut agg) = new_aggregator(&config, a.partitions)?;
    let now_ms = unix_ms();
    for (i, &(_, _, partition, offset, ts)) in msgs.index.iter().enumerate() {
        if agg.pending_keys() >= config.flush.max_keys {
            break;
        }
        if let Ok(event) = decoder.decode(Some(msgs.payload(i)), Some(ts)) {
            agg.add(partition, offset, &event, now_ms);
        }
    }
    let units = agg.seal(None).units;
    res.fence_units = units.len() as u64;
    let mut scripts = Vec::new();
    for (src, check) in [
        (APPLY_LUA.to_string(), true),
        (INCRBY_ONLY_LUA.to_string(), false),
        (INCRBY_EXPIRE_LUA.to_string(), false),
    ] {
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(src).query(&mut conn)?;
        scripts.push((sha, check, Vec::new(), Vec::new()));
    }
    let scope = fence_scope(&config);
    // Interleaved repetitions, each from the same state: an empty database and fresh fences
    // (every key new), then the same units again with the fences reset (every key existing).
    for _ in 0..7 {
        for (sha, check, new, existing) in &mut scripts {
            flushall(&mut conn)?;
            reset_fences(&mut conn, &scope, a.partitions)?;
            let started = Instant::now();
            // No TTL check of existing keys: the common case (and every key here is new).
            res.fence_keys = apply_units(&mut conn, &scope, sha, &units, *check, false)?;
            new.push(started.elapsed().as_secs_f64());
            reset_fences(&mut conn, &scope, a.partitions)?;
            let started = Instant::now();
            apply_units(&mut conn, &scope, sha, &units, *check, false)?;
            existing.push(started.elapsed().as_secs_f64());
        }
    }
    res.fenced_all = scripts[0].2.clone();
    let medians: Vec<(f64, f64)> = scripts
        .into_iter()
        .map(|s| (median(s.2), median(s.3)))
        .collect();
    (res.fenced_secs, res.fenced_existing_secs) = medians[0];
    (res.incrby_only_secs, res.incrby_only_existing_secs) = medians[1];
    (res.incrby_expire_secs, res.incrby_expire_existing_secs) = medians[2];

    // 4: one pipelined Lua call per message, 1,000 calls per round trip.
    flushall(&mut conn)?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(PER_MESSAGE_LUA)
        .query(&mut conn)?;
    let n = (a.baseline_messages as usize).min(msgs.index.len());
    let snap0 = redis_snapshot(&mut conn)?;
    let (t0, cpu0) = (Instant::now(), cpu_self());
    let mut pipe = redis::pipe();
    let mut key = String::with_capacity(128);
    let mut hour_cache: (i64, String, i64) = (i64::MIN, String::new(), 0);
    for i in 0..n {
        let ts = msgs.index[i].4;
        let e: RawEvent = serde_json::from_slice(msgs.payload(i))?;
        if ts / 3_600_000 != hour_cache.0 {
            let hour = ts / 3_600_000;
            let text = chrono::DateTime::from_timestamp_millis(ts)
                .context("ts")?
                .format("%Y%m%d%H")
                .to_string();
            hour_cache = (hour, text, (hour + 3) * 3_600_000);
        }
        key.clear();
        use std::fmt::Write as _;
        let _ = write!(
            key,
            "flow:count:{}:{}:{}:{}",
            e.app_id, e.device_id, e.ip, hour_cache.1
        );
        pipe.cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(1)
            .arg(hour_cache.2);
        if (i + 1) % 1000 == 0 || i + 1 == n {
            let _: redis::Value = pipe.query(&mut conn)?;
            pipe.clear();
        }
    }
    res.base_secs = t0.elapsed().as_secs_f64();
    res.base_cpu = cpu_self() - cpu0;
    res.base_messages = n as u64;
    let snap1 = redis_snapshot(&mut conn)?;
    res.base_redis = snap0.work_until(&snap1, 3.0);
    let (_, sum) = sum_counters(&mut conn)?;
    res.base_counted_ok = sum == n as i64;
    flushall(&mut conn)?;
    println!("{}", serde_json::to_string(&res)?);
    Ok(())
}
