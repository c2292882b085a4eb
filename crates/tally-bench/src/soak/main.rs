//! `tally-soak`: tally under steady mixed load for a long time, with its resources sampled and
//! every key compared with the truth at the end (`scripts/soak.sh DURATION` runs it):
//!
//! ```sh
//! cargo build -p tally -p tally-bench --bin tally --bin tally-soak
//! target/debug/tally-soak --duration 30m --out target/soak
//! ```
//!
//! It starts a redis-server, `tally mock-broker` and `tally run` (stream counter with 1-minute
//! windows, a request-path counter and a rate limit), produces events and sends hits and limit
//! decisions at steady rates, and every 10 s writes tally's RSS and open files and Redis'
//! clients, memory and key count to `samples.csv`. At the end it stops the load, waits until
//! tally has applied every event, compares every live key with the truth, and writes
//! `verdict.csv`: each series' slope over the last two thirds of the run against its bound.
//! Exit code 0 only when every series is flat and no key differs.

#[path = "../alloc_switch.rs"]
mod alloc_switch;
mod load;
mod sample;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use tally_testkit::local_redis::{free_port, LocalRedis};
use tally_testkit::wait::wait_until;

use crate::load::Truth;
use crate::sample::Sample;

const TOPIC: &str = "soak";
const PARTITIONS: i32 = 4;
const GROUP: &str = "soak";

#[derive(Parser)]
#[command(name = "tally-soak", about = "tally under steady load for a long time")]
struct Cli {
    /// How long the load runs ("30m", "2h").
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m")]
    duration: Duration,
    /// Events per second on the stream.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Request-path rounds per second (a hit and a rate-limit decision each).
    #[arg(long, default_value_t = 100)]
    request_rate: u64,
    /// Seconds between two samples.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    every: Duration,
    /// Where samples.csv, verdict.csv, tally.toml and tally.log go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
    /// The tally binary.
    #[arg(long, default_value = "target/debug/tally")]
    tally: PathBuf,
    /// The Kafka broker: `mock` (`tally mock-broker`, librdkafka's mock cluster, which keeps the
    /// log in memory and slows down as it grows) or `tansu` (SQLite storage; scripts/setup.sh).
    #[arg(long, default_value = "mock")]
    broker: String,
}

