//! Part 2, tally end-to-end: from partition assignment until every applied offset in Redis
//! equals the partition's end offset.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::child::Perf;
use crate::proc_stats::{
    proc_cpu, proc_status_mb, thread_breakdown, thread_cpus, thread_runtime, unix_secs_f64,
};
use crate::redis_stats::{flushall, redis_snapshot, RedisSnapshot, RedisWork};
use crate::store::{AppliedOffsets, Store};
use crate::tally::{spawn_tally, Ctx, Scrape, Share};

#[derive(Debug, Default, Clone)]
pub struct E2e {
    pub messages: f64,
    pub secs: f64,
    /// Until the consumer thread stopped working (the rest is waiting for the last flush).
    pub consume_secs: f64,
    pub cpu: f64,
    pub broker_cpu: f64,
    pub peak_rss_mb: f64,
    /// Summed over the servers (every primary of a cluster).
    pub redis: RedisWork,
    /// `used_cpu_user + used_cpu_sys` of each server.
    pub redis_cpu_per_server: Vec<f64>,
    pub flushes: f64,
    pub keys_flushed: f64,
    pub distinct_keys: u64,
    /// Counter keys on each server (SCAN; tally's applied-offset keys excluded).
    pub keys_per_server: Vec<u64>,
    pub flush_p50: f64,
    pub flush_p99: f64,
    pub flush_secs_sum: f64,
    pub flush_keys_sum: f64,
    /// Highest `tally_pending_keys` seen (scraped every 100 ms).
    pub max_pending: f64,
    pub threads: Vec<(String, f64)>,
    pub counted_ok: bool,
}

/// How tally runs in part 2: processes in the group, and consumer lanes in each.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub replicas: usize,
    pub lanes: usize,
    /// `flush.max_keys_per_merged_call` at its default (false: 0, no merged calls).
    pub merge: bool,
}

impl Shape {
    pub const ONE: Shape = Shape {
        replicas: 1,
        lanes: 1,
        merge: true,
    };
}

/// tally as consumer group `group` over `topic`, written to `store`; `label` names its files.
pub fn phase_e2e(
    ctx: &Ctx,
    store: &Store,
    topic: &str,
    per_partition: i64,
    group: &str,
    label: &str,
) -> anyhow::Result<E2e> {
    phase_e2e_shaped(ctx, store, topic, per_partition, group, label, Shape::ONE)
}

