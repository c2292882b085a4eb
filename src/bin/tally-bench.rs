//! `tally-bench`: the benchmark of issue 5. One command, one run, every figure side by side:
//!
//! ```sh
//! cargo run --release --bin tally-bench -- [--quick]
//! ```
//!
//! 1. **Raw consume**: a plain rdkafka `BaseConsumer` that only reads the topic, and one that reads
//!    and `serde_json`-parses every message (the limit tally is held against).
//! 2. **tally end-to-end**: `tally::pipeline::Tally` consuming the same topic into a real
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
//! against the consumer it serves. Methods and results: `docs/benchmarks.md`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use tally::aggregate::{Aggregator, Unit};
use tally::config::Config;
use tally::gen::EventGen;
use tally::local_redis::LocalRedis;
use tally::pipeline::{build_stages, kafka_client_config, Tally};
use tally::sink::script::{apply_cmd, APPLY_LUA};

#[derive(Parser)]
#[command(name = "tally-bench", about = "tally's benchmark (issue 5)")]
struct Cli {
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
}

/// Hidden roles: this binary re-executed to run one measured component in its own process.
#[derive(Subcommand)]
enum Role {
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
    },
    /// `tally::pipeline::Tally` with a config file, until stdin closes.
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
    /// RSS of the aggregator holding `keys` distinct pending keys.
    #[command(hide = true)]
    Memprobe {
        #[arg(long)]
        keys: u64,
        #[arg(long)]
        partitions: i32,
    },
}

#[derive(clap::Args, Clone)]
struct PipelineArgs {
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
}

/// One workload: key cardinality and skew.
#[derive(Clone)]
struct Variant {
    name: &'static str,
    keys: u64,
    skew: f64,
    seed: u64,
}

const VARIANTS: &[Variant] = &[
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
fn config_toml(
    brokers: &str,
    topic: &str,
    group: &str,
    redis_url: &str,
    listen: &str,
    kafka_properties: &str,
) -> String {
    format!(
        r#"[kafka]
brokers = "{brokers}"
topic = "{topic}"
group_id = "{group}"

[kafka.properties]
{kafka_properties}

[redis]
url = "{redis_url}"

[http]
listen = "{listen}"

[[counters]]
name = "flow"
dimensions = ["app_id", "device_id", "ip"]
key = "flow:count:{{app_id}}:{{device_id}}:{{ip}}:{{yyyyMMddHH}}"
window = "1h"
retention = "2h"
"#
    )
}

const COUNTER_PATTERN: &str = "flow:count:*";

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.role {
        None => orchestrate(&cli),
        Some(Role::Broker { topics }) => role_broker(&topics),
        Some(Role::Raw {
            brokers,
            topic,
            partitions,
            expect,
            parse,
        }) => role_raw(&brokers, &topic, partitions, expect, parse),
        Some(Role::Tally { config, partitions }) => role_tally(&config, partitions),
        Some(Role::Pipeline(args)) => role_pipeline(&args),
        Some(Role::Memprobe { keys, partitions }) => role_memprobe(keys, partitions),
    }
}

