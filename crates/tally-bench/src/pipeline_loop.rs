//! Part 3's loop: the real decoder and aggregator fed from memory on one thread, with the
//! worker's flush policy, and optionally a thread applying the flushes to Redis.

use std::sync::mpsc;
use std::time::Instant;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use tally::config::{Config, RedisMode};
use tally::model::layout::Layout;
use tally::stream::aggregate::{Aggregator, FlushUnit};
use tally::stream::consumer::policy::{FlushPolicy, Pending};
use tally::stream::sink::script::{apply_cmd, ApplyReply, APPLY_LUA};
use tally::stream::sink::FenceScope;
use tally_testkit::gen::EventGen;

use crate::config_toml;
use crate::proc_stats::{cpu_self, cpu_thread, unix_ms};
use crate::redis_stats::redis_conn;
use crate::store::Store;

/// Generated messages in one buffer.
pub struct Messages {
    pub buf: Vec<u8>,
    /// (start, len, partition, offset, kafka timestamp).
    pub index: Vec<(usize, usize, i32, i64, i64)>,
}

impl Messages {
    pub fn generate(keys: u64, skew: f64, seed: u64, n: u64, partitions: i32) -> Messages {
        let mut gen = EventGen::new(keys, skew, seed);
        let mut one = Vec::with_capacity(128);
        let mut buf = Vec::with_capacity(n as usize * 100);
        let mut index = Vec::with_capacity(n as usize);
        let now = unix_ms();
        for i in 0..n {
            EventGen::write_json(&mut one, gen.next_key(), now);
            let p = (i % partitions as u64) as i32;
            index.push((buf.len(), one.len(), p, (i / partitions as u64) as i64, now));
            buf.extend_from_slice(&one);
        }
        Messages { buf, index }
    }

    pub fn payload(&self, i: usize) -> &[u8] {
        let (start, len, ..) = self.index[i];
        &self.buf[start..start + len]
    }
}

pub fn load_bench_config(redis_url: &str) -> anyhow::Result<Config> {
    let path =
        std::env::temp_dir().join(format!("tally-bench-{}-pipeline.toml", std::process::id()));
    std::fs::write(
        &path,
        config_toml(
            "localhost:9092",
            "events",
            "bench-pipe",
            &Store::standalone(redis_url).redis_toml(),
            "",
            "",
            crate::tally::Share {
                lanes: 1,
                partitions: 0,
                merge: true,
            },
        ),
    )?;
    let config = Config::load(Some(&path), &serde_json::json!({}));
    let _ = std::fs::remove_file(path);
    Ok(config?)
}

/// The decoder and aggregator as `Tally::run` builds them (the key layout follows
/// `redis.mode`), every partition assigned from offset 0.
pub fn new_aggregator(
    config: &Config,
    partitions: i32,
) -> anyhow::Result<(tally::stream::decode::Decoder, Aggregator)> {
    let model = tally::config::Model::compile(config.clone())?;
    let (decoder, counters) = tally::stream::aggregate::stages(&model);
    let layout = match config.redis.mode {
        RedisMode::Standalone | RedisMode::Sentinel => Layout::standalone(),
        RedisMode::Cluster => Layout::cluster(config.redis.cluster_shards),
    };
    let applied = vec![0; layout.shards() as usize];
    let mut agg = Aggregator::new(counters, 1, config.flush.max_keys_per_call)
        .with_layout(layout)
        .with_watermarks(model.has_outputs());
    for p in 0..partitions {
        agg.assign(p, &applied);
    }
    Ok((decoder, agg))
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct LoopResult {
    pub secs: f64,
    pub cpu: f64,
    pub keys_sealed: u64,
    pub flushes: u64,
    pub flush_secs: Vec<f64>,
    pub flush_keys: Vec<u64>,
}

/// A thread owning a Redis connection that applies sealed units with tally's script, one
/// pipeline per flush, like the sink (which also checks existing keys for a missing expiry only
/// on every `flush.ttl_check_every`-th flush, the first one included).
pub struct Flusher {
    pub tx: mpsc::Sender<Vec<FlushUnit>>,
    pub done: mpsc::Receiver<anyhow::Result<(f64, u64)>>,
    pub thread: std::thread::JoinHandle<()>,
}

/// Where the bench's consumer (`config`'s group and topic) keeps its fences, as tally names them.
pub fn fence_scope(config: &Config) -> FenceScope {
    FenceScope::new(&config.redis, &config.kafka.group_id, &config.kafka.topic)
}

/// Set the fence of every shard of `partitions` to 0: every unit of a fresh aggregator applies.
pub fn reset_fences(
    conn: &mut redis::Connection,
    scope: &FenceScope,
    partitions: i32,
) -> anyhow::Result<()> {
    for p in 0..partitions {
        for shard in 0..scope.layout.shards() {
            redis::cmd("SET")
                .arg(scope.key(p, shard))
                .arg(0)
                .query::<()>(conn)?;
        }
    }
    Ok(())
}

impl Flusher {
    pub fn start(url: &str, config: &Config, partitions: i32) -> anyhow::Result<Flusher> {
        let mut conn = redis_conn(url)?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(APPLY_LUA)
            .query(&mut conn)?;
        let scope = fence_scope(config);
        reset_fences(&mut conn, &scope, partitions)?;
        let ttl_check_every = config.flush.ttl_check_every;
        let (tx, rx) = mpsc::channel::<Vec<FlushUnit>>();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for (flushes, units) in (0u64..).zip(rx) {
                let check_ttl = flushes.is_multiple_of(u64::from(ttl_check_every.max(1)));
                let started = Instant::now();
                let r = apply_units(&mut conn, &scope, &sha, &units, true, check_ttl)
                    .map(|keys| (started.elapsed().as_secs_f64(), keys));
                if done_tx.send(r).is_err() {
                    return;
                }
            }
        });
        Ok(Flusher { tx, done, thread })
    }
}

