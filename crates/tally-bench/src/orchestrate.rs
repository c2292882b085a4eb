//! The parent process: starts the broker and Redis, produces the workloads, runs every part in
//! its own child process, and prints the report.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use tally_testkit::local_redis::{LocalCluster, LocalRedis};

use crate::broker::produce;
use crate::child::{ChildRole, Perf};
use crate::e2e::{phase_e2e, phase_e2e_shaped, E2e, Shape};
use crate::latency::phase_latency;
use crate::memprobe::MemResult;
use crate::pipeline::PipelineResult;
use crate::proc_stats::{load_average, proc_cpu};
use crate::raw::RawResult;
use crate::redis_stats::{redis_conn, redis_info};
use crate::report::{report, Machine};
use crate::store::Store;
use crate::tally::Ctx;
use crate::{Cli, Variant, VARIANTS};

pub struct VariantResults {
    pub variant: Variant,
    pub raw_read: RawResult,
    pub raw_parse: RawResult,
    pub e2e: E2e,
    /// Part 2 against a 3-primary cluster (`--cluster`).
    pub cluster: Option<E2e>,
    /// Part 2 with more lanes or replicas (`report_scaling::SHAPES`).
    pub scaling: Vec<(Shape, E2e)>,
    pub pipe: PipelineResult,
}

pub fn run_raw(ctx: &Ctx, topic: &str, expect: u64, parse: bool) -> anyhow::Result<RawResult> {
    let mut args = vec![
        "raw".to_string(),
        "--brokers".into(),
        ctx.bootstrap.clone(),
        "--topic".into(),
        topic.into(),
        "--partitions".into(),
        ctx.exe_args_partitions.to_string(),
        "--expect".into(),
        expect.to_string(),
    ];
    if parse {
        args.push("--parse".into());
    }
    for p in &ctx.kafka_properties {
        args.push("--property".into());
        args.push(p.clone());
    }
    let broker0 = proc_cpu(ctx.broker_pid);
    let child = ChildRole::spawn(&args, "raw")?;
    let mut r: RawResult = child.result(Duration::from_secs(600))?;
    r.broker_cpu = proc_cpu(ctx.broker_pid) - broker0;
    child.finish(Duration::from_secs(30));
    if parse && r.parse_errors > 0 {
        bail!("raw consumer could not parse {} messages", r.parse_errors);
    }
    Ok(r)
}

/// Parts 3 and 4 and the fencing cost; `cluster_layout`: part 3 also with the cluster layout.
pub fn run_pipeline(
    ctx: &Ctx,
    v: &Variant,
    messages: u64,
    baseline: u64,
    cluster_layout: bool,
) -> anyhow::Result<PipelineResult> {
    let mut args = vec![
        "pipeline".to_string(),
        "--redis-url".into(),
        ctx.redis_url.clone(),
        "--keys".into(),
        v.keys.to_string(),
        "--skew".into(),
        v.skew.to_string(),
        "--seed".into(),
        v.seed.to_string(),
        "--partitions".into(),
        ctx.exe_args_partitions.to_string(),
        "--messages".into(),
        messages.to_string(),
        "--baseline-messages".into(),
        baseline.to_string(),
    ];
    if cluster_layout {
        args.push("--cluster-layout".into());
    }
    let child = ChildRole::spawn(&args, &format!("pipeline-{}", v.name))?;
    let perf = Perf::attach(
        ctx.perf.as_deref(),
        child.pid(),
        &format!("pipeline-{}", v.name),
    );
    let r: PipelineResult = child.result(Duration::from_secs(1200))?;
    perf.stop();
    child.finish(Duration::from_secs(30));
    Ok(r)
}

