//! `tally-bench`: the project benchmark. One command, one run, every figure side by side:
//!
//! ```sh
//! cargo run --release --bin tally-bench -- [--quick]
//! ```
//!
//! 1. **Raw consume**: a plain rdkafka `BaseConsumer` that only reads the topic, and one that reads
//!    and `serde_json`-parses every message (the limit tally is held against).
//! 2. **tally end-to-end**: `tally::app::Tally` consuming the same topic into a real
//!    `redis-server`, from partition assignment until every applied offset in Redis equals the
//!    end offset.
//! 3. **Pipeline without Kafka**: the real `Decoder` and `Aggregator` fed from memory on one
//!    thread; then the same with flushes through tally's Lua script to Redis.
//! 4. **Per-message baseline**: one pipelined Lua INCRBY + PEXPIREAT call per event.
//!
//! Plus the cost of fencing (the exactly-once compare-and-set), the memory of 1,000,000 pending
//! keys, and event-to-visible latency with tally running live.
//!
//! Every measured component runs in its own process (this binary re-executed in a hidden role),
//! so CPU time and peak RSS are per process: the broker (librdkafka's mock cluster) never counts
//! against the consumer it serves. Methods and results: `docs/lab/benchmarks.md`.
//!
//! With `--cluster`, part 2 also runs against a local Redis Cluster of 3 primaries, and the
//! report puts both side by side.
//!
//! Layout: `main.rs` (command line, workloads, the benchmark's tally config) → `orchestrate.rs`
//! (the parent: starts the broker and Redis, runs every part, collects results) → `report/`
//! (the Markdown tables and the targets) → `results.rs` (what a run measured, which both of them
//! read). One file per role: `broker.rs`, `raw.rs`, `tally.rs` (+ `e2e.rs`, `latency.rs`, which
//! drive it), `pipeline.rs` (+ `pipeline_loop.rs`), `memprobe.rs`; `store.rs` is where part 2
//! writes (one server or a cluster); shared measurement helpers in `child.rs`, `proc_stats.rs`
//! and `redis_stats.rs`.

mod alloc_switch;
mod broker;
mod child;
mod e2e;
mod events_bench;
mod gate;
mod latency;
mod memprobe;
mod orchestrate;
mod outputs;
mod pipeline;
mod pipeline_loop;
mod proc_stats;
mod raw;
mod redis_stats;
mod report;
mod results;
mod store;
mod tally;

/// jemalloc, as `tally` (or glibc's malloc: `TALLY_BENCH_ALLOCATOR=system`).
#[global_allocator]
static ALLOCATOR: alloc_switch::Switch = alloc_switch::Switch;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tally-bench",
    about = "tally's benchmark: the stream path against a bare consumer, the request path, the RLS port"
)]
pub struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    /// Fewer messages, shorter latency phase: the whole run in under two minutes.
    #[arg(long)]
    quick: bool,
    /// Partitions of each topic.
    #[arg(long, default_value_t = 16)]
    partitions: i32,
    /// Messages per partition (default 120,000, or 20,000 with --quick). The mock broker keeps
    /// 5 MiB per partition: about 45,000 of these events uncompressed, 150,000 with lz4.
    #[arg(long)]
    per_partition: Option<i64>,
    /// Producer compression (`none`, `lz4`, …). lz4 lets the mock broker's 5 MiB per partition
    /// hold about 4× more events; consumers then decompress.
    #[arg(long, default_value = "lz4")]
    compression: String,
    /// Workloads to run, comma-separated: main, hot, cold.
    #[arg(long, default_value = "main,hot,cold")]
    variants: String,
    /// Record `perf` profiles of the tally processes and the pipeline into this directory.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Also run part 2 (tally end-to-end) against a local Redis Cluster of 3 primaries without
    /// replicas (`redis.mode = "cluster"`, default `cluster_shards`), right after the standalone
    /// run of each workload, and print both side by side.
    #[arg(long)]
    cluster: bool,
    /// A librdkafka property (`key=value`, repeatable) set on the raw consumers and on tally's
    /// end-to-end runs, over tally's defaults: to measure a client setting before and after.
    #[arg(long = "kafka-property")]
    kafka_properties: Vec<String>,
}

