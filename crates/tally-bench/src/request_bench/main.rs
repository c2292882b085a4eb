//! `tally-request-bench`: the request path's speed, side by side in one run on one redis-server
//! (and with `--cluster` a local 3-primary cluster):
//!
//! ```sh
//! cargo run --release -p tally-bench --bin tally-request-bench -- [--quick] [--cluster]
//! ```
//!
//! 1. **Ceiling**: `redis-benchmark` INCR on the same server (no pipelining, 50 clients; and
//!    pipelined ×16), what Redis itself does with the simplest write.
//!    And `redis-benchmark -P 16 EVALSHA` of the limit script, one decision per call beside its
//!    batch script with 8 and 32 decisions per call (decisions/s, Redis CPU per decision).
//! 2. **Library**: `tally_counters::request` called by many concurrent tasks over one
//!    multiplexed connection (auto-pipelined), per primitive: decisions/s, p50/p99; each limit row
//!    with every decision sent alone and batched (group commit), side by side.
//! 3. **HTTP**: `tally serve`'s router (in this process) driven by `wrk` over loopback keep-alive
//!    connections: requests/s, p50/p99.
//!
//! Subjects are drawn from 10,000 so a limiter is not one hot key; a quota is one key by nature.

#[path = "../alloc_switch.rs"]
mod alloc_switch;
mod ceiling;
mod library;
mod wrk;

use std::time::Duration;

use clap::Parser;
use tally_testkit::local_redis::{LocalCluster, LocalRedis};

#[derive(Parser)]
#[command(name = "tally-request-bench", about = "The request path's benchmark")]
struct Cli {
    /// Shorter phases (about 1 s each).
    #[arg(long)]
    quick: bool,
    /// Also run the library part against a local Redis Cluster of 3 primaries.
    #[arg(long)]
    cluster: bool,
    /// Concurrent callers of the library.
    #[arg(long, default_value_t = 256)]
    tasks: usize,
    /// Most limit decisions sent as one script call (group commit) in the "batched" rows; each
    /// limit row is also run with every call alone, side by side.
    #[arg(long, default_value_t = 32)]
    batch_max: usize,
    /// Script calls in flight before further decisions queue and batch.
    #[arg(long, default_value_t = 4)]
    batch_in_flight: usize,
    /// wrk connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
}

/// jemalloc, as `tally` (or glibc's malloc: `TALLY_BENCH_ALLOCATOR=system`).
#[global_allocator]
static ALLOCATOR: alloc_switch::Switch = alloc_switch::Switch;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let phase = if cli.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(4)
    };
    let redis = LocalRedis::start(&[])?;
    println!("# tally request-path benchmark\n");
    println!(
        "{} cores; phases of {:?}; {} library tasks; {} wrk connections\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        phase,
        cli.tasks,
        cli.connections
    );
    println!("## Ceiling: redis-benchmark INCR on the same server\n");
    for (label, args) in [
        ("50 clients, no pipelining", vec!["-c", "50"]),
        ("16 clients, pipeline 16", vec!["-c", "16", "-P", "16"]),
    ] {
        println!(
            "- {label}: {:.0} ops/s",
            redis_benchmark(redis.port, &args)?
        );
    }
    println!("\n## Ceiling of the limit script: one decision per EVALSHA vs a batch\n");
    ceiling::run(&redis)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let batching = tally_counters::request::Batching {
        max_calls: cli.batch_max,
        in_flight: cli.batch_in_flight,
    };
    let standalone = library::Target::standalone(&redis);
    println!("\n## Library (`tally_counters::request`), standalone\n");
    runtime.block_on(library::run(&standalone, cli.tasks, phase, batching))?;
    let cluster = if cli.cluster {
        let cluster = LocalCluster::start(3, 0)?;
        println!("\n## Library, 3-primary cluster\n");
        runtime.block_on(library::run(
            &library::Target::cluster(&cluster),
            cli.tasks,
            phase,
            batching,
        ))?;
        Some(cluster)
    } else {
        None
    };
    println!("\n## HTTP (`tally serve` router, wrk, loopback)\n");
    runtime.block_on(wrk::run(&redis, cli.connections, phase))?;
    if let Some(cluster) = &cluster {
        println!("\n## Batch queries, 3-primary cluster");
        runtime.block_on(wrk::batch_on_cluster(cluster, phase))?;
    }
    Ok(())
}

/// INCR ops/s from `redis-benchmark -q` with `args`.
fn redis_benchmark(port: u16, args: &[&str]) -> anyhow::Result<f64> {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", "incr", "-n", "400000", "-q"])
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "INCR: 123456.79 requests per second, p50=0.2 msec" (possibly after \r progress lines)
    text.rsplit('\r')
        .flat_map(|s| s.lines())
        .find_map(|l| {
            let rest = l.trim().strip_prefix("INCR: ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .ok_or_else(|| anyhow::anyhow!("redis-benchmark said: {text}"))
}