pub fn orchestrate(cli: &Cli) -> anyhow::Result<()> {
    let per_partition = cli
        .per_partition
        .unwrap_or(if cli.quick { 20_000 } else { 120_000 });
    let (live_secs, live_rate) = if cli.quick {
        (10, 20_000)
    } else {
        (30, 20_000)
    };
    let partitions = cli.partitions;
    let total = per_partition as u64 * partitions as u64;
    let variants: Vec<Variant> = cli
        .variants
        .split(',')
        .filter(|name| !name.trim().is_empty())
        .map(|name| {
            VARIANTS
                .iter()
                .find(|v| v.name == name.trim())
                .cloned()
                .with_context(|| format!("unknown variant `{name}` (main, hot, cold)"))
        })
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    let load_start = load_average();
    eprintln!("tally-bench: {} variants × {total} messages over {partitions} partitions; load average {load_start}", variants.len());

    let redis = LocalRedis::start(&[])?;
    let redis_url = redis.url();
    let mut conn = redis_conn(&redis_url)?;
    let server = redis_info(&mut conn, "server")?;
    let mut topics: Vec<String> = variants
        .iter()
        .map(|v| format!("bench-{}:{partitions}", v.name))
        .collect();
    topics.push(format!("bench-live:{partitions}"));
    let mut broker_args = vec!["broker".to_string()];
    for t in &topics {
        broker_args.push("--topic".into());
        broker_args.push(t.clone());
    }
    let broker = ChildRole::spawn(&broker_args, "broker")?;
    let bootstrap = broker.line(Duration::from_secs(30))?;
    let ctx = Ctx {
        broker_pid: broker.pid(),
        exe_args_partitions: partitions,
        bootstrap,
        redis_url: redis_url.clone(),
        perf: cli.perf.clone(),
        kafka_properties: cli.kafka_properties.clone(),
    };

    let mut results = Vec::new();
    for v in &variants {
        eprintln!(
            "producing {total} events for `{}` ({} keys, Zipf s={})",
            v.name, v.keys, v.skew
        );
        let rate = produce(
            &ctx.bootstrap,
            &format!("bench-{}", v.name),
            partitions,
            per_partition,
            v,
            &cli.compression,
        )?;
        eprintln!("  {:.0} events/s", rate);
    }
    for v in &variants {
        let topic = format!("bench-{}", v.name);
        eprintln!("[{}] raw consume (read)", v.name);
        let raw_read = run_raw(&ctx, &topic, total, false)?;
        eprintln!("[{}] raw consume (read + parse)", v.name);
        let raw_parse = run_raw(&ctx, &topic, total, true)?;
        eprintln!("[{}] tally end-to-end", v.name);
        let standalone = Store::standalone(&ctx.redis_url);
        let group = format!("bench-{}", v.name);
        let e2e = phase_e2e(
            &ctx,
            &standalone,
            &topic,
            per_partition,
            &group,
            &format!("e2e-{}", v.name),
        )?;
        let mut scaling = Vec::new();
        for &shape in crate::report_scaling::SHAPES {
            let tag = format!(
                "{}x{}{}",
                shape.replicas,
                shape.lanes,
                if shape.merge { "" } else { "-unmerged" }
            );
            eprintln!("[{}] tally end-to-end, {tag}", v.name);
            let e = phase_e2e_shaped(
                &ctx,
                &standalone,
                &topic,
                per_partition,
                &format!("{group}-{tag}"),
                &format!("e2e-{}-{tag}", v.name),
                shape,
            )?;
            scaling.push((shape, e));
        }
        let cluster = if cli.cluster {
            eprintln!("[{}] tally end-to-end, 3-primary cluster", v.name);
            // A fresh cluster per workload, so that it exists only while it is measured.
            let nodes = LocalCluster::start(3, 0).context("starting a local redis cluster")?;
            let store = Store::cluster(&nodes)?;
            Some(phase_e2e(
                &ctx,
                &store,
                &topic,
                per_partition,
                &format!("{group}-cluster"),
                &format!("e2e-{}-cluster", v.name),
            )?)
        } else {
            None
        };
        eprintln!(
            "[{}] pipeline without Kafka, per-message baseline, fencing",
            v.name
        );
        let pipe = run_pipeline(&ctx, v, total, total.min(1_000_000), cli.cluster)?;
        results.push(VariantResults {
            variant: v.clone(),
            raw_read,
            raw_parse,
            e2e,
            cluster,
            scaling,
            pipe,
        });
    }
    eprintln!("memory probe: 1,000,000 pending keys");
    let mut mem = Vec::new();
    for capped in [false, true] {
        let mut args = vec![
            "memprobe".to_string(),
            "--keys".into(),
            "1000000".into(),
            "--partitions".into(),
            partitions.to_string(),
        ];
        if capped {
            args.push("--capped".into());
        }
        let probe = ChildRole::spawn(&args, "memprobe")?;
        let r: MemResult = probe.result(Duration::from_secs(300))?;
        probe.finish(Duration::from_secs(30));
        mem.push(r);
    }
    let (mem_all, mem_capped) = (&mem[0], &mem[1]);
    eprintln!("live latency: {live_secs}s at {live_rate} events/s");
    let latency = phase_latency(&ctx, "bench-live", live_secs, live_rate)?;
    broker.finish(Duration::from_secs(30));

    let machine = Machine {
        cpu: std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    Some(
                        l.strip_prefix("model name")?
                            .trim_start_matches([' ', '\t', ':'])
                            .to_string(),
                    )
                })
            })
            .unwrap_or_default(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        redis: server.get("redis_version").cloned().unwrap_or_default(),
        load_start,
        load_end: load_average(),
        secs: started.elapsed().as_secs_f64(),
        quick: cli.quick,
        total,
        partitions,
        compression: cli.compression.clone(),
    };
    report(&machine, &results, mem_all, mem_capped, &latency);
    Ok(())
}
