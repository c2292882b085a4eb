//! `tally-boundary-bench`: what a window boundary does to every client of a Redis.
//! One run, one `redis-server`, spread off then on:
//!
//! ```sh
//! cargo run --release -p tally-bench --bin tally-boundary-bench -- [--keys 100000] [--boundaries 3]
//! ```
//!
//! * **The stream**: tally's own `Decoder`, `Aggregator` and flush script (no Kafka: events come
//!   from memory) write one counter with short windows (`--window`, default 20 s) and
//!   `--retention` (default 10 s), `--keys` devices each counted once per window, all at the
//!   window's start: every window creates `--keys` keys (the first flush of a window, PEXPIREAT
//!   per key) and they all expire together at window end + retention — or, with the counter's
//!   default `expiry_spread`, each at its own moment within the spread.
//! * **The request path**: `--tasks` tasks calling a fixed-window rate limit
//!   (`tally_counters::request::RateLimiter`) on the same Redis, paced (one call per task per
//!   ms at most), every call's latency kept with its time.
//! * Each call is classed by when it started: in the seconds around an expiry instant (window
//!   end + retention, to the spread's end + 1.5 s, the same span for both modes), during a
//!   window's first flush, or between. Redis's own latency monitor
//!   (`latency-monitor-threshold 1`) is read and reset per mode (`LATENCY LATEST`).

#[path = "../alloc_switch.rs"]
mod alloc_switch;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tally_counters::request::{Algorithm, Client, FailureMode, LimitPolicy, RateLimiter};
use tally_testkit::local_redis::LocalRedis;

#[derive(Parser, Clone)]
#[command(
    name = "tally-boundary-bench",
    about = "Window boundaries: expiry spread off vs on"
)]
pub struct Cli {
    /// Keys each window creates (and that expire per boundary).
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Expiry instants measured per mode.
    #[arg(long, default_value_t = 3)]
    boundaries: usize,
    /// Window length, seconds (divides a minute).
    #[arg(long, default_value_t = 20)]
    window: u64,
    /// Retention, seconds: puts each window's expiry apart from the next window's first flush.
    #[arg(long, default_value_t = 10)]
    retention: u64,
    /// Concurrent request-path callers.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// The `expiry_spread` of the "on" mode, seconds (default: the counter's default spread).
    #[arg(long)]
    spread: Option<u64>,
}

/// One request-path call: when it started (Unix ms) and how long it took (µs).
#[derive(Clone, Copy)]
struct Sample {
    at_ms: i64,
    micros: u64,
}

/// What one mode measured.
struct ModeResult {
    label: &'static str,
    spread_ms: i64,
    samples: Vec<Sample>,
    stream: stream::StreamResult,
    latency: Vec<(String, i64, i64)>,
}

/// jemalloc, as `tally` (or glibc's malloc: `TALLY_BENCH_ALLOCATOR=system`).
#[global_allocator]
static ALLOCATOR: alloc_switch::Switch = alloc_switch::Switch;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let redis = LocalRedis::start(&["--latency-monitor-threshold", "1"])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!("# tally boundary benchmark\n");
    println!(
        "{} keys per window, windows of {} s, retention {} s, {} boundaries per mode, {} request tasks\n",
        cli.keys, cli.window, cli.retention, cli.boundaries, cli.tasks
    );
    let on = match cli.spread {
        Some(secs) => ("on", Some(Duration::from_secs(secs))),
        None => ("on (default)", None),
    };
    let modes = [("off", Some(Duration::ZERO)), on];
    // The stream's CPU for a window of new keys, in memory: 5 interleaved runs, the median.
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..5 {
        for (i, (_, spread)) in modes.iter().enumerate() {
            cpu[i].push(stream::aggregate_secs(&cli, *spread)?);
        }
    }
    let mut results = Vec::new();
    for (label, spread) in modes {
        results.push(rt.block_on(run_mode(&cli, &redis.url(), label, spread))?);
    }
    report(&cli, &results);
    println!("\n## Decode + aggregate + seal one window of new keys, in memory (median of 5)\n");
    println!("| spread | ms | ns per key |");
    println!("|---|---|---|");
    for ((label, _), mut runs) in modes.iter().zip(cpu) {
        runs.sort_by(f64::total_cmp);
        let mid = runs[runs.len() / 2];
        let per_key = mid * 1e9 / cli.keys as f64;
        println!("| {label} | {:.1} | {per_key:.0} |", mid * 1e3);
    }
    Ok(())
}

