//! `tally-bench gate`: the benchmark gate of CI (`scripts/test.sh`). tally end to end against a
//! bare consumer of the same topic, both timed **from process start**, in alternating rounds of
//! one run; the medians of the per-round ratios must stay above a floor.
//!
//! - **bare**: a plain rdkafka consumer that joins a group of its own (`subscribe`, with tally's
//!   client settings), reads every message and `serde_json`-parses it: what a team writes before
//!   it reaches for a stream processor. From its spawn until it has parsed the last message.
//! - **tally**: the `tally` role (`tally::app::Tally`, as `tally run`) on the default lanes
//!   (`kafka.consumers = "auto"`) into a real `redis-server`, as a new group. From its spawn until
//!   Redis says every partition is applied up to its end offset (counted, flushed and fenced).
//!
//! Both pay the process start and the broker's group join (librdkafka's mock cluster delays a new
//! group's first rebalance by 3 s, as Kafka's `group.initial.rebalance.delay.ms` does); CPU is the
//! whole process' user + system time from its start. The order alternates each round so that a
//! drift of the machine (the other core busy, a cache warming) falls on both sides.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use tally_testkit::local_redis::LocalRedis;

use crate::broker::produce;
use crate::child::ChildRole;
use std::collections::HashMap;

use crate::proc_stats::{median, proc_cpu, proc_status_mb, thread_breakdown, thread_cpus};
use crate::raw::RawResult;
use crate::redis_stats::flushall;
use crate::store::{AppliedOffsets, Store};
use crate::tally::Scrape;
use crate::Variant;

const TOPIC: &str = "gate";

#[derive(clap::Args, Clone)]
pub struct GateArgs {
    /// Events in the topic (JSON, lz4-compressed batches).
    #[arg(long, default_value_t = 800_000)]
    events: u64,
    #[arg(long, default_value_t = 16)]
    partitions: i32,
    /// Distinct keys of the counter, Zipf-distributed.
    #[arg(long, default_value_t = 75_000)]
    keys: u64,
    #[arg(long, default_value_t = 0.8)]
    skew: f64,
    /// Rounds (each runs bare and tally once, in alternating order).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Fail when the median of tally's rate / the bare consumer's rate is below this.
    #[arg(long, default_value_t = 0.0)]
    min_rate_ratio: f64,
    /// Fail when the median of tally's CPU per event / the bare consumer's is above this.
    #[arg(long, default_value_t = f64::INFINITY)]
    max_cpu_ratio: f64,
    /// Also run, each round, a consumer that only reads (no parse): the ceiling any consumer
    /// with these client settings can reach, as ratios to the bare consumer.
    #[arg(long)]
    read_only: bool,
}

/// One side of one round.
#[derive(Debug, Clone)]
struct Run {
    /// From spawn until done.
    secs: f64,
    /// From spawn until every event was read (tally: `tally_messages_consumed_total`, scraped
    /// every 50 ms); the rest of `secs` is the last flushes landing in Redis.
    read_secs: f64,
    /// The process' CPU seconds from its start until done.
    cpu: f64,
    peak_rss_mb: f64,
    /// Partitions tally's lanes gave up to a rebalance (0: the lanes joined in one generation).
    revoked: f64,
    /// tally's CPU by thread name, largest first (empty for the bare consumer).
    threads: Vec<(String, f64)>,
}

