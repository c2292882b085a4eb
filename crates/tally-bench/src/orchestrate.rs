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
use crate::report::report;
use crate::results::{Machine, VariantResults};
use crate::store::Store;
use crate::tally::Ctx;
use crate::{Cli, Variant, VARIANTS};

/// The shapes of part 2 measured besides one lane (the scaling table).
pub const SHAPES: &[Shape] = &[
    Shape {
        replicas: 1,
        lanes: 2,
        merge: true,
    },
    Shape {
        replicas: 2,
        lanes: 1,
        merge: true,
    },
    Shape {
        replicas: 1,
        lanes: 1,
        merge: false,
    },
];

/// How much of everything to run, from the command line.
struct Plan {
    variants: Vec<Variant>,
    partitions: i32,
    per_partition: i64,
    /// Messages per workload (every partition).
    total: u64,
    live_secs: u64,
    live_rate: u64,
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
    let plan = Plan::from_cli(cli)?;
    let started = Instant::now();
    let load_start = load_average();
    eprintln!(
        "tally-bench: {} variants × {} messages over {} partitions; load average {load_start}",
        plan.variants.len(),
        plan.total,
        plan.partitions
    );

    let redis = LocalRedis::start(&[])?;
    let redis_url = redis.url();
    let mut conn = redis_conn(&redis_url)?;
    let server = redis_info(&mut conn, "server")?;
    let broker = start_broker(&plan)?;
    let ctx = Ctx {
        broker_pid: broker.pid(),
        exe_args_partitions: plan.partitions,
        bootstrap: broker.line(Duration::from_secs(30))?,
        redis_url: redis_url.clone(),
        perf: cli.perf.clone(),
        kafka_properties: cli.kafka_properties.clone(),
    };

    produce_workloads(&ctx, cli, &plan)?;
    let mut results = Vec::new();
    for v in &plan.variants {
        results.push(run_variant(&ctx, cli, &plan, v)?);
    }
    let (mem_all, mem_capped) = run_memprobes(plan.partitions)?;
    eprintln!(
        "live latency: {}s at {} events/s",
        plan.live_secs, plan.live_rate
    );
    let latency = phase_latency(&ctx, "bench-live", plan.live_secs, plan.live_rate)?;
    broker.finish(Duration::from_secs(30));