/// Hidden roles: this binary re-executed to run one measured component in its own process.
#[derive(Subcommand)]
pub enum Role {
    /// librdkafka's mock cluster with the given topics (name:partitions) until stdin closes.
    #[command(hide = true)]
    Broker {
        #[arg(long = "topic")]
        topics: Vec<String>,
    },
    /// A plain BaseConsumer reading (and optionally parsing) `expect` messages.
    #[command(hide = true)]
    Raw {
        #[arg(long)]
        brokers: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partitions: i32,
        #[arg(long)]
        expect: u64,
        #[arg(long)]
        parse: bool,
        /// Join this consumer group (`subscribe`) instead of assigning every partition.
        #[arg(long)]
        group: Option<String>,
        /// `key=value` librdkafka properties over tally's client settings.
        #[arg(long = "property")]
        properties: Vec<String>,
    },
    /// `tally::app::Tally` with a config file, until stdin closes.
    #[command(hide = true)]
    Tally {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        partitions: i64,
    },
    /// Parts 3 and 4 and the fencing cost, fed from memory.
    #[command(hide = true)]
    Pipeline(PipelineArgs),
    /// What reading events as users write them costs the consumer loop: nested JSON through
    /// `[decode.fields]`, and CEL counter filters (`docs/lab/benchmarks.md`).
    Events(Rounds),
    /// The benchmark gate of CI: tally end to end against a bare consumer, from process start,
    /// alternating rounds; fails below the given floors (`gate.rs`).
    Gate(gate::GateArgs),
    /// The stream-side cost of window results: decode → aggregate → flush with the
    /// counter's `output` off and on, alternating rounds (`docs/lab/benchmarks.md`).
    Outputs(Rounds),
    /// RSS of the aggregator holding `keys` distinct pending keys.
    #[command(hide = true)]
    Memprobe {
        #[arg(long)]
        keys: u64,
        #[arg(long)]
        partitions: i32,
        /// Flush only `flush.max_keys` of them, as a regular flush does (default: all at once,
        /// as on revoke and shutdown).
        #[arg(long)]
        capped: bool,
        /// Encode the whole flush at once, as the sink did before bounded encoding (to compare).
        #[arg(long)]
        whole: bool,
    },
}

/// The in-memory comparisons' workload: the same generated messages for every variant, rounds
/// alternating between them.
#[derive(clap::Args, Clone)]
pub struct Rounds {
    /// Messages per round.
    #[arg(long, default_value_t = 2_000_000)]
    messages: u64,
    /// Distinct keys the messages are spread over.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    #[arg(long, default_value_t = 16)]
    partitions: i32,
    /// Rounds (every variant once per round).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

#[derive(clap::Args, Clone)]
pub struct PipelineArgs {
    #[arg(long)]
    redis_url: String,
    #[arg(long)]
    keys: u64,
    #[arg(long)]
    skew: f64,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    partitions: i32,
    #[arg(long)]
    messages: u64,
    /// Messages written by the per-message baseline.
    #[arg(long)]
    baseline_messages: u64,
    /// Only the in-memory decode → aggregate loop (for profiling), repeated this many times.
    #[arg(long)]
    only_aggregate: Option<u32>,
    /// Also run the in-memory loop with the Redis Cluster key layout (default cluster_shards).
    #[arg(long)]
    cluster_layout: bool,
    /// With --only-aggregate: also run the loop feeding each sealed batch to the status page's
    /// heavy-hitters summary of this many keys, alternating with runs without it.
    #[arg(long)]
    hot_keys: Option<usize>,
}

/// One workload: key cardinality and skew.
#[derive(Clone)]
pub struct Variant {
    name: &'static str,
    keys: u64,
    skew: f64,
    seed: u64,
}

pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "main",
        keys: 100_000,
        skew: 1.0,
        seed: 1,
    },
    Variant {
        name: "hot",
        keys: 10,
        skew: 1.0,
        seed: 2,
    },
    Variant {
        name: "cold",
        keys: 1_000_000,
        skew: 0.0,
        seed: 3,
    },
];

/// The benchmark's tally configuration: the reference counter, with 2 h retention so that no
/// event becomes late if the run crosses an hour boundary. Everything else is the default.
/// `redis` is the body of the `[redis]` section (`Store::redis_toml`).
pub fn config_toml(
    brokers: &str,
    topic: &str,
    group: &str,
    redis: &str,
    listen: &str,
    kafka_properties: &str,
    share: crate::tally::Share,
) -> String {
    let lanes = share.lanes;
    let merged_keys = if share.merge { 4_000 } else { 0 };
    format!(
        r#"[kafka]
brokers = "{brokers}"
topic = "{topic}"
group_id = "{group}"
consumers = {lanes}

[kafka.properties]
{kafka_properties}

[redis]
{redis}

[http]
listen = "{listen}"

[flush]
max_keys_per_merged_call = {merged_keys}

[[counters]]
name = "flow"
dimensions = ["app_id", "device_id", "ip"]
key = "flow:count:{{app_id}}:{{device_id}}:{{ip}}:{{yyyyMMddHH}}"
window = "1h"
retention = "2h"
"#
    )
}

pub const COUNTER_PATTERN: &str = "flow:count:*";

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.role {
        None => orchestrate::orchestrate(&cli),
        Some(Role::Broker { topics }) => broker::role_broker(&topics),
        Some(Role::Raw {
            brokers,
            topic,
            partitions,
            expect,
            parse,
            group,
            properties,
        }) => raw::role_raw(
            &brokers,
            &topic,
            partitions,
            expect,
            parse,
            group.as_deref(),
            &properties,
        ),
        Some(Role::Tally { config, partitions }) => tally::role_tally(&config, partitions),
        Some(Role::Pipeline(args)) => pipeline::role_pipeline(&args),
        Some(Role::Memprobe {
            keys,
            partitions,
            capped,
            whole,
        }) => memprobe::role_memprobe(keys, partitions, capped, whole),
        Some(Role::Outputs(r)) => outputs::role_outputs(r.messages, r.keys, r.partitions, r.rounds),
        Some(Role::Gate(args)) => gate::role_gate(&args),
        Some(Role::Events(r)) => {
            events_bench::role_events(r.messages, r.keys, r.partitions, r.rounds)
        }
    }
}