pub fn role_gate(args: &GateArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let per_partition = (args.events / args.partitions as u64).max(1) as i64;
    let events = per_partition * i64::from(args.partitions);
    let broker = ChildRole::spawn(
        &[
            "broker".into(),
            "--topic".into(),
            format!("{TOPIC}:{}", args.partitions),
        ],
        "gate-broker",
    )?;
    let bootstrap = broker.line(Duration::from_secs(30))?;
    let workload = Variant {
        name: "gate",
        keys: args.keys,
        skew: args.skew,
        seed: 7,
    };
    produce(
        &bootstrap,
        TOPIC,
        args.partitions,
        per_partition,
        &workload,
        "lz4",
    )?;
    let redis = LocalRedis::start(&[]).context("redis-server")?;
    let store = Store::standalone(&redis.url());
    println!(
        "gate: {events} JSON events, {} partitions, {} keys (Zipf {}), {} rounds; produced in {:.1} s",
        args.partitions,
        args.keys,
        args.skew,
        args.rounds,
        started.elapsed().as_secs_f64()
    );
    println!(
        "round  first   bare s  bare CPU   tally s (read)  tally CPU  tally RSS  revoked  rate ×  CPU/event ×"
    );
    let (mut rate, mut cpu) = (Vec::new(), Vec::new());
    let mut threads = Vec::new();
    let (mut read_rate, mut read_cpu) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let tally_first = round % 2 == 1;
        let group = format!("gate-{round}");
        let (bare, tally) = if tally_first {
            let t = run_tally(&bootstrap, &store, &group, args.partitions, per_partition)?;
            (
                run_bare(&bootstrap, &group, args.partitions, events, true)?,
                t,
            )
        } else {
            let b = run_bare(&bootstrap, &group, args.partitions, events, true)?;
            (
                b,
                run_tally(&bootstrap, &store, &group, args.partitions, per_partition)?,
            )
        };
        // Rates over the same events: the ratio of the times. CPU per event: of the CPU.
        threads = tally.threads.clone();
        rate.push(bare.secs / tally.secs);
        cpu.push(tally.cpu / bare.cpu);
        println!(
            "{round:>5}  {:<6} {:>7.2} {:>9.2} {:>9.2} ({:>4.1}) {:>10.2} {:>8.0} MB {:>8} {:>7.2} {:>12.2}",
            if tally_first { "tally" } else { "bare" },
            bare.secs,
            bare.cpu,
            tally.secs,
            tally.read_secs,
            tally.cpu,
            tally.peak_rss_mb,
            tally.revoked,
            rate[round],
            cpu[round],
        );
        if args.read_only {
            let read = run_bare(&bootstrap, &group, args.partitions, events, false)?;
            read_rate.push(bare.secs / read.secs);
            read_cpu.push(read.cpu / bare.cpu);
            println!(
                "       read only (no parse): {:.2} s, CPU {:.2} s: rate {:.2}×, CPU per event {:.2}× the bare consumer's",
                read.secs, read.cpu, read_rate[round], read_cpu[round]
            );
        }
    }
    if args.read_only {
        println!(
            "gate: median read-only/bare rate {:.2}×, CPU per event {:.2}× (the ceiling of any consumer with these settings)",
            median(read_rate),
            median(read_cpu)
        );
    }
    let (rate, cpu) = (median(rate), median(cpu));
    let shown: Vec<String> = threads
        .iter()
        .take(6)
        .map(|(name, secs)| format!("{name} {secs:.2}"))
        .collect();
    println!(
        "tally's CPU by thread, last round (s): {}",
        shown.join(", ")
    );
    println!(
        "gate: median tally/bare rate {rate:.2}× (floor {:.2}), CPU per event {cpu:.2}× (ceiling {:.2}); {:.0} s in all",
        args.min_rate_ratio,
        args.max_cpu_ratio,
        started.elapsed().as_secs_f64()
    );
    broker.finish(Duration::from_secs(10));
    if rate < args.min_rate_ratio {
        bail!(
            "tally end to end fell to {rate:.2}× the bare consumer's rate (floor {:.2}×)",
            args.min_rate_ratio
        );
    }
    if cpu > args.max_cpu_ratio {
        bail!(
            "tally's CPU per event rose to {cpu:.2}× the bare consumer's (ceiling {:.2}×)",
            args.max_cpu_ratio
        );
    }
    Ok(())
}