async fn run_mode(
    cli: &Cli,
    url: &str,
    label: &'static str,
    spread: Option<Duration>,
) -> anyhow::Result<ModeResult> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    let plan = stream::Plan::new(cli, url, spread)?;
    let spread_ms = plan.spread_ms();
    // Start right after a window boundary, with time to spare before the first one.
    let window_ms = cli.window as i64 * 1000;
    let start = (stream::now_ms() / window_ms + 1) * window_ms;
    tokio::time::sleep(Duration::from_millis(
        (start - stream::now_ms()).max(0) as u64
    ))
    .await;
    redis::cmd("LATENCY")
        .arg("RESET")
        .query_async::<i64>(&mut conn)
        .await?;
    let end_ms = start
        + (cli.boundaries as i64 - 1) * window_ms
        + window_ms
        + cli.retention as i64 * 1000
        + spread_ms
        + 3_000;
    let stream = std::thread::spawn(move || plan.run(start, end_ms));
    let samples = requests(url, cli.tasks, end_ms).await?;
    let stream = stream
        .join()
        .map_err(|_| anyhow::anyhow!("the stream thread panicked"))??;
    let latest: Vec<(String, i64, i64, i64)> = redis::cmd("LATENCY")
        .arg("LATEST")
        .query_async(&mut conn)
        .await?;
    let latency = latest
        .into_iter()
        .map(|(e, _, last, max)| (e, last, max))
        .collect();
    Ok(ModeResult {
        label,
        spread_ms,
        samples,
        stream,
        latency,
    })
}

/// `tasks` callers of a fixed-window limit until `end_ms`; every call's start and latency.
async fn requests(url: &str, tasks: usize, end_ms: i64) -> anyhow::Result<Vec<Sample>> {
    let client = Client::new(&tally_counters::config::RedisConfig {
        url: url.into(),
        ..Default::default()
    })?;
    let policy = LimitPolicy {
        name: "api".into(),
        algorithm: Algorithm::Fixed,
        limit: 1_000_000,
        window: Duration::from_secs(1),
        burst: None,
        shadow: false,
        on_redis_error: FailureMode::Closed,
        durability: None,
    };
    let limiter = Arc::new(RateLimiter::new(client, vec![policy])?);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let limiter = limiter.clone();
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0u64;
            while stream::now_ms() < end_ms {
                tick.tick().await;
                let subject = format!("s{}", (i * tasks as u64 + t as u64) % 1_000);
                i += 1;
                let (at_ms, started) = (stream::now_ms(), Instant::now());
                limiter.check(&["api"], &subject, 1).await?;
                let micros = started.elapsed().as_micros() as u64;
                out.push(Sample { at_ms, micros });
            }
            anyhow::Ok(out)
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await??);
    }
    Ok(all)
}

/// Percentiles (p50, p99, max) of `v`, µs.
fn percentiles(mut v: Vec<u64>) -> (u64, u64, u64) {
    if v.is_empty() {
        return (0, 0, 0);
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    (at(0.5), at(0.99), v[v.len() - 1])
}

fn report(cli: &Cli, results: &[ModeResult]) {
    // The same span around each expiry instant for both modes: the widest spread + 1.5 s.
    let span = results.iter().map(|r| r.spread_ms).max().unwrap_or(0) + 1_500;
    println!("## Request path (fixed-window limit), µs\n");
    println!("| spread | zone | calls | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for r in results {
        let zone = |s: &Sample| r.stream.zone(s.at_ms, span);
        for name in ["around expiry", "first flush", "between"] {
            let v: Vec<u64> = r
                .samples
                .iter()
                .filter(|s| zone(s) == Some(name))
                .map(|s| s.micros)
                .collect();
            let n = v.len();
            let (p50, p99, max) = percentiles(v);
            println!(
                "| {} ({} ms) | {name} | {n} | {p50} | {p99} | {max} |",
                r.label, r.spread_ms
            );
        }
    }
    println!(
        "\n## The stream's first flush of each window ({} new keys)\n",
        cli.keys
    );
    println!("| spread | flush seconds per window | keys created per window |");
    println!("|---|---|---|");
    for r in results {
        let secs: Vec<String> = r
            .stream
            .flushes
            .iter()
            .map(|f| format!("{:.2}", f.secs))
            .collect();
        let keys: Vec<String> = r
            .stream
            .flushes
            .iter()
            .map(|f| f.keys.to_string())
            .collect();
        println!(
            "| {} | {} | {} |",
            r.label,
            secs.join(", "),
            keys.join(", ")
        );
    }
    println!("\n## Redis LATENCY LATEST (threshold 1 ms), per mode\n");
    println!("| spread | event | latest ms | max ms |");
    println!("|---|---|---|---|");
    for r in results {
        if r.latency.is_empty() {
            println!("| {} | (none) | | |", r.label);
        }
        for (event, last, max) in &r.latency {
            println!("| {} | {event} | {last} | {max} |", r.label);
        }
    }
}