/// The broker the soak runs against, stopped on drop.
enum Broker {
    Mock(#[allow(dead_code)] Guard),
    Tansu(#[allow(dead_code)] tally_testkit::tansu::Tansu),
}

fn broker(cli: &Cli) -> anyhow::Result<(Broker, String)> {
    match cli.broker.as_str() {
        "mock" => start_broker(&cli.tally).map(|(g, b)| (Broker::Mock(g), b)),
        "tansu" => {
            let tansu = tally_testkit::tansu::Tansu::start()?;
            tansu.create_topic(TOPIC, PARTITIONS)?;
            let bootstrap = tansu.bootstrap();
            Ok((Broker::Tansu(tansu), bootstrap))
        }
        other => anyhow::bail!("--broker {other}: mock or tansu"),
    }
}

/// A child process killed on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(bootstrap: &str, redis: &str, port: u16) -> String {
    format!(
        r#"[kafka]
brokers = "{bootstrap}"
topic = "{TOPIC}"
group_id = "{GROUP}"
[redis]
url = "{redis}"
[flush]
interval = "200ms"
[http]
listen = "127.0.0.1:{port}"
[decode]
time_field = "ts"

[[counters]]
name = "soak_stream"
dimensions = ["app_id", "device_id"]
key = "soak:s:{{app_id}}:{{device_id}}:{{yyyyMMddHHmm}}"
window = "1m"
retention = "2m"

[[counters]]
name = "soak_hits"
dimensions = ["user"]
key = "soak:h:{{user}}:{{yyyyMMddHHmm}}"
window = "1m"
retention = "2m"

[[request.limits]]
name = "soak_gcra"
algorithm = "gcra"
limit = 1
window = "1s"
"#
    )
}

fn start_broker(tally: &PathBuf) -> anyhow::Result<(Guard, String)> {
    let mut child = Command::new(tally)
        .args(["mock-broker", "--topic", &format!("{TOPIC}:{PARTITIONS}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("tally mock-broker")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let bootstrap = line
        .trim()
        .strip_prefix("bootstrap=")
        .context("bootstrap= line")?
        .to_string();
    Ok((Guard(child), bootstrap))
}

fn applied(redis: &mut redis::Connection) -> Vec<i64> {
    (0..PARTITIONS)
        .map(|p| {
            redis::cmd("GET")
                .arg(format!("tally:applied:{GROUP}:{TOPIC}:{p}:0"))
                .query::<Option<i64>>(redis)
                .ok()
                .flatten()
                .unwrap_or(-1)
        })
        .collect()
}

/// Compare every live key with the truth: each `soak:*` key in Redis, and each key of the truth
/// whose window plus retention has not ended. Keys within 5 s of their expiry are left out (they
/// may vanish between reading and comparing). Returns (keys compared, mismatches).
fn compare(redis: &mut redis::Connection, truth: &BTreeMap<String, i64>) -> (usize, usize) {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("soak:*")
        .query(redis)
        .unwrap_or_default();
    let soon = chrono::Utc::now().timestamp_millis() + 5_000;
    keys.extend(
        truth
            .keys()
            .filter(|k| load::expires_at_ms(k).is_some_and(|at| at > soon))
            .cloned(),
    );
    keys.sort();
    keys.dedup();
    let (mut compared, mut mismatches) = (0, 0);
    for key in &keys {
        let value: Option<i64> = redis::cmd("GET").arg(key).query(redis).unwrap_or(None);
        if load::expires_at_ms(key).is_none_or(|at| at <= soon) {
            continue;
        }
        compared += 1;
        if value != truth.get(key).copied() {
            mismatches += 1;
            eprintln!(
                "soak: mismatch {key}: redis {value:?}, truth {:?}",
                truth.get(key)
            );
        }
    }
    (compared, mismatches)
}

/// jemalloc, as `tally` (or glibc's malloc: `TALLY_BENCH_ALLOCATOR=system`).
#[global_allocator]
static ALLOCATOR: alloc_switch::Switch = alloc_switch::Switch;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    let redis_server = LocalRedis::start(&[])?;
    let (_broker, bootstrap) = broker(&cli)?;
    let port = free_port()?;
    let cfg_path = cli.out.join("tally.toml");
    std::fs::write(&cfg_path, config(&bootstrap, &redis_server.url(), port))?;
    let tally = Guard(
        Command::new(&cli.tally)
            .args(["run", "--config"])
            .arg(&cfg_path)
            .env("TALLY_LOG", "info,librdkafka=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(cli.out.join("tally.log"))?)
            .spawn()
            .context("tally run")?,
    );
    let ready = || tally_testkit::http::get(port, "/health/ready").is_some_and(|r| r.0 == 200);
    anyhow::ensure!(
        wait_until(Duration::from_secs(60), ready),
        "tally never ready"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let truth: Truth = Arc::new(Mutex::new(BTreeMap::new()));
    let (sent, rounds, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let producer = {
        let (stop, truth, sent, bootstrap) = (stop.clone(), truth.clone(), sent.clone(), bootstrap);
        let rate = cli.rate;
        std::thread::spawn(move || {
            load::produce(&bootstrap, TOPIC, PARTITIONS, rate, stop, truth, sent)
        })
    };
    let requester = {
        let (stop, truth, rounds, errors) =
            (stop.clone(), truth.clone(), rounds.clone(), errors.clone());
        let rate = cli.request_rate;
        std::thread::spawn(move || load::requests(port, rate, stop, truth, rounds, errors))
    };

    let mut redis = redis::Client::open(redis_server.url())?.get_connection()?;
    let mut csv = std::fs::File::create(cli.out.join("samples.csv"))?;
    // lag_events: produced but not yet applied in Redis (tally falling behind shows here).
    writeln!(csv, "{},events,request_rounds,lag_events", Sample::HEADER)?;
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < cli.duration {
        let next = start + cli.every * (samples.len() as u32 + 1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let s = Sample::take(start.elapsed().as_secs_f64(), tally.0.id(), &mut redis)?;
        let mut line = Vec::new();
        s.write(&mut line)?;
        let line = String::from_utf8(line)?;
        let (events, reqs) = (sent.load(Ordering::Relaxed), rounds.load(Ordering::Relaxed));
        let done: i64 = applied(&mut redis).iter().map(|a| (*a).max(0)).sum();
        let lag = events as i64 - done;
        writeln!(csv, "{},{events},{reqs},{lag}", line.trim_end())?;
        csv.flush()?;
        eprintln!(
            "soak {:>5.0}s: {} events {events} requests {reqs} lag {lag}",
            s.t,
            line.trim_end()
        );
        samples.push(s);
    }
    stop.store(true, Ordering::Relaxed);
    let produced = producer.join().expect("producer thread")?;
    requester.join().expect("request thread");
    let caught_up = wait_until(Duration::from_secs(600), || applied(&mut redis) == produced);
    anyhow::ensure!(
        caught_up,
        "tally did not apply every event: {:?} of {produced:?}",
        applied(&mut redis)
    );
    let (compared, mismatches) = compare(&mut redis, &truth.lock().unwrap());
    let mut verdict = std::fs::File::create(cli.out.join("verdict.csv"))?;
    let flat = sample::verdict(&samples, &mut verdict)?;
    let errors = errors.load(Ordering::Relaxed);
    let summary = format!(
        "soak: {:?}, {} events, {} request rounds, {errors} request errors, {compared} live keys compared, {mismatches} mismatches, resources flat: {flat}",
        cli.duration,
        produced.iter().sum::<i64>(),
        rounds.load(Ordering::Relaxed)
    );
    writeln!(verdict, "# {summary}")?;
    eprintln!(
        "{}\n{summary}",
        std::fs::read_to_string(cli.out.join("verdict.csv"))?
    );
    drop(tally);
    anyhow::ensure!(
        flat && mismatches == 0 && errors == 0 && compared > 0,
        "soak failed"
    );
    Ok(())
}