    let machine = Machine {
        cpu: cpu_model(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        redis: server.get("redis_version").cloned().unwrap_or_default(),
        load_start,
        load_end: load_average(),
        secs: started.elapsed().as_secs_f64(),
        quick: cli.quick,
        total: plan.total,
        partitions: plan.partitions,
        compression: cli.compression.clone(),
    };
    report(&machine, &results, &mem_all, &mem_capped, &latency);
    Ok(())
}

impl Plan {
    fn from_cli(cli: &Cli) -> anyhow::Result<Plan> {
        let per_partition = cli
            .per_partition
            .unwrap_or(if cli.quick { 20_000 } else { 120_000 });
        let (live_secs, live_rate) = if cli.quick {
            (10, 20_000)
        } else {
            (30, 20_000)
        };
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
        Ok(Plan {
            variants,
            partitions: cli.partitions,
            per_partition,
            total: per_partition as u64 * cli.partitions as u64,
            live_secs,
            live_rate,
        })
    }
}

/// The mock cluster, with one topic per workload and one for the live latency phase.
fn start_broker(plan: &Plan) -> anyhow::Result<ChildRole> {
    let partitions = plan.partitions;
    let mut topics: Vec<String> = plan
        .variants
        .iter()
        .map(|v| format!("bench-{}:{partitions}", v.name))
        .collect();
    topics.push(format!("bench-live:{partitions}"));
    let mut broker_args = vec!["broker".to_string()];
    for t in &topics {
        broker_args.push("--topic".into());
        broker_args.push(t.clone());
    }
    ChildRole::spawn(&broker_args, "broker")
}

/// Every workload's events, produced before anything is measured.
fn produce_workloads(ctx: &Ctx, cli: &Cli, plan: &Plan) -> anyhow::Result<()> {
    for v in &plan.variants {
        eprintln!(
            "producing {} events for `{}` ({} keys, Zipf s={})",
            plan.total, v.name, v.keys, v.skew
        );
        let rate = produce(
            &ctx.bootstrap,
            &format!("bench-{}", v.name),
            plan.partitions,
            plan.per_partition,
            v,
            &cli.compression,
        )?;
        eprintln!("  {:.0} events/s", rate);
    }
    Ok(())
}

/// Parts 1 to 4 on one workload: raw consume, tally end-to-end (in every shape, and on a
/// cluster with `--cluster`), then the pipeline without Kafka.
fn run_variant(ctx: &Ctx, cli: &Cli, plan: &Plan, v: &Variant) -> anyhow::Result<VariantResults> {
    let topic = format!("bench-{}", v.name);
    eprintln!("[{}] raw consume (read)", v.name);
    let raw_read = run_raw(ctx, &topic, plan.total, false)?;
    eprintln!("[{}] raw consume (read + parse)", v.name);
    let raw_parse = run_raw(ctx, &topic, plan.total, true)?;
    eprintln!("[{}] tally end-to-end", v.name);
    let standalone = Store::standalone(&ctx.redis_url);
    let group = format!("bench-{}", v.name);
    let e2e = phase_e2e(
        ctx,
        &standalone,
        &topic,
        plan.per_partition,
        &group,
        &format!("e2e-{}", v.name),
    )?;
    let scaling = run_shapes(ctx, &standalone, &topic, plan.per_partition, &group, v)?;
    let cluster = if cli.cluster {
        Some(run_cluster(ctx, &topic, plan.per_partition, &group, v)?)
    } else {
        None
    };
    eprintln!(
        "[{}] pipeline without Kafka, per-message baseline, fencing",
        v.name
    );
    let pipe = run_pipeline(ctx, v, plan.total, plan.total.min(1_000_000), cli.cluster)?;
    Ok(VariantResults {
        variant: v.clone(),
        raw_read,
        raw_parse,
        e2e,
        cluster,
        scaling,
        pipe,
    })
}

/// Part 2 again in every shape of `SHAPES`, each in its own consumer group.
fn run_shapes(
    ctx: &Ctx,
    store: &Store,
    topic: &str,
    per_partition: i64,
    group: &str,
    v: &Variant,
) -> anyhow::Result<Vec<(Shape, E2e)>> {
    let mut scaling = Vec::new();
    for &shape in SHAPES {
        let tag = format!(
            "{}x{}{}",
            shape.replicas,
            shape.lanes,
            if shape.merge { "" } else { "-unmerged" }
        );
        eprintln!("[{}] tally end-to-end, {tag}", v.name);
        let e = phase_e2e_shaped(
            ctx,
            store,
            topic,
            per_partition,
            &format!("{group}-{tag}"),
            &format!("e2e-{}-{tag}", v.name),
            shape,
        )?;
        scaling.push((shape, e));
    }
    Ok(scaling)
}

/// Part 2 against a fresh 3-primary cluster, so that it exists only while it is measured.
fn run_cluster(
    ctx: &Ctx,
    topic: &str,
    per_partition: i64,
    group: &str,
    v: &Variant,
) -> anyhow::Result<E2e> {
    eprintln!("[{}] tally end-to-end, 3-primary cluster", v.name);
    let nodes = LocalCluster::start(3, 0).context("starting a local redis cluster")?;
    let store = Store::cluster(&nodes)?;
    phase_e2e(
        ctx,
        &store,
        topic,
        per_partition,
        &format!("{group}-cluster"),
        &format!("e2e-{}-cluster", v.name),
    )
}

/// The memory probe with 1,000,000 pending keys: all flushed at once, then one capped flush.
fn run_memprobes(partitions: i32) -> anyhow::Result<(MemResult, MemResult)> {
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
    let capped = mem.pop().expect("two probes");
    let all = mem.pop().expect("two probes");
    Ok((all, capped))
}

/// The CPU's model name from /proc/cpuinfo (empty if unknown).
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
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
        .unwrap_or_default()
}