/// Apply `units` in one pipeline with the script `sha` (which takes `APPLY_LUA`'s arguments);
/// with `fenced`, check every unit was applied ([`ApplyReply::Applied`]).
/// `check_ttl`: whether the script also looks for existing keys without an expiry.
pub fn apply_units(
    conn: &mut redis::Connection,
    scope: &FenceScope,
    sha: &str,
    units: &[FlushUnit],
    fenced: bool,
    check_ttl: bool,
) -> anyhow::Result<u64> {
    let mut pipe = redis::pipe();
    for u in units {
        pipe.add_command(apply_cmd(
            sha,
            &scope.keys(u.partition, u.shard),
            u,
            check_ttl,
        ));
    }
    let replies: Vec<redis::Value> = pipe.query(conn)?;
    if fenced {
        for r in &replies {
            match ApplyReply::parse(r).map_err(anyhow::Error::msg)? {
                ApplyReply::Applied { .. } => {}
                other => bail!("unit not applied: {other:?}"),
            }
        }
    }
    Ok(units.iter().map(|u| u.keys.len() as u64).sum())
}

/// decode → aggregate → seal over `msgs` on this thread, as the consumer thread does it
/// (the product's `FlushPolicy`, as `Worker::tick` uses it): a flush is due at
/// `flush.max_keys` pending keys or `flush.interval` after the batch started, and seals at most
/// about `flush.max_keys` keys (`Aggregator::seal_up_to`); a capped flush leaves the rest due, so
/// the next one starts as soon as this one lands. With a `flusher`, at most one flush is in
/// flight and consumption waits above `flush.max_pending_keys`. Without one, sealed units are
/// dropped. After the last message, the rest is flushed at once, in capped flushes.
pub fn run_loop(
    config: &Config,
    msgs: &Messages,
    partitions: i32,
    flusher: Option<&Flusher>,
    status: Option<&tally::ops::status::Status>,
) -> anyhow::Result<LoopResult> {
    let (decoder, mut agg) = new_aggregator(config, partitions)?;
    let policy = FlushPolicy::new(&config.flush);
    let mut out = LoopResult::default();
    let mut in_flight: Option<usize> = None;
    let mut batch_started: Option<Instant> = None;
    let mut now_ms = unix_ms();
    let (t0, cpu0) = (
        Instant::now(),
        if flusher.is_some() {
            cpu_self()
        } else {
            cpu_thread()
        },
    );
    let collect =
        |out: &mut LoopResult, wait: bool, in_flight: &mut Option<usize>| -> anyhow::Result<()> {
            let (Some(f), Some(_)) = (flusher, *in_flight) else {
                return Ok(());
            };
            let r = if wait {
                f.done.recv().ok()
            } else {
                f.done.try_recv().ok()
            };
            if let Some(r) = r {
                let (secs, keys) = r?;
                out.flush_secs.push(secs);
                out.flush_keys.push(keys);
                *in_flight = None;
            }
            Ok(())
        };
    // Seal up to `max_keys` keys and send them; true when nothing is left pending.
    let start_flush = |agg: &mut Aggregator,
                       out: &mut LoopResult,
                       in_flight: &mut Option<usize>|
     -> anyhow::Result<bool> {
        let batch = agg.seal_up_to(None, policy.batch_keys());
        if let Some(status) = status {
            // What the consumer's flusher does with every sealed batch.
            status.sealed(batch.count_deltas(), batch.max_units_per_key());
        }
        if !batch.units.is_empty() {
            out.keys_sealed += batch.keys as u64;
            out.flushes += 1;
            if let Some(f) = flusher {
                *in_flight = Some(batch.keys);
                f.tx.send(batch.units)?;
            }
        }
        Ok(batch.complete)
    };
    for (i, &(_, _, partition, offset, ts)) in msgs.index.iter().enumerate() {
        if i % 64 == 0 {
            now_ms = unix_ms();
            collect(&mut out, false, &mut in_flight)?;
            let load = |agg: &Aggregator, started: Option<Instant>, in_flight| Pending {
                oldest: started.map(|t| t.elapsed()),
                keys: agg.pending_keys(),
                in_flight,
                caught_up: false,
                // The loop runs far ahead of the interval: flushes are due by size.
                flush_takes: std::time::Duration::ZERO,
            };
            if policy.flush_due(&load(&agg, batch_started, in_flight))
                && start_flush(&mut agg, &mut out, &mut in_flight)?
            {
                batch_started = None;
            }
            if policy.pause(&load(&agg, batch_started, in_flight)) {
                collect(&mut out, true, &mut in_flight)?;
            }
        }
        match decoder.decode(Some(msgs.payload(i)), Some(ts)) {
            Ok(event) => {
                agg.add(partition, offset, &event, now_ms);
            }
            Err(_) => agg.skip(partition, offset),
        }
        batch_started.get_or_insert_with(Instant::now);
    }
    loop {
        collect(&mut out, true, &mut in_flight)?;
        if start_flush(&mut agg, &mut out, &mut in_flight)? {
            collect(&mut out, true, &mut in_flight)?;
            break;
        }
    }
    out.secs = t0.elapsed().as_secs_f64();
    out.cpu = if flusher.is_some() {
        cpu_self()
    } else {
        cpu_thread()
    } - cpu0;
    Ok(out)
}
