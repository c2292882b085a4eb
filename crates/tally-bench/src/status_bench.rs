//! `tally-status-bench`: what the status page costs: its weight (`GET /` and one
//! `GET /v1/status`), and the latency of `/v1/status` while `--pollers` pages are open, each
//! fetching it once a second like the page does, against a constant route (`/health/live`)
//! polled the same way in the same run, so the machine's own tail shows as such.
//!
//! ```sh
//! cargo build -p tally -p tally-bench        # or --release for both
//! tally-status-bench --demo                   # starts `tally demo` (port 9100) next to itself
//! tally-status-bench --port 9100 --token "$TALLY_TOKEN"   # any running tally
//! ```

mod alloc_switch;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use tally_testkit::http::Client;

#[derive(Parser, Clone)]
#[command(
    name = "tally-status-bench",
    about = "The status page: weight, and /v1/status latency with N open pages"
)]
struct Cli {
    /// tally's HTTP port on 127.0.0.1.
    #[arg(long, default_value_t = 9100)]
    port: u16,
    /// Bearer token of the `/v1` routes, if tally has one.
    #[arg(long, env = "TALLY_TOKEN")]
    token: Option<String>,
    /// Start `tally demo` (the `tally` binary next to this one) and measure it.
    #[arg(long)]
    demo: bool,
    /// The demo's events per second.
    #[arg(long, default_value_t = 3000)]
    rate: u64,
    /// The demo's distinct devices.
    #[arg(long, default_value_t = 2000)]
    keys: u64,
    /// Open pages: pollers, each fetching once a second.
    #[arg(long, default_value_t = 10)]
    pollers: usize,
    /// Seconds each route is polled.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
}

/// Kills the demo on drop.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_demo(cli: &Cli) -> anyhow::Result<Demo> {
    let exe = std::env::current_exe()?.with_file_name("tally");
    anyhow::ensure!(exe.exists(), "{} not built", exe.display());
    let child = Command::new(&exe)
        .args(["demo", "--rate", &cli.rate.to_string()])
        .args(["--keys", &cli.keys.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let demo = Demo(child);
    let client = Client::new(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(60);
    // Ready, and the status already shows the stream's figures (hot keys, partitions).
    while !client
        .get(cli.port, "/v1/status", &[])
        .is_ok_and(|a| a.status == 200 && a.body.contains("\"key\""))
    {
        anyhow::ensure!(Instant::now() < deadline, "tally demo did not come up");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(demo)
}

/// Every answer's latency (ms) and the failures, for one route.
#[derive(Default)]
struct Samples {
    ms: Vec<f64>,
    failed: usize,
}

/// `pollers` threads, each fetching `target` once a second for `seconds`, started spread over
/// the first second like pages opened at different moments.
fn poll(cli: &Cli, target: &'static str) -> Samples {
    let samples = Arc::new(Mutex::new(Samples::default()));
    let auth = cli.token.as_ref().map(|t| format!("Bearer {t}"));
    let threads: Vec<_> = (0..cli.pollers)
        .map(|i| {
            let (samples, auth, port) = (samples.clone(), auth.clone(), cli.port);
            let offset = Duration::from_millis(1000 * i as u64 / cli.pollers.max(1) as u64);
            let rounds = cli.seconds;
            std::thread::spawn(move || {
                let client = Client::new(Duration::from_secs(10));
                let headers: Vec<(&str, &str)> =
                    auth.iter().map(|a| ("Authorization", a.as_str())).collect();
                let start = Instant::now() + offset;
                for round in 0..rounds {
                    let at = start + Duration::from_secs(round);
                    if let Some(wait) = at.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let sent = Instant::now();
                    let ok = client
                        .get(port, target, &headers)
                        .is_ok_and(|a| a.status == 200);
                    let ms = sent.elapsed().as_secs_f64() * 1000.0;
                    let mut s = samples.lock().unwrap();
                    if ok {
                        s.ms.push(ms);
                    } else {
                        s.failed += 1;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Arc::try_unwrap(samples)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_default()
}

/// Nearest-rank percentile of sorted `v`.
fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn row(route: &str, mut s: Samples) {
    s.ms.sort_by(f64::total_cmp);
    println!(
        "| `{route}` | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
        s.ms.len(),
        s.failed,
        pct(&s.ms, 0.5),
        pct(&s.ms, 0.99),
        s.ms.last().copied().unwrap_or(f64::NAN)
    );
}

/// jemalloc, as `tally` (or glibc's malloc: `TALLY_BENCH_ALLOCATOR=system`).
#[global_allocator]
static ALLOCATOR: alloc_switch::Switch = alloc_switch::Switch;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _demo = if cli.demo {
        Some(start_demo(&cli)?)
    } else {
        None
    };
    let client = Client::default();
    let auth = cli.token.as_ref().map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let page = client.get(cli.port, "/", &[])?;
    let status = client.get(cli.port, "/v1/status", &headers)?;
    anyhow::ensure!(
        status.status == 200,
        "/v1/status answered {}",
        status.status
    );
    println!(
        "page weight: GET / {} bytes (status {}); GET /v1/status {} bytes",
        page.body.len(),
        page.status,
        status.body.len()
    );
    println!(
        "{} pollers, each once a second for {} s, per route:",
        cli.pollers, cli.seconds
    );
    println!("| route | answers | failed | p50 | p99 | max |\n|---|---|---|---|---|---|");
    row("/v1/status", poll(&cli, "/v1/status"));
    row("/health/live (constant)", poll(&cli, "/health/live"));
    Ok(())
}