/// Part 2 with `shape.replicas` tally processes in one group, each with `shape.lanes` lanes.
/// Time starts when the first process holds its share of the partitions (so a second replica's
/// join and the rebalance it causes are part of the measurement); CPU is summed over the
/// processes, peak RSS too.
pub fn phase_e2e_shaped(
    ctx: &Ctx,
    store: &Store,
    topic: &str,
    per_partition: i64,
    group: &str,
    label: &str,
    shape: Shape,
) -> anyhow::Result<E2e> {
    let mut conns = store.connect()?;
    for conn in &mut conns {
        flushall(conn)?;
    }
    let share = i64::from(ctx.exe_args_partitions) / shape.replicas as i64;
    let mut children = Vec::new();
    for r in 0..shape.replicas {
        children.push(spawn_tally(
            ctx,
            store,
            topic,
            group,
            &format!("{label}-{r}"),
            "",
            Share {
                lanes: shape.lanes,
                partitions: share,
                merge: shape.merge,
            },
        )?);
    }
    let mut t0 = f64::INFINITY;
    for (child, _, _) in &children {
        let assigned: serde_json::Value = child.result(Duration::from_secs(60))?;
        t0 = t0.min(assigned["assigned_at"].as_f64().context("assigned_at")?);
    }
    let pids: Vec<u32> = children.iter().map(|(c, _, _)| c.pid()).collect();
    let ports: Vec<u16> = children.iter().map(|(_, p, _)| *p).collect();
    let cpu0: f64 = pids.iter().map(|&p| proc_cpu(p)).sum();
    let broker0 = proc_cpu(ctx.broker_pid);
    let threads0: Vec<_> = pids.iter().map(|&p| thread_cpus(p)).collect();
    let snap0 = snapshots(&mut conns)?;
    let perf = Perf::attach(ctx.perf.as_deref(), pids[0], label);

    let mut fences = AppliedOffsets::new(store, group, topic, ctx.exe_args_partitions);
    // Every consumer lane's thread, in every process.
    let consumer_tids: Vec<(u32, String)> = pids
        .iter()
        .zip(&threads0)
        .flat_map(|(&pid, threads)| {
            threads
                .iter()
                .filter(|(_, (name, _))| name.starts_with("tally-consumer"))
                .map(move |(tid, _)| (pid, tid.clone()))
        })
        .collect();
    let n = (per_partition * i64::from(ctx.exe_args_partitions)) as f64;
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut polls: u64 = 0;
    let mut consumed_seen: Option<f64> = None;
    let mut max_pending: f64 = 0.0;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let done = fences.all_at(&mut conns, per_partition)?;
        polls += 1;
        let now = unix_secs_f64();
        let busy: Option<f64> = consumer_tids
            .iter()
            .map(|(pid, tid)| thread_runtime(*pid, tid))
            .sum();
        if let Some(c) = busy {
            samples.push((now, c));
        }
        // tally publishes its consumed count and pending keys at least every 200 ms.
        if polls.is_multiple_of(10) {
            if let Ok(s) = Scrape::sum(&ports) {
                if consumed_seen.is_none() && s.value("tally_messages_consumed_total") >= n {
                    consumed_seen = Some(unix_secs_f64());
                }
                max_pending = max_pending.max(s.value("tally_pending_keys"));
            }
        }
        if done {
            break;
        }
        if Instant::now() > deadline {
            let applied = fences.read(&mut conns)?;
            bail!("tally did not apply every offset in time: {applied:?}");
        }
    }
    let t1 = unix_secs_f64();
    let cpu1: f64 = pids.iter().map(|&p| proc_cpu(p)).sum();
    let broker_cpu = proc_cpu(ctx.broker_pid) - broker0;
    let threads1: Vec<_> = pids.iter().map(|&p| thread_cpus(p)).collect();
    let peak_rss_mb: f64 = pids.iter().map(|&p| proc_status_mb(Some(p), "VmHWM")).sum();
    perf.stop();
    let snap1 = snapshots(&mut conns)?;
    let scrape = Scrape::sum(&ports)?;
    let first = Scrape::get(ports[0])?;
    for (child, _, config_path) in children {
        child.finish(Duration::from_secs(60));
        let _ = std::fs::remove_file(config_path);
    }

    // The consumer thread stops working when the topic is drained; it then idles until the
    // last flush (due one flush interval after the last batch started) lands. Consumption ended
    // at the last 10 ms sample in which the thread was busy (≥ 10%) before /metrics showed every
    // message consumed. An idle consumer thread is busy well under 1%.
    let seen = consumed_seen.unwrap_or(t1);
    let consume_end = samples
        .windows(2)
        .filter(|w| w[1].0 <= seen && w[1].1 - w[0].1 >= 0.1 * (w[1].0 - w[0].0))
        .map(|w| w[1].0)
        .next_back()
        .unwrap_or(seen);
    let counted = store.counters(&mut conns)?;
    // Own commands on each server: the applied-offset reads and the INFO calls of the snapshots.
    let work: Vec<RedisWork> = snap0
        .iter()
        .zip(&snap1)
        .enumerate()
        .map(|(i, (a, b))| a.work_until(b, fences.sent_to(i) + 3.0))
        .collect();
    Ok(E2e {
        messages: n,
        secs: t1 - t0,
        consume_secs: consume_end - t0,
        cpu: cpu1 - cpu0,
        broker_cpu,
        peak_rss_mb,
        redis: RedisWork::sum(&work),
        redis_cpu_per_server: work.iter().map(|w| w.cpu).collect(),
        flushes: scrape.value("tally_flush_duration_seconds_count"),
        keys_flushed: scrape.value("tally_keys_flushed_total"),
        distinct_keys: counted.keys.iter().sum(),
        keys_per_server: counted.keys,
        // Histograms of the first process (quantiles do not add up).
        flush_p50: first.quantile("tally_flush_duration_seconds", 0.5),
        flush_p99: first.quantile("tally_flush_duration_seconds", 0.99),
        flush_secs_sum: scrape.value("tally_flush_duration_seconds_sum"),
        flush_keys_sum: scrape.value("tally_flush_keys_sum"),
        max_pending,
        threads: threads0
            .iter()
            .zip(&threads1)
            .flat_map(|(a, b)| thread_breakdown(a, b))
            .collect(),
        counted_ok: counted.sum as f64 == n
            && counted.mistagged == 0
            && scrape.value("tally_messages_consumed_total") >= n,
    })
}

fn snapshots(conns: &mut [redis::Connection]) -> anyhow::Result<Vec<RedisSnapshot>> {
    conns.iter_mut().map(redis_snapshot).collect()
}