/// The bare consumer as group `bare-<group>`, from its spawn until its result.
fn run_bare(
    bootstrap: &str,
    group: &str,
    partitions: i32,
    events: i64,
    parse: bool,
) -> anyhow::Result<Run> {
    let t0 = Instant::now();
    let child = ChildRole::spawn(
        &[
            "raw".into(),
            "--brokers".into(),
            bootstrap.into(),
            "--topic".into(),
            TOPIC.into(),
            "--partitions".into(),
            partitions.to_string(),
            "--expect".into(),
            events.to_string(),
            "--group".into(),
            format!("{}-{group}", if parse { "bare" } else { "read" }),
        ]
        .into_iter()
        .chain(parse.then(|| "--parse".to_string()))
        .collect::<Vec<_>>(),
        "gate-bare",
    )?;
    let r: RawResult = child.result(Duration::from_secs(300))?;
    let secs = t0.elapsed().as_secs_f64();
    child.finish(Duration::from_secs(30));
    if r.parse_errors > 0 {
        bail!(
            "the bare consumer could not parse {} messages",
            r.parse_errors
        );
    }
    Ok(Run {
        secs,
        read_secs: secs,
        cpu: r.process_cpu,
        peak_rss_mb: r.peak_rss_mb,
        revoked: 0.0,
        threads: Vec::new(),
    })
}

/// tally as group `group` into a flushed Redis, from its spawn until every partition is applied
/// up to `per_partition`.
fn run_tally(
    bootstrap: &str,
    store: &Store,
    group: &str,
    partitions: i32,
    per_partition: i64,
) -> anyhow::Result<Run> {
    let mut conns = store.connect()?;
    flushall(&mut conns[0])?;
    let port = tally_testkit::local_redis::free_port()?;
    let config =
        std::env::temp_dir().join(format!("tally-gate-{}-{group}.toml", std::process::id()));
    std::fs::write(
        &config,
        config_toml(bootstrap, group, &store.redis_toml(), port),
    )?;
    let t0 = Instant::now();
    let mut child = ChildRole::spawn(
        &[
            "tally".into(),
            "--config".into(),
            config.display().to_string(),
            "--partitions".into(),
            "0".into(),
        ],
        "gate-tally",
    )?;
    let pid = child.pid();
    let mut applied = AppliedOffsets::new(store, group, TOPIC, partitions);
    let mut peak_rss_mb = 0.0_f64;
    let mut polls = 0u32;
    let mut read_secs = None;
    let events = (per_partition * i64::from(partitions)) as f64;
    while !applied.all_at(&mut conns, per_partition)? {
        if t0.elapsed() > Duration::from_secs(300) {
            bail!(
                "tally did not apply every offset within 300 s: {:?}",
                applied.read(&mut conns)?
            );
        }
        if let Ok(Some(status)) = child.child.try_wait() {
            bail!(
                "tally exited early ({status}); its log: {}",
                child.log.display()
            );
        }
        polls += 1;
        if polls.is_multiple_of(10) && read_secs.is_none() {
            let consumed =
                Scrape::get(port).map_or(0.0, |s| s.value("tally_messages_consumed_total"));
            if consumed >= events {
                read_secs = Some(t0.elapsed().as_secs_f64());
            }
        }
        if polls.is_multiple_of(20) {
            peak_rss_mb = peak_rss_mb.max(proc_status_mb(Some(pid), "VmHWM"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = proc_cpu(pid);
    let threads = thread_breakdown(&HashMap::new(), &thread_cpus(pid));
    let revoked = Scrape::get(port).map_or(f64::NAN, |s| {
        s.value("tally_rebalanced_partitions_total{kind=\"revoke\"}")
    });
    peak_rss_mb = peak_rss_mb.max(proc_status_mb(Some(pid), "VmHWM"));
    child.finish(Duration::from_secs(60));
    let _ = std::fs::remove_file(config);
    Ok(Run {
        secs,
        read_secs: read_secs.unwrap_or(secs),
        cpu,
        peak_rss_mb,
        revoked,
        threads,
    })
}

/// The gate's tally: the reference counter of the benchmark, every other setting the default
/// (`kafka.consumers = "auto"`: one lane per core).
fn config_toml(bootstrap: &str, group: &str, redis: &str, port: u16) -> String {
    format!(
        r#"[kafka]
brokers = "{bootstrap}"
topic = "{TOPIC}"
group_id = "{group}"

[redis]
{redis}

[http]
listen = "127.0.0.1:{port}"

[[counters]]
name = "flow"
dimensions = ["app_id", "device_id", "ip"]
key = "flow:count:{{app_id}}:{{device_id}}:{{ip}}:{{yyyyMMddHH}}"
window = "1h"
retention = "2h"
"#
    )
}