// ---------------------------------------------------------------------------------------------
// Measurement helpers

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn unix_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// user+sys CPU seconds of this process (all threads).
fn cpu_self() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds of the calling thread.
fn cpu_thread() -> f64 {
    // SAFETY: clock_gettime only writes into the struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no memory effects.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// user+sys CPU seconds from a `/proc/.../stat` file (process or thread).
fn stat_cpu(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Exact CPU time of a thread in seconds (`se.sum_exec_runtime`, kept by the scheduler in ns;
/// `/proc/.../stat` only has 10 ms ticks).
fn thread_runtime(pid: u32, tid: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/sched")).ok()?;
    let ms: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("se.sum_exec_runtime"))?
        .trim_start_matches([' ', ':'])
        .trim()
        .parse()
        .ok()?;
    Some(ms / 1e3)
}

fn proc_cpu(pid: u32) -> f64 {
    stat_cpu(Path::new(&format!("/proc/{pid}/stat"))).unwrap_or(f64::NAN)
}

/// A `kB` field of `/proc/<pid>/status` (VmHWM, VmRSS), in MB.
fn proc_status_mb(pid: Option<u32>, field: &str) -> f64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU seconds of every thread of `pid`, by thread id, with its name.
fn thread_cpus(pid: u32) -> HashMap<String, (String, f64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for entry in dir.flatten() {
        let tid = entry.file_name().to_string_lossy().to_string();
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if let Some(cpu) = stat_cpu(&entry.path().join("stat")) {
            out.insert(tid, (comm.trim().to_string(), cpu));
        }
    }
    out
}

/// CPU used between two snapshots, summed by thread name (digits folded: `rdk:broker1` →
/// `rdk:broker#`), largest first.
fn thread_breakdown(
    before: &HashMap<String, (String, f64)>,
    after: &HashMap<String, (String, f64)>,
) -> Vec<(String, f64)> {
    let mut by_name: HashMap<String, f64> = HashMap::new();
    for (tid, (name, cpu)) in after {
        let start = before.get(tid).map_or(0.0, |b| b.1);
        let folded: String = name
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        let folded = folded.replace("##", "#");
        *by_name.entry(folded).or_default() += cpu - start;
    }
    let mut v: Vec<(String, f64)> = by_name.into_iter().filter(|(_, c)| *c > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// This binary running one role in a child process. Killed on drop if still running.
struct ChildRole {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
}

impl ChildRole {
    fn spawn(args: &[String], name: &str) -> anyhow::Result<ChildRole> {
        let log =
            std::env::temp_dir().join(format!("tally-bench-{}-{name}.log", std::process::id()));
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .env("TALLY_LOG", "warn,librdkafka=error,rdkafka=error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawning a benchmark role")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(ChildRole { child, lines, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, or an error carrying the end of the child's log.
    fn line(&self, timeout: Duration) -> anyhow::Result<String> {
        self.lines.recv_timeout(timeout).map_err(|_| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(2000)
                .collect::<String>()
                .chars()
                .rev()
                .collect();
            anyhow::anyhow!("benchmark child gave no answer within {timeout:?}; log:\n{tail}")
        })
    }

    fn result<T: for<'de> Deserialize<'de>>(&self, timeout: Duration) -> anyhow::Result<T> {
        let line = self.line(timeout)?;
        serde_json::from_str(&line).with_context(|| format!("child output `{line}`"))
    }

    /// Close stdin (the child's signal to stop) and wait for it to exit.
    fn finish(mut self, timeout: Duration) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("  child {} did not stop in time; killing it", self.pid());
    }
}

impl Drop for ChildRole {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Block until stdin is closed (the parent's signal to stop).
fn wait_for_stdin_eof() {
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
}

/// `perf record` attached to a process, stopped with SIGINT.
struct Perf(Option<Child>);

impl Perf {
    fn attach(dir: Option<&Path>, pid: u32, name: &str) -> Perf {
        let Some(dir) = dir else { return Perf(None) };
        let _ = std::fs::create_dir_all(dir);
        let out = dir.join(format!("{name}.perf.data"));
        let child = Command::new("perf")
            .args(["record", "-F", "1999", "--call-graph", "dwarf,16384", "-o"])
            .arg(&out)
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| eprintln!("  perf unavailable: {e}"))
            .ok();
        Perf(child)
    }

    fn stop(mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis helpers

fn redis_conn(url: &str) -> anyhow::Result<redis::Connection> {
    Ok(redis::Client::open(url)?.get_connection()?)
}

/// `INFO <section>` as key → value.
fn redis_info(
    conn: &mut redis::Connection,
    section: &str,
) -> anyhow::Result<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(conn)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// What Redis did between two snapshots.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct RedisWork {
    /// total_commands_processed (top-level commands; see `calls`).
    commands: f64,
    /// Calls per command name (commandstats), including commands run inside scripts.
    calls: HashMap<String, f64>,
    /// used_cpu_user + used_cpu_sys of the server.
    cpu: f64,
}

#[derive(Debug, Clone)]
struct RedisSnapshot {
    commands: f64,
    calls: HashMap<String, f64>,
    cpu: f64,
}

fn redis_snapshot(conn: &mut redis::Connection) -> anyhow::Result<RedisSnapshot> {
    let stats = redis_info(conn, "stats")?;
    let cpu = redis_info(conn, "cpu")?;
    let cmds = redis_info(conn, "commandstats")?;
    let num = |m: &HashMap<String, String>, k: &str| {
        m.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
    };
    let calls = cmds
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?;
            let calls = v
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect();
    Ok(RedisSnapshot {
        commands: num(&stats, "total_commands_processed"),
        calls,
        cpu: num(&cpu, "used_cpu_user") + num(&cpu, "used_cpu_sys"),
    })
}

impl RedisSnapshot {
    /// Work done since `self`, minus `own` top-level commands the benchmark itself sent
    /// (including the INFO calls of the snapshot).
    fn work_until(&self, after: &RedisSnapshot, own: f64) -> RedisWork {
        let mut calls = HashMap::new();
        for (k, v) in &after.calls {
            let d = v - self.calls.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                calls.insert(k.clone(), d);
            }
        }
        RedisWork {
            commands: after.commands - self.commands - own,
            calls,
            cpu: after.cpu - self.cpu,
        }
    }
}

impl RedisWork {
    fn calls_of(&self, name: &str) -> f64 {
        self.calls.get(name).copied().unwrap_or(0.0)
    }

    /// Commands executed inside scripts (commandstats of the data commands the scripts use;
    /// the benchmark sends none of these itself while measuring).
    fn script_inner(&self) -> f64 {
        [
            "get",
            "set",
            "time",
            "incrby",
            "pttl",
            "pexpireat",
            "expireat",
        ]
        .iter()
        .map(|c| self.calls_of(c))
        .sum()
    }

    /// Commands clients sent (Redis' total_commands_processed also counts those run by scripts).
    fn top_level(&self) -> f64 {
        self.commands - self.script_inner()
    }
}

fn flushall(conn: &mut redis::Connection) -> anyhow::Result<()> {
    redis::cmd("FLUSHALL").query::<()>(conn)?;
    Ok(())
}

/// (number of counter keys, sum of their values), by SCAN: to check the benchmark did the work.
fn sum_counters(conn: &mut redis::Connection) -> anyhow::Result<(u64, i64)> {
    let (mut cursor, mut keys_seen, mut sum) = (0u64, 0u64, 0i64);
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(COUNTER_PATTERN)
            .arg("COUNT")
            .arg(5000)
            .query(conn)?;
        if !keys.is_empty() {
            let values: Vec<Option<i64>> = redis::cmd("MGET").arg(&keys).query(conn)?;
            keys_seen += keys.len() as u64;
            sum += values.into_iter().flatten().sum::<i64>();
        }
        cursor = next;
        if cursor == 0 {
            return Ok((keys_seen, sum));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Role: broker

fn role_broker(topics: &[String]) -> anyhow::Result<()> {
    let mock = rdkafka::mocking::MockCluster::new(1).context("mock cluster")?;
    for t in topics {
        let (name, parts) = t.split_once(':').context("topic is name:partitions")?;
        mock.create_topic(name, parts.parse()?, 1)?;
    }
    println!("{}", mock.bootstrap_servers());
    std::io::stdout().flush()?;
    wait_for_stdin_eof();
    Ok(())
}

/// Produce `per_partition` events to every partition of `topic` (round-robin, no key: each
/// key's events are spread over all partitions, the harder case for pre-aggregation).
///
/// Batches are made as large as librdkafka allows (1 MB): the mock broker answers a fetch with
/// one stored batch per partition, where a real broker returns up to `max.partition.fetch.bytes`
/// (1 MiB); with 1 MB batches both hand the consumer the same amount per fetch.
fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    per_partition: i64,
    v: &Variant,
    compression: &str,
) -> anyhow::Result<f64> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "200")
        .set("compression.type", compression)
        .set("batch.size", "1000000")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .context("producer")?;
    let mut gen = EventGen::new(v.keys, v.skew, v.seed);
    let mut buf = Vec::with_capacity(128);
    let total = per_partition * i64::from(partitions);
    let started = Instant::now();
    let mut now = unix_ms();
    for i in 0..total {
        if i % 1024 == 0 {
            now = unix_ms();
            producer.poll(Duration::ZERO);
        }
        EventGen::write_json(&mut buf, gen.next_key(), now);
        let partition = (i % i64::from(partitions)) as i32;
        loop {
            let record = BaseRecord::<(), [u8]>::to(topic)
                .partition(partition)
                .payload(&buf[..])
                .timestamp(now);
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => bail!("produce: {e}"),
            }
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("producer flush")?;
    let secs = started.elapsed().as_secs_f64();
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    for p in 0..partitions {
        let (lo, hi) = probe.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if lo != 0 || hi != per_partition {
            bail!(
                "partition {p} of {topic} holds offsets [{lo}, {hi}), expected [0, {per_partition}): \
                 the mock broker keeps only 5 MiB per partition; use fewer --per-partition"
            );
        }
    }
    Ok(total as f64 / secs)
}

// ---------------------------------------------------------------------------------------------
// Role: raw consumer (part 1)

/// The event as a typical consumer parses it: borrowed strings, typed numbers.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow)]
    app_id: &'a str,
    #[serde(borrow)]
    device_id: &'a str,
    #[serde(borrow)]
    ip: &'a str,
    ts: i64,
    bytes: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RawResult {
    messages: u64,
    /// From `assign` to the last message.
    secs: f64,
    /// From the first message to the last.
    secs_from_first: f64,
    cpu: f64,
    parse_errors: u64,
    checksum: i64,
    peak_rss_mb: f64,
    /// CPU of the broker process meanwhile (filled in by the parent).
    #[serde(default)]
    broker_cpu: f64,
}

fn role_raw(
    brokers: &str,
    topic: &str,
    partitions: i32,
    expect: u64,
    parse: bool,
) -> anyhow::Result<()> {
    let mut kafka = Config::default().kafka;
    kafka.brokers = brokers.to_string();
    kafka.topic = topic.to_string();
    kafka.group_id = format!("raw-{}", std::process::id());
    // The very settings tally uses (fetch.queue.backoff.ms=10 among them).
    let consumer: BaseConsumer = kafka_client_config(&kafka).create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        // An explicit offset, as tally assigns (no offset lookup first).
        tpl.add_partition_offset(topic, p, Offset::Offset(0))?;
    }
    let cpu0 = cpu_self();
    let t0 = Instant::now();
    consumer.assign(&tpl)?;
    let (mut n, mut errors, mut checksum) = (0u64, 0u64, 0i64);
    let mut first = None;
    while n < expect {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                first.get_or_insert_with(Instant::now);
                n += 1;
                let payload = m.payload().unwrap_or_default();
                if parse {
                    match serde_json::from_slice::<RawEvent>(payload) {
                        Ok(e) => {
                            let lens = e.app_id.len() + e.device_id.len() + e.ip.len();
                            checksum = checksum.wrapping_add(e.ts ^ e.bytes ^ lens as i64);
                        }
                        Err(_) => errors += 1,
                    }
                } else {
                    checksum = checksum.wrapping_add(payload.len() as i64);
                }
            }
            Some(Err(e)) => eprintln!("consume error: {e}"),
            None if t0.elapsed() > Duration::from_secs(600) => bail!("raw consumer stalled at {n}"),
            None => {}
        }
    }
    let result = RawResult {
        messages: n,
        secs: t0.elapsed().as_secs_f64(),
        secs_from_first: first.map_or(f64::NAN, |f| f.elapsed().as_secs_f64()),
        cpu: cpu_self() - cpu0,
        parse_errors: errors,
        checksum,
        peak_rss_mb: proc_status_mb(None, "VmHWM"),
        broker_cpu: 0.0,
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Role: tally (part 2)

fn role_tally(config: &Path, partitions: i64) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TALLY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let config = Config::load(Some(config), &serde_json::json!({}))?;
    let tally = Tally::new(config);
    let metrics = tally.metrics.clone();
    // Tell the parent when every partition is assigned: measurement starts there.
    std::thread::Builder::new()
        .name("bench-watch".into())
        .spawn(move || loop {
            if metrics.assigned_partitions.get() >= partitions {
                println!("{}", serde_json::json!({ "assigned_at": unix_secs_f64() }));
                let _ = std::io::stdout().flush();
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        })?;
    let token = CancellationToken::new();
    let stop = token.clone();
    std::thread::spawn(move || {
        wait_for_stdin_eof();
        stop.cancel();
    });
    // The same runtime as `tally run` (multi-threaded, one worker per core).
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(tally.run(token))
}

/// One scrape of tally's `/metrics`.
struct Scrape(String);

impl Scrape {
    fn get(port: u16) -> anyhow::Result<Scrape> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(Scrape(body))
    }

    fn value(&self, name: &str) -> f64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Quantile `q` of histogram `name`, interpolated linearly inside its bucket (like
    /// Prometheus' `histogram_quantile`).
    fn quantile(&self, name: &str, q: f64) -> f64 {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut buckets: Vec<(f64, f64)> = self
            .0
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&prefix)?;
                let (le, count) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count.trim().parse().ok()?))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last().map_or(0.0, |b| b.1);
        if total == 0.0 {
            return f64::NAN;
        }
        let rank = q * total;
        let mut prev = (0.0, 0.0);
        for &(le, count) in &buckets {
            if count >= rank {
                if le.is_infinite() {
                    return prev.0;
                }
                let inside = (rank - prev.1) / (count - prev.1).max(1.0);
                return prev.0 + (le - prev.0) * inside;
            }
            prev = (le, count);
        }
        f64::NAN
    }
}

#[derive(Debug, Default, Clone)]
struct E2e {
    messages: f64,
    secs: f64,
    /// Until the consumer thread stopped working (the rest is waiting for the last flush).
    consume_secs: f64,
    cpu: f64,
    broker_cpu: f64,
    peak_rss_mb: f64,
    redis: RedisWork,
    flushes: f64,
    keys_flushed: f64,
    distinct_keys: u64,
    flush_p50: f64,
    flush_p99: f64,
    flush_secs_sum: f64,
    flush_keys_sum: f64,
    /// Highest `tally_pending_keys` seen (scraped every 100 ms).
    max_pending: f64,
    threads: Vec<(String, f64)>,
    counted_ok: bool,
}

struct Ctx {
    broker_pid: u32,
    exe_args_partitions: i32,
    bootstrap: String,
    redis_url: String,
    perf: Option<PathBuf>,
}

fn spawn_tally(
    ctx: &Ctx,
    topic: &str,
    group: &str,
    name: &str,
    kafka_properties: &str,
) -> anyhow::Result<(ChildRole, u16, PathBuf)> {
    let port = tally::local_redis::free_port()?;
    let path = std::env::temp_dir().join(format!("tally-bench-{}-{name}.toml", std::process::id()));
    std::fs::write(
        &path,
        config_toml(
            &ctx.bootstrap,
            topic,
            group,
            &ctx.redis_url,
            &format!("127.0.0.1:{port}"),
            kafka_properties,
        ),
    )?;
    let child = ChildRole::spawn(
        &[
            "tally".into(),
            "--config".into(),
            path.display().to_string(),
            "--partitions".into(),
            ctx.exe_args_partitions.to_string(),
        ],
        name,
    )?;
    Ok((child, port, path))
}

fn phase_e2e(ctx: &Ctx, v: &Variant, topic: &str, per_partition: i64) -> anyhow::Result<E2e> {
    let mut conn = redis_conn(&ctx.redis_url)?;
    flushall(&mut conn)?;
    let group = format!("bench-{}", v.name);
    let (child, port, config_path) =
        spawn_tally(ctx, topic, &group, &format!("e2e-{}", v.name), "")?;
    let assigned: serde_json::Value = child.result(Duration::from_secs(60))?;
    let t0 = assigned["assigned_at"].as_f64().context("assigned_at")?;
    let pid = child.pid();
    let cpu0 = proc_cpu(pid);
    let broker0 = proc_cpu(ctx.broker_pid);
    let threads0 = thread_cpus(pid);
    let snap0 = redis_snapshot(&mut conn)?;
    let perf = Perf::attach(ctx.perf.as_deref(), pid, &format!("e2e-{}", v.name));

    let fences: Vec<String> = (0..ctx.exe_args_partitions)
        .map(|p| format!("tally:applied:{group}:{topic}:{p}:0"))
        .collect();
    let consumer_tid = threads0
        .iter()
        .find(|(_, (name, _))| name == "tally-consumer")
        .map(|(tid, _)| tid.clone());
    let n = (per_partition * i64::from(ctx.exe_args_partitions)) as f64;
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut polls: u64 = 0;
    let mut consumed_seen: Option<f64> = None;
    let mut max_pending: f64 = 0.0;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let applied: Vec<Option<i64>> = redis::cmd("MGET").arg(&fences).query(&mut conn)?;
        polls += 1;
        let now = unix_secs_f64();
        if let Some(c) = consumer_tid
            .as_deref()
            .and_then(|tid| thread_runtime(pid, tid))
        {
            samples.push((now, c));
        }
        // tally publishes its consumed count and pending keys at least every 200 ms.
        if polls.is_multiple_of(10) {
            if let Ok(s) = Scrape::get(port) {
                if consumed_seen.is_none() && s.value("tally_messages_consumed_total") >= n {
                    consumed_seen = Some(unix_secs_f64());
                }
                max_pending = max_pending.max(s.value("tally_pending_keys"));
            }
        }
        if applied.iter().all(|a| *a == Some(per_partition)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("tally did not apply every offset in time: {applied:?}");
        }
    }
    let t1 = unix_secs_f64();
    let cpu1 = proc_cpu(pid);
    let broker_cpu = proc_cpu(ctx.broker_pid) - broker0;
    let threads1 = thread_cpus(pid);
    let peak_rss_mb = proc_status_mb(Some(pid), "VmHWM");
    perf.stop();
    let snap1 = redis_snapshot(&mut conn)?;
    let scrape = Scrape::get(port)?;
    child.finish(Duration::from_secs(60));
    let _ = std::fs::remove_file(config_path);

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
    let (distinct, sum) = sum_counters(&mut conn)?;
    Ok(E2e {
        messages: n,
        secs: t1 - t0,
        consume_secs: consume_end - t0,
        cpu: cpu1 - cpu0,
        broker_cpu,
        peak_rss_mb,
        // Own commands: the MGET polls and the INFO calls of the snapshots.
        redis: snap0.work_until(&snap1, polls as f64 + 3.0),
        flushes: scrape.value("tally_flush_duration_seconds_count"),
        keys_flushed: scrape.value("tally_keys_flushed_total"),
        distinct_keys: distinct,
        flush_p50: scrape.quantile("tally_flush_duration_seconds", 0.5),
        flush_p99: scrape.quantile("tally_flush_duration_seconds", 0.99),
        flush_secs_sum: scrape.value("tally_flush_duration_seconds_sum"),
        flush_keys_sum: scrape.value("tally_flush_keys_sum"),
        max_pending,
        threads: thread_breakdown(&threads0, &threads1),
        counted_ok: sum as f64 == n && scrape.value("tally_messages_consumed_total") >= n,
    })
}

// ---------------------------------------------------------------------------------------------
// Live latency (part 2, event-to-visible)

/// The mock broker answers a fetch that finds no data only after the full `fetch.wait.max.ms`
/// (librdkafka default 500 ms), even if data arrives meanwhile; a real broker answers as soon as
/// data arrives. A short wait restores that behaviour for the live phase.
const LIVE_KAFKA_PROPERTIES: &str = r#""fetch.wait.max.ms" = "10""#;

#[derive(Debug, Default, Clone)]
struct Latency {
    markers: usize,
    p50: f64,
    p99: f64,
    max: f64,
    rate: f64,
    flush_p50: f64,
    flush_p99: f64,
    interval: f64,
}

fn phase_latency(ctx: &Ctx, topic: &str, secs: u64, rate: u64) -> anyhow::Result<Latency> {
    let mut conn = redis_conn(&ctx.redis_url)?;
    flushall(&mut conn)?;
    let (child, port, config_path) =
        spawn_tally(ctx, topic, "bench-live", "live", LIVE_KAFKA_PROPERTIES)?;
    let _assigned: serde_json::Value = child.result(Duration::from_secs(60))?;

    // The poller looks for each marker's key every 2 ms and records when it appears.
    let (marker_tx, marker_rx) = mpsc::channel::<(String, Instant)>();
    let url = ctx.redis_url.clone();
    let base = Instant::now();
    let poller = std::thread::spawn(move || -> anyhow::Result<Vec<(f64, f64)>> {
        let mut conn = redis_conn(&url)?;
        let mut outstanding: Vec<(String, Instant)> = Vec::new();
        let mut seen = Vec::new();
        let mut closed_at: Option<Instant> = None;
        loop {
            loop {
                match marker_rx.try_recv() {
                    Ok(m) => outstanding.push(m),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed_at.get_or_insert_with(Instant::now);
                        break;
                    }
                }
            }
            if !outstanding.is_empty() {
                let mut pipe = redis::pipe();
                for (key, _) in &outstanding {
                    pipe.cmd("EXISTS").arg(key);
                }
                let found: Vec<i64> = pipe.query(&mut conn)?;
                let now = Instant::now();
                let mut i = 0;
                outstanding.retain(|(_, sent)| {
                    let keep = found[i] == 0;
                    if !keep {
                        seen.push(((*sent - base).as_secs_f64(), (now - *sent).as_secs_f64()));
                    }
                    i += 1;
                    keep
                });
            }
            if closed_at
                .is_some_and(|c| outstanding.is_empty() || c.elapsed() > Duration::from_secs(10))
            {
                if !outstanding.is_empty() {
                    bail!("{} markers never became visible", outstanding.len());
                }
                return Ok(seen);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });

    // Background load in large batches (the mock broker scans a partition's batches linearly
    // on every fetch, so many tiny batches would slow it down over time); markers unbatched, so
    // their latency starts when they are produced.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &ctx.bootstrap)
        .set("linger.ms", "50")
        .create()?;
    let marker_producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &ctx.bootstrap)
        .set("linger.ms", "0")
        .create()?;
    let mut gen = EventGen::new(100_000, 1.0, 7);
    let mut buf = Vec::with_capacity(128);
    let started = Instant::now();
    let warmup = Duration::from_secs(2);
    let parts = i64::from(ctx.exe_args_partitions);
    let (mut sent, mut markers) = (0u64, 0u64);
    let mut next_marker = started;
    while started.elapsed() < Duration::from_secs(secs) {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let now = unix_ms();
        while sent < due {
            EventGen::write_json(&mut buf, gen.next_key(), now);
            let record = BaseRecord::<(), [u8]>::to(topic)
                .partition((sent as i64 % parts) as i32)
                .payload(&buf[..])
                .timestamp(now);
            if producer.send(record).is_err() {
                producer.poll(Duration::from_millis(1));
                continue;
            }
            sent += 1;
        }
        if Instant::now() >= next_marker {
            next_marker += Duration::from_millis(10);
            let payload = format!(
                r#"{{"app_id":"mark","device_id":"m{markers}","ip":"0.0.0.0","ts":{now},"bytes":1}}"#
            );
            let hour = chrono::DateTime::from_timestamp_millis(now)
                .context("clock")?
                .format("%Y%m%d%H");
            let key = format!("flow:count:mark:m{markers}:0.0.0.0:{hour}");
            let record = BaseRecord::<(), str>::to(topic)
                .partition((markers as i64 % parts) as i32)
                .payload(payload.as_str())
                .timestamp(now);
            let sent_at = Instant::now();
            if marker_producer.send(record).is_ok() {
                if started.elapsed() > warmup {
                    let _ = marker_tx.send((key, sent_at));
                }
                markers += 1;
            }
        }
        producer.poll(Duration::ZERO);
        marker_producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_micros(500));
    }
    producer.flush(Duration::from_secs(10))?;
    marker_producer.flush(Duration::from_secs(10))?;
    drop(marker_tx);
    let produce_secs = started.elapsed().as_secs_f64();
    let timeline = poller
        .join()
        .map_err(|_| anyhow::anyhow!("poller panicked"))??;
    if std::env::var_os("TALLY_BENCH_DEBUG").is_some() {
        for (at, l) in &timeline {
            eprintln!("marker sent at {at:.3}s visible after {:.1} ms", l * 1e3);
        }
    }
    let mut seen: Vec<f64> = timeline.iter().map(|t| t.1).collect();
    let scrape = Scrape::get(port)?;
    child.finish(Duration::from_secs(60));
    let _ = std::fs::remove_file(config_path);
    seen.sort_by(f64::total_cmp);
    Ok(Latency {
        markers: seen.len(),
        p50: percentile(&seen, 0.5),
        p99: percentile(&seen, 0.99),
        max: seen.last().copied().unwrap_or(f64::NAN),
        rate: (sent + markers) as f64 / produce_secs,
        flush_p50: scrape.quantile("tally_flush_duration_seconds", 0.5),
        flush_p99: scrape.quantile("tally_flush_duration_seconds", 0.99),
        interval: Config::default().flush.interval.as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------------------------
// Role: pipeline without Kafka (parts 3 and 4, fencing)

/// Generated messages in one buffer.
struct Messages {
    buf: Vec<u8>,
    /// (start, len, partition, offset, kafka timestamp).
    index: Vec<(usize, usize, i32, i64, i64)>,
}

impl Messages {
    fn generate(keys: u64, skew: f64, seed: u64, n: u64, partitions: i32) -> Messages {
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

    fn payload(&self, i: usize) -> &[u8] {
        let (start, len, ..) = self.index[i];
        &self.buf[start..start + len]
    }
}

fn load_bench_config(redis_url: &str) -> anyhow::Result<Config> {
    let path =
        std::env::temp_dir().join(format!("tally-bench-{}-pipeline.toml", std::process::id()));
    std::fs::write(
        &path,
        config_toml("localhost:9092", "events", "bench-pipe", redis_url, "", ""),
    )?;
    let config = Config::load(Some(&path), &serde_json::json!({}));
    let _ = std::fs::remove_file(path);
    Ok(config?)
}

fn new_aggregator(
    config: &Config,
    partitions: i32,
) -> anyhow::Result<(tally::decode::Decoder, Aggregator)> {
    let (decoder, counters) = build_stages(config)?;
    let mut agg = Aggregator::new(counters, 1, config.flush.max_keys_per_call);
    for p in 0..partitions {
        agg.assign(p, &[0]);
    }
    Ok((decoder, agg))
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct LoopResult {
    secs: f64,
    cpu: f64,
    keys_sealed: u64,
    flushes: u64,
    flush_secs: Vec<f64>,
    flush_keys: Vec<u64>,
}

/// A thread owning a Redis connection that applies sealed units with tally's script, one
/// pipeline per flush, like the sink.
struct Flusher {
    tx: mpsc::Sender<Vec<Unit>>,
    done: mpsc::Receiver<anyhow::Result<(f64, u64)>>,
    thread: std::thread::JoinHandle<()>,
}

fn fence_key(p: i32) -> String {
    format!("tally:applied:bench-pipe:events:{p}:0")
}

impl Flusher {
    fn start(url: &str, partitions: i32) -> anyhow::Result<Flusher> {
        let mut conn = redis_conn(url)?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(APPLY_LUA)
            .query(&mut conn)?;
        for p in 0..partitions {
            redis::cmd("SET")
                .arg(fence_key(p))
                .arg(0)
                .query::<()>(&mut conn)?;
        }
        let (tx, rx) = mpsc::channel::<Vec<Unit>>();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for units in rx {
                let started = Instant::now();
                let r = apply_units(&mut conn, &sha, &units, true)
                    .map(|keys| (started.elapsed().as_secs_f64(), keys));
                if done_tx.send(r).is_err() {
                    return;
                }
            }
        });
        Ok(Flusher { tx, done, thread })
    }
}

/// Apply `units` in one pipeline; with `fenced`, check every unit was applied (status 1).
fn apply_units(
    conn: &mut redis::Connection,
    sha: &str,
    units: &[Unit],
    fenced: bool,
) -> anyhow::Result<u64> {
    let mut pipe = redis::pipe();
    for u in units {
        pipe.add_command(apply_cmd(sha, &fence_key(u.partition), u));
    }
    let replies: Vec<redis::Value> = pipe.query(conn)?;
    if fenced {
        for r in &replies {
            match r {
                redis::Value::Array(items) if items.first() == Some(&redis::Value::Int(1)) => {}
                other => bail!("unit not applied: {other:?}"),
            }
        }
    }
    Ok(units.iter().map(|u| u.keys.len() as u64).sum())
}

/// decode → aggregate → seal over `msgs` on this thread, as the consumer thread does it:
/// a flush is due at `flush.max_keys` pending keys or `flush.interval` after the batch started;
/// with a `flusher`, at most one flush is in flight and consumption waits above
/// `flush.max_pending_keys`. Without one, sealed units are dropped.
fn run_loop(
    config: &Config,
    msgs: &Messages,
    partitions: i32,
    flusher: Option<&Flusher>,
) -> anyhow::Result<LoopResult> {
    let (decoder, mut agg) = new_aggregator(config, partitions)?;
    let flush = &config.flush;
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
    for (i, &(_, _, partition, offset, ts)) in msgs.index.iter().enumerate() {
        if i % 64 == 0 {
            now_ms = unix_ms();
            collect(&mut out, false, &mut in_flight)?;
            let due = batch_started.is_some_and(|t| t.elapsed() >= flush.interval)
                || agg.pending_keys() >= flush.max_keys;
            if due && in_flight.is_none() {
                let batch = agg.seal(None);
                batch_started = None;
                out.keys_sealed += batch.keys as u64;
                out.flushes += 1;
                if let Some(f) = flusher {
                    in_flight = Some(batch.keys);
                    f.tx.send(batch.units)?;
                }
            }
            let pending = agg.pending_keys() + in_flight.unwrap_or(0);
            if in_flight.is_some() && pending >= flush.max_pending_keys {
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
    collect(&mut out, true, &mut in_flight)?;
    let batch = agg.seal(None);
    out.keys_sealed += batch.keys as u64;
    out.flushes += 1;
    if let Some(f) = flusher {
        in_flight = Some(batch.keys);
        f.tx.send(batch.units)?;
        collect(&mut out, true, &mut in_flight)?;
    }
    out.secs = t0.elapsed().as_secs_f64();
    out.cpu = if flusher.is_some() {
        cpu_self()
    } else {
        cpu_thread()
    } - cpu0;
    Ok(out)
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct PipelineResult {
    messages: u64,
    /// decode → aggregate → seal, one thread (median of the repetitions).
    agg_secs: f64,
    agg_cpu: f64,
    agg_keys: u64,
    /// The same with flushes to Redis.
    flush: LoopResult,
    flush_redis: RedisWork,
    flush_counted_ok: bool,
    distinct_keys: u64,
    /// Fencing: keys applied by one pipeline of units, fenced vs without the CAS (median).
    fence_keys: u64,
    fence_units: u64,
    fenced_secs: f64,
    /// Every repetition of the fenced apply: an isolated flush of ~`flush.max_keys` keys.
    fenced_all: Vec<f64>,
    unfenced_secs: f64,
    /// The same units through a script doing only INCRBY: the floor of a script-based flush.
    incrby_only_secs: f64,
    /// Per-message baseline.
    base_messages: u64,
    base_secs: f64,
    base_cpu: f64,
    base_redis: RedisWork,
    base_counted_ok: bool,
}

/// The flush script without the fencing: no GET / compare / SET of the applied offset.
/// Same arguments as `APPLY_LUA` (the fence key and offsets are passed and ignored).
const UNFENCED_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local late, rejected = 0, 0
for i = 2, #KEYS do
  local at = tonumber(ARGV[2 * i])
  if at <= now then
    late = late + 1
  else
    local r = redis.pcall('INCRBY', KEYS[i], ARGV[2 * i - 1])
    if type(r) == 'table' and r.err then
      if string.sub(r.err, 1, 3) == 'OOM' then return redis.error_reply(r.err) end
      rejected = rejected + 1
    elseif redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], at)
    end
  end
end
return {1, late, rejected}
"#;

/// Only the INCRBYs (no expiry, no lateness check, no fence): what Redis needs at least.
const INCRBY_ONLY_LUA: &str = r#"
for i = 2, #KEYS do
  redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1])
end
return {1, 0, 0}
"#;

/// What most users write: one call per event.
const PER_MESSAGE_LUA: &str = r#"
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return v
"#;

fn role_pipeline(a: &PipelineArgs) -> anyhow::Result<()> {
    let config = load_bench_config(&a.redis_url)?;
    let msgs = Messages::generate(a.keys, a.skew, a.seed, a.messages, a.partitions);
    let mut res = PipelineResult {
        messages: a.messages,
        ..Default::default()
    };

    // 3a: in memory, one thread.
    let reps = a.only_aggregate.unwrap_or(3).max(1);
    let mut runs = Vec::new();
    for _ in 0..reps {
        runs.push(run_loop(&config, &msgs, a.partitions, None)?);
    }
    runs.sort_by(|x, y| x.secs.total_cmp(&y.secs));
    let mid = runs[runs.len() / 2].clone();
    res.agg_secs = mid.secs;
    res.agg_cpu = mid.cpu;
    res.agg_keys = mid.keys_sealed;
    if a.only_aggregate.is_some() {
        println!("{}", serde_json::to_string(&res)?);
        return Ok(());
    }

    // 3b: with the flush to Redis.
    let mut conn = redis_conn(&a.redis_url)?;
    flushall(&mut conn)?;
    let flusher = Flusher::start(&a.redis_url, a.partitions)?;
    let snap0 = redis_snapshot(&mut conn)?;
    res.flush = run_loop(&config, &msgs, a.partitions, Some(&flusher))?;
    let snap1 = redis_snapshot(&mut conn)?;
    res.flush_redis = snap0.work_until(&snap1, 3.0);
    drop(flusher.tx);
    let _ = flusher.thread.join();
    let (distinct, sum) = sum_counters(&mut conn)?;
    res.distinct_keys = distinct;
    res.flush_counted_ok = sum == a.messages as i64;

    // Fencing: the first flush's worth of units through both scripts.
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
        (APPLY_LUA, true),
        (UNFENCED_LUA, false),
        (INCRBY_ONLY_LUA, false),
    ] {
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(src).query(&mut conn)?;
        scripts.push((sha, check, Vec::new()));
    }
    // Interleaved repetitions, each from the same state: an empty database and fresh fences.
    for _ in 0..7 {
        for (sha, check, times) in &mut scripts {
            flushall(&mut conn)?;
            for p in 0..a.partitions {
                redis::cmd("SET")
                    .arg(fence_key(p))
                    .arg(0)
                    .query::<()>(&mut conn)?;
            }
            let started = Instant::now();
            res.fence_keys = apply_units(&mut conn, sha, &units, *check)?;
            times.push(started.elapsed().as_secs_f64());
        }
    }
    res.fenced_all = scripts[0].2.clone();
    let mut medians = scripts.into_iter().map(|s| median(s.2));
    res.fenced_secs = medians.next().unwrap_or(f64::NAN);
    res.unfenced_secs = medians.next().unwrap_or(f64::NAN);
    res.incrby_only_secs = medians.next().unwrap_or(f64::NAN);

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

// ---------------------------------------------------------------------------------------------
// Role: memory probe

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct MemResult {
    keys: u64,
    /// Distinct keys pending in the aggregator.
    pending: u64,
    rss_before_mb: f64,
    /// With every key pending.
    rss_pending_mb: f64,
    /// Peak, while all of them are sealed and encoded for one flush.
    hwm_mb: f64,
    /// Size of that flush's packed pipeline.
    encoded_mb: f64,
}

fn role_memprobe(keys: u64, partitions: i32) -> anyhow::Result<()> {
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
    // Flush them as the sink does: the sealed units, one script call per unit in a pipeline,
    // the pipeline packed into one buffer, and that buffer copied into the connection's write
    // buffer (redis-rs' codec) — all alive at the same moment.
    let batch = agg.seal(None);
    let mut pipe = redis::pipe();
    for u in &batch.units {
        pipe.add_command(apply_cmd(&"0".repeat(40), &fence_key(u.partition), u));
    }
    let packed = pipe.get_packed_pipeline();
    let write_buffer = packed.clone();
    let r = MemResult {
        keys,
        pending,
        rss_before_mb,
        rss_pending_mb,
        hwm_mb: proc_status_mb(None, "VmHWM"),
        encoded_mb: (packed.len() as f64) / 1024.0 / 1024.0,
    };
    drop((batch, pipe, packed, write_buffer));
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The orchestrator

struct VariantResults {
    variant: Variant,
    raw_read: RawResult,
    raw_parse: RawResult,
    e2e: E2e,
    pipe: PipelineResult,
}

fn run_raw(ctx: &Ctx, topic: &str, expect: u64, parse: bool) -> anyhow::Result<RawResult> {
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

fn run_pipeline(
    ctx: &Ctx,
    v: &Variant,
    messages: u64,
    baseline: u64,
) -> anyhow::Result<PipelineResult> {
    let args = vec![
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

fn orchestrate(cli: &Cli) -> anyhow::Result<()> {
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
        let e2e = phase_e2e(&ctx, v, &topic, per_partition)?;
        eprintln!(
            "[{}] pipeline without Kafka, per-message baseline, fencing",
            v.name
        );
        let pipe = run_pipeline(&ctx, v, total, total.min(1_000_000))?;
        results.push(VariantResults {
            variant: v.clone(),
            raw_read,
            raw_parse,
            e2e,
            pipe,
        });
    }
    eprintln!("memory probe: 1,000,000 pending keys");
    let probe = ChildRole::spawn(
        &[
            "memprobe".into(),
            "--keys".into(),
            "1000000".into(),
            "--partitions".into(),
            partitions.to_string(),
        ],
        "memprobe",
    )?;
    let mem: MemResult = probe.result(Duration::from_secs(300))?;
    probe.finish(Duration::from_secs(30));
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
    report(&machine, &results, &mem, &latency);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Report

struct Machine {
    cpu: String,
    cores: usize,
    redis: String,
    load_start: String,
    load_end: String,
    secs: f64,
    quick: bool,
    total: u64,
    partitions: i32,
    compression: String,
}

fn rate(n: f64, secs: f64) -> String {
    if secs <= 0.0 {
        return "n/a".into();
    }
    thousands(n / secs)
}

fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn per_million(x: f64, n: f64) -> f64 {
    x / n * 1e6
}

fn ms(secs: f64) -> String {
    if secs.is_finite() {
        format!("{:.1} ms", secs * 1e3)
    } else {
        "n/a".into()
    }
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

impl VariantResults {
    fn raw_parse_rate(&self) -> f64 {
        self.raw_parse.messages as f64 / self.raw_parse.secs
    }

    /// Milliseconds per 100,000 keys over all flushes of part 3 (+ flush).
    fn pipe_ms_per_100k(&self) -> f64 {
        let secs: f64 = self.pipe.flush.flush_secs.iter().sum();
        let keys: u64 = self.pipe.flush.flush_keys.iter().sum();
        secs / keys.max(1) as f64 * 1e5 * 1e3
    }
}

fn report(m: &Machine, results: &[VariantResults], mem: &MemResult, lat: &Latency) {
    let mut t = String::new();
    let head: Vec<String> = results
        .iter()
        .map(|r| {
            let dist = if r.variant.skew > 0.0 {
                format!("Zipf s={}", r.variant.skew)
            } else {
                "uniform".into()
            };
            format!(
                "{} ({} keys, {dist})",
                r.variant.name,
                thousands(r.variant.keys as f64)
            )
        })
        .collect();
    t.push_str(&format!(
        "| | {} |\n|---|{}\n",
        head.join(" | "),
        "---|".repeat(results.len())
    ));
    let mut row = |name: &str, f: &dyn Fn(&VariantResults) -> String| {
        let cells: Vec<String> = results.iter().map(f).collect();
        t.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    };
    let f2 = |x: f64| format!("{x:.2}");
    row("**1. raw consume, read only**: msgs/s", &|r| {
        rate(r.raw_read.messages as f64, r.raw_read.secs)
    });
    row("… CPU-s per million msgs (consumer process)", &|r| {
        f2(per_million(r.raw_read.cpu, r.raw_read.messages as f64))
    });
    row(
        "… peak RSS of the consumer process (librdkafka and its buffers)",
        &|r| format!("{:.0} MB", r.raw_read.peak_rss_mb),
    );
    row(
        "**1. raw consume, read + serde_json parse**: msgs/s",
        &|r| rate(r.raw_parse.messages as f64, r.raw_parse.secs),
    );
    row("… CPU-s per million msgs (consumer process)", &|r| {
        f2(per_million(r.raw_parse.cpu, r.raw_parse.messages as f64))
    });
    row(
        "… broker CPU-s per million msgs (mock cluster process)",
        &|r| {
            f2(per_million(
                r.raw_parse.broker_cpu,
                r.raw_parse.messages as f64,
            ))
        },
    );
    row(
        "**2. tally end-to-end**: msgs/s, assigned → every offset applied in Redis",
        &|r| rate(r.e2e.messages, r.e2e.secs),
    );
    row(
        "… msgs/s while consuming (until the consumer thread went idle)",
        &|r| rate(r.e2e.messages, r.e2e.consume_secs),
    );
    row(
        "… ratio to raw read + parse: end-to-end (while consuming)",
        &|r| {
            let raw = r.raw_parse_rate();
            format!(
                "{:.0}% ({:.0}%)",
                100.0 * r.e2e.messages / r.e2e.secs / raw,
                100.0 * r.e2e.messages / r.e2e.consume_secs / raw
            )
        },
    );
    row(
        "… CPU-s per million msgs (tally process, user+sys)",
        &|r| f2(per_million(r.e2e.cpu, r.e2e.messages)),
    );
    row("… ratio to raw read + parse (CPU per msg)", &|r| {
        format!(
            "{:.1}×",
            (r.e2e.cpu / r.e2e.messages) / (r.raw_parse.cpu / r.raw_parse.messages as f64)
        )
    });
    row("… Redis CPU-s per million msgs", &|r| {
        f2(per_million(r.e2e.redis.cpu, r.e2e.messages))
    });
    row(
        "… all processes (tally + Redis + broker) CPU-s per million msgs",
        &|r| {
            f2(per_million(
                r.e2e.cpu + r.e2e.redis.cpu + r.e2e.broker_cpu,
                r.e2e.messages,
            ))
        },
    );
    row(
        "… peak RSS (VmHWM); most keys pending (in memory + in flight)",
        &|r| {
            format!(
                "{:.0} MB; {}",
                r.e2e.peak_rss_mb,
                thousands(r.e2e.max_pending)
            )
        },
    );
    row(
        "… counter keys in Redis; keys written per million msgs",
        &|r| {
            format!(
                "{}; {}",
                thousands(r.e2e.distinct_keys as f64),
                thousands(per_million(r.e2e.keys_flushed, r.e2e.messages))
            )
        },
    );
    row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        &|r| {
            format!(
                "{} ({})",
                thousands(per_million(r.e2e.redis.top_level(), r.e2e.messages)),
                thousands(per_million(r.e2e.redis.script_inner(), r.e2e.messages))
            )
        },
    );
    row(
        "… Redis round trips per million msgs (one pipeline per flush)",
        &|r| format!("{:.1}", per_million(r.e2e.flushes, r.e2e.messages)),
    );
    row("… flushes; mean keys per flush", &|r| {
        format!(
            "{}; {}",
            r.e2e.flushes,
            thousands(r.e2e.flush_keys_sum / r.e2e.flushes)
        )
    });
    row(
        "… flush duration p50 / p99 (histogram, interpolated)",
        &|r| format!("{} / {}", ms(r.e2e.flush_p50), ms(r.e2e.flush_p99)),
    );
    row(
        "… flush time per 100,000 keys (sum of durations ÷ keys)",
        &|r| ms(r.e2e.flush_secs_sum / r.e2e.flush_keys_sum * 1e5),
    );
    row("… counts in Redis = events produced", &|r| {
        if r.e2e.counted_ok {
            "yes".into()
        } else {
            "**NO**".into()
        }
    });
    row(
        "**3. pipeline without Kafka**: decode → aggregate → seal, 1 thread, msgs/s",
        &|r| rate(r.pipe.messages as f64, r.pipe.agg_secs),
    );
    row("… CPU-s per million msgs", &|r| {
        f2(per_million(r.pipe.agg_cpu, r.pipe.messages as f64))
    });
    row(
        "**3 + flush** to redis-server (tally's script, one flush in flight): msgs/s",
        &|r| rate(r.pipe.messages as f64, r.pipe.flush.secs),
    );
    row(
        "… client CPU-s per million msgs (both threads); Redis CPU-s",
        &|r| {
            format!(
                "{}; {}",
                f2(per_million(r.pipe.flush.cpu, r.pipe.messages as f64)),
                f2(per_million(r.pipe.flush_redis.cpu, r.pipe.messages as f64))
            )
        },
    );
    row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        &|r| {
            format!(
                "{} ({})",
                thousands(per_million(
                    r.pipe.flush_redis.top_level(),
                    r.pipe.messages as f64
                )),
                thousands(per_million(
                    r.pipe.flush_redis.script_inner(),
                    r.pipe.messages as f64
                ))
            )
        },
    );
    row("… flushes; mean / max keys per flush", &|r| {
        let k = &r.pipe.flush.flush_keys;
        let mean = k.iter().sum::<u64>() as f64 / k.len().max(1) as f64;
        format!(
            "{}; {} / {}",
            k.len(),
            thousands(mean),
            thousands(k.iter().copied().max().unwrap_or(0) as f64)
        )
    });
    row("… flush duration p50 / p99 (exact)", &|r| {
        let s = sorted(&r.pipe.flush.flush_secs);
        format!("{} / {}", ms(percentile(&s, 0.5)), ms(percentile(&s, 0.99)))
    });
    row("… flush time per 100,000 keys", &|r| {
        let k = &r.pipe.flush.flush_keys;
        if k.iter().sum::<u64>() < 10_000 * k.len() as u64 {
            "n/a (small flushes)".into()
        } else {
            ms(r.pipe_ms_per_100k() / 1e3)
        }
    });
    row("**4. per-message baseline** (one Lua INCRBY + PEXPIREAT per event, 1,000 per round trip): msgs/s", &|r| rate(r.pipe.base_messages as f64, r.pipe.base_secs));
    row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        &|r| {
            format!(
                "{} ({})",
                thousands(per_million(
                    r.pipe.base_redis.top_level(),
                    r.pipe.base_messages as f64
                )),
                thousands(per_million(
                    r.pipe.base_redis.script_inner(),
                    r.pipe.base_messages as f64
                ))
            )
        },
    );
    row("… client CPU-s; Redis CPU-s per million msgs", &|r| {
        format!(
            "{}; {}",
            f2(per_million(r.pipe.base_cpu, r.pipe.base_messages as f64)),
            f2(per_million(
                r.pipe.base_redis.cpu,
                r.pipe.base_messages as f64
            ))
        )
    });
    row(
        "… gain of pre-aggregation, (3 + flush) ÷ 4: msgs/s; commands sent; commands executed",
        &|r| {
            let speed = (r.pipe.messages as f64 / r.pipe.flush.secs)
                / (r.pipe.base_messages as f64 / r.pipe.base_secs);
            let sent = (r.pipe.base_redis.top_level() / r.pipe.base_messages as f64)
                / (r.pipe.flush_redis.top_level() / r.pipe.messages as f64);
            let all = (r.pipe.base_redis.commands / r.pipe.base_messages as f64)
                / (r.pipe.flush_redis.commands / r.pipe.messages as f64);
            format!("{speed:.1}×; {sent:.0}×; {all:.1}×")
        },
    );
    row(
        "**Fencing cost**: one flush's units (keys; units) applied, keys/s fenced vs unfenced",
        &|r| {
            format!(
                "{}; {}: {} vs {} ({:+.1}% time)",
                thousands(r.pipe.fence_keys as f64),
                r.pipe.fence_units,
                thousands(r.pipe.fence_keys as f64 / r.pipe.fenced_secs),
                thousands(r.pipe.fence_keys as f64 / r.pipe.unfenced_secs),
                100.0 * (r.pipe.fenced_secs / r.pipe.unfenced_secs - 1.0)
            )
        },
    );
    row("… floor: a script doing only INCRBY, keys/s", &|r| {
        thousands(r.pipe.fence_keys as f64 / r.pipe.incrby_only_secs)
    });
    row("… counts in Redis = events (3 + flush; 4)", &|r| {
        format!(
            "{}; {}",
            if r.pipe.flush_counted_ok {
                "yes"
            } else {
                "**NO**"
            },
            if r.pipe.base_counted_ok {
                "yes"
            } else {
                "**NO**"
            }
        )
    });

    println!("\n## tally-bench results\n");
    println!(
        "`{}` × {} cores, redis-server {}; {} messages per variant over {} partitions, {} batches{}; load average {} at start, {} at end; the run took {:.0} s.\n",
        m.cpu, m.cores, m.redis, thousands(m.total as f64), m.partitions, m.compression, if m.quick { " (--quick)" } else { "" }, m.load_start, m.load_end, m.secs
    );
    println!("{t}");
    println!(
        "**Event-to-visible latency** (tally live at {} events/s, a marker event every 10 ms, Redis polled every 2 ms): \
         p50 {}, p99 {}, max {} over {} markers; flush interval {:.0} ms; flush duration p50 / p99 meanwhile {} / {}.\n",
        thousands(lat.rate), ms(lat.p50), ms(lat.p99), ms(lat.max), lat.markers, lat.interval * 1e3, ms(lat.flush_p50), ms(lat.flush_p99)
    );
    println!(
        "**Memory probe** (decoder + aggregator without Kafka): RSS {:.0} MB → {:.0} MB with {} distinct keys pending ({:.0} bytes per key); \
         peak {:.0} MB while all of them are sealed and encoded for one flush as the sink does it (packed pipeline {:.0} MB, held twice).\n",
        mem.rss_before_mb, mem.rss_pending_mb, thousands(mem.pending as f64),
        (mem.rss_pending_mb - mem.rss_before_mb) * 1024.0 * 1024.0 / mem.pending.max(1) as f64, mem.hwm_mb, mem.encoded_mb
    );
    for r in results {
        let top: Vec<String> = r
            .e2e
            .threads
            .iter()
            .take(6)
            .map(|(n, c)| format!("{n} {c:.2} s"))
            .collect();
        println!(
            "**tally's CPU by thread** ({}: {:.2} s for {} msgs): {}\n",
            r.variant.name,
            r.e2e.cpu,
            thousands(r.e2e.messages),
            top.join(", ")
        );
    }

    println!("### Targets (issue 5)\n");
    let target = |ok: bool| if ok { "met" } else { "**not met**" };
    for r in results {
        let e2e = r.e2e.messages / r.e2e.secs;
        let consuming = r.e2e.messages / r.e2e.consume_secs;
        let raw = r.raw_parse_rate();
        let cpu = per_million(r.e2e.cpu, r.e2e.messages);
        let pipe = r.pipe.messages as f64 / r.pipe.agg_secs;
        println!(
            "- [{}] e2e ≥ 90% of raw read + parse: {:.0}% ({:.0}% while consuming) — {}; ≤ 1.0 CPU-s per million: {:.2} — {}; pipeline ≥ 2M msgs/s on one core: {} — {}",
            r.variant.name, 100.0 * e2e / raw, 100.0 * consuming / raw, target(e2e >= 0.9 * raw), cpu, target(cpu <= 1.0), thousands(pipe), target(pipe >= 2e6)
        );
    }
    println!(
        "- peak RSS < 200 MB with 1,000,000 keys pending: {:.0} MB with them pending, {:.0} MB while flushing them (memory probe, without librdkafka) — {}",
        mem.rss_pending_mb, mem.hwm_mb, target(mem.hwm_mb < 200.0)
    );
    for r in results {
        println!(
            "  - [{}] tally's peak RSS end-to-end: {:.0} MB with up to {} keys pending (raw read + parse consumer: {:.0} MB)",
            r.variant.name, r.e2e.peak_rss_mb, thousands(r.e2e.max_pending), r.raw_parse.peak_rss_mb
        );
    }
    if let Some(r) = results
        .iter()
        .find(|r| r.variant.name == "main")
        .or(results.first())
    {
        let s = sorted(&r.pipe.fenced_all);
        let worst = s.last().copied().unwrap_or(f64::NAN);
        println!(
            "- flush p99 < 50 ms at 100,000 keys per flush: an isolated flush of {} keys ({}) takes {} (median of {}), worst {}; in part 3 {} per 100,000 keys — {}",
            thousands(r.pipe.fence_keys as f64), r.variant.name, ms(percentile(&s, 0.5)), s.len(), ms(worst), ms(r.pipe_ms_per_100k() / 1e3), target(worst < 0.05)
        );
    }
    let limit = lat.interval + 0.05;
    println!(
        "- events visible within flush interval + 50 ms (p99): {} vs {} — {}",
        ms(lat.p99),
        ms(limit),
        target(lat.p99 <= limit)
    );
}
