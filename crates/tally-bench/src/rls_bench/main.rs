//! `tally-rls-bench`: Envoy's rate limit service, side by side in one run:
//!
//! ```sh
//! cargo run --release -p tally-bench --bin tally-rls-bench -- [--quick]
//! ```
//!
//! `tally serve` (RLS and HTTP, this binary re-executed in its hidden `serve` role, so its CPU
//! is its own) on a real redis-server beside it, then:
//!
//! 1. **Direct, closed loop**: `ShouldRateLimit` over gRPC (Envoy's generated stubs, `--tasks`
//!    concurrent callers over `--channels` HTTP/2 connections) vs `POST /v1/limit` (the HTTP
//!    JSON path, one keep-alive HTTP/1.1 connection per caller) for the same policy (a fixed
//!    window per user, 10,000 users, never reached): decisions/s, p50/p99.
//! 2. **Direct, fixed offered rate** (`--rate`, default 20,000/s) over gRPC, then HTTP: p50/p99
//!    measured from each call's scheduled time (a late answer delays no later call's clock).
//! 3. **Through Envoy**: `wrk` → Envoy → a trivial upstream (a fixed 200 from a raw socket
//!    server in this process), with and without the rate-limit filter (descriptor from `x-user`,
//!    random of 10,000): requests/s, p50/p99, and the filter's cost as ratios.
//!
//! With `--tls`, only the cost of TLS on the RLS port instead: a plain and a TLS `tally serve`
//! side by side at the fixed offered rate, in alternating rounds ([`compare`]). With
//! `--durability`, the cost of waiting for a replica the same way (a redis-server with one
//! replica; one server with `[request.durability] replicas = 1`). With `--cluster`, one server on a
//! redis-server against one on a 3-primary Redis Cluster with `rls.spread = "subject"`.

#[path = "../alloc_switch.rs"]
mod alloc_switch;
mod allocs;
mod direct;
mod envoy;
mod h2conn;
mod pacing;
// The stream bench's /proc readers (this binary uses one of them).
mod compare;
#[allow(dead_code)]
#[path = "../proc_stats.rs"]
mod proc_stats;
mod serve_role;
mod server_time;
mod stats;

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tally_testkit::local_redis::{free_port, LocalRedis};

#[derive(Parser)]
#[command(
    name = "tally-rls-bench",
    about = "Envoy's rate limit service, benchmarked"
)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    /// Shorter phases (1 s each instead of 5 s).
    #[arg(long)]
    quick: bool,
    /// Concurrent callers in the closed-loop phases.
    #[arg(long, default_value_t = 64)]
    tasks: usize,
    /// HTTP/2 connections the gRPC callers share (Envoy keeps one per worker thread).
    #[arg(long, default_value_t = 2)]
    channels: usize,
    /// Offered decisions/s of the fixed-rate phase.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// How the fixed-rate phase's calls are spaced.
    #[arg(long, value_enum, default_value_t = pacing::Arrivals::Ticks)]
    arrivals: pacing::Arrivals,
    /// wrk connections to Envoy.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Envoy worker threads (`--concurrency`).
    #[arg(long, default_value_t = 1)]
    envoy_concurrency: usize,
    /// Skip the Envoy part (no `envoy` on the PATH).
    #[arg(long)]
    no_envoy: bool,
    /// tokio worker threads of the `tally serve` child only (`TOKIO_WORKER_THREADS`, which
    /// tally's runtime reads); default: one per core.
    #[arg(long)]
    server_workers: Option<usize>,
    /// tokio worker threads of this process, the callers (default: one per core).
    #[arg(long)]
    client_workers: Option<usize>,
    /// The `tally serve` child's `[request.batch]`: `max_calls,in_flight` (default: tally's).
    #[arg(long, value_parser = parse_batch)]
    batch: Option<(usize, usize)>,
    /// Only the TLS comparison: plain and TLS RLS ports at `--rate`, alternating rounds.
    #[arg(long)]
    tls: bool,
    /// Only the durability comparison: answering once the primary has a write vs once a
    /// replica has it (`WAIT 1`), at `--rate`, alternating rounds.
    #[arg(long)]
    durability: bool,
    /// Only the cluster comparison: one redis-server vs a 3-primary Redis Cluster with
    /// `rls.spread = "subject"`, at `--rate` (set it above what one primary answers), alternating.
    #[arg(long)]
    cluster: bool,
    /// Rounds of the TLS comparison (each: a phase plain, a phase TLS).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

fn parse_batch(s: &str) -> Result<(usize, usize), String> {
    let (calls, in_flight) = s.split_once(',').ok_or("expected max_calls,in_flight")?;
    Ok((
        calls
            .trim()
            .parse()
            .map_err(|e| format!("max_calls: {e}"))?,
        in_flight
            .trim()
            .parse()
            .map_err(|e| format!("in_flight: {e}"))?,
    ))
}

#[derive(Subcommand)]
enum Role {
    /// `tally serve` until stdin closes.
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        redis: String,
        #[arg(long)]
        http: u16,
        #[arg(long)]
        rls: u16,
        #[arg(long)]
        limits: PathBuf,
        #[arg(long, value_parser = parse_batch)]
        batch: Option<(usize, usize)>,
        /// `[rls.tls]`: certificate and key files.
        #[arg(long, num_args = 2)]
        tls: Option<Vec<PathBuf>>,
        /// `[request.durability] replicas`.
        #[arg(long, default_value_t = 0)]
        wait_replicas: u32,
        /// `rls.spread`: `subject` (else `domain`).
        #[arg(long)]
        spread_subject: bool,
    },
}

#[global_allocator]
static ALLOCATOR: allocs::Counting = allocs::Counting;

/// The limit of both paths: never reached, so every decision is a charge.
pub const LIMIT: u64 = 1_000_000_000;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Role::Serve {
        redis,
        http,
        rls,
        limits,
        batch,
        tls,
        wait_replicas,
        spread_subject,
    }) = cli.role
    {
        return serve_role::serve(
            redis,
            http,
            rls,
            &limits,
            (batch, tls, wait_replicas),
            spread_subject,
        );
    }
    let phase = Duration::from_secs(if cli.quick { 1 } else { 5 });
    let redis = LocalRedis::start(&[])?;
    let dir = std::env::temp_dir().join(format!("tally-rls-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let limits = dir.join("limits.yaml");
    std::fs::write(
        &limits,
        format!(
            "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {{name: per_user, unit: hour, requests_per_unit: {LIMIT}}}\n"
        ),
    )?;
    if cli.tls || cli.durability || cli.cluster {
        return compare::only(&cli, &redis, &limits, &dir, phase);
    }
    let server = Server::start(
        &redis,
        &limits,
        &dir,
        cli.server_workers,
        (cli.batch, None, 0),
    )?;
    println!("# tally RLS benchmark\n");
    println!(
        "{} cores, load average at start {}; phases of {phase:?}; {} callers over {} gRPC channels; offered rate {}/s, {} arrivals; server workers {}; client workers {}; batch {}; allocator {}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        cli.tasks,
        cli.channels,
        cli.rate,
        cli.arrivals.label(),
        cli.server_workers
            .map_or("one per core".to_string(), |n| n.to_string()),
        cli.client_workers
            .map_or("one per core".to_string(), |n| n.to_string()),
        cli.batch.map_or("tally's default".to_string(), |(c, f)| format!(
            "{c} calls, {f} in flight"
        )),
        alloc_switch::name(),
    );
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.client_workers {
        runtime.worker_threads(n);
    }
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(async {
        let targets = direct::Targets {
            rls: server.rls,
            http: server.http,
        };
        direct::run(
            &targets,
            cli.tasks,
            cli.channels,
            (cli.rate, cli.arrivals),
            phase,
            &server,
        )
        .await?;
        if cli.no_envoy {
            return Ok(());
        }
        envoy::run(&envoy::Setup {
            rls: server.rls,
            dir: dir.clone(),
            connections: cli.connections,
            concurrency: cli.envoy_concurrency,
            phase,
        })
        .await
    })?;
    println!("\nload average at the end {}", loadavg());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The 1-, 5- and 15-minute load averages.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A server's `[request.batch]` (`max_calls`, `in_flight`), `[rls.tls]` certificate and key, and
/// `[request.durability] replicas`.
pub type Options<'a> = (Option<(usize, usize)>, Option<&'a [PathBuf; 2]>, u32);

/// `tally serve` in a child process (this binary's `serve` role).
pub struct Server {
    child: Child,
    /// Asks for the allocation count (a line each); closed, the server stops.
    ask: Mutex<Option<(ChildStdin, std::io::BufReader<ChildStdout>)>>,
    pub rls: u16,
    pub http: u16,
    /// The redis-server beside it, whose CPU is counted too.
    redis_pid: Option<u32>,
}

impl Server {
    fn start(
        redis: &LocalRedis,
        limits: &Path,
        dir: &Path,
        workers: Option<usize>,
        options: Options<'_>,
    ) -> anyhow::Result<Server> {
        Server::start_on(
            &redis.url(),
            redis.pid(),
            limits,
            dir,
            workers,
            options,
            false,
        )
    }

    /// [`Server::start`] on `redis` (a URL, or `cluster:<url>,<url>,…`), counting the CPU of
    /// the redis-server `redis_pid`; `spread_subject`: `rls.spread = "subject"`.
    pub(crate) fn start_on(
        redis: &str,
        redis_pid: Option<u32>,
        limits: &Path,
        dir: &Path,
        workers: Option<usize>,
        (batch, tls, wait_replicas): Options<'_>,
        spread_subject: bool,
    ) -> anyhow::Result<Server> {
        let (http, rls) = (free_port()?, free_port()?);
        let mut command = Command::new(std::env::current_exe()?);
        if let Some(n) = workers {
            command.env("TOKIO_WORKER_THREADS", n.to_string());
        }
        command
            .args(["serve", "--redis", redis])
            .args(["--http", &http.to_string(), "--rls", &rls.to_string()])
            .arg("--limits")
            .arg(limits);
        if let Some((calls, in_flight)) = batch {
            command.args(["--batch", &format!("{calls},{in_flight}")]);
        }
        if let Some([cert, key]) = tls {
            command.arg("--tls").arg(cert).arg(key);
        }
        command.args(["--wait-replicas", &wait_replicas.to_string()]);
        if spread_subject {
            command.arg("--spread-subject");
        }
        let log = dir.join(format!("serve-{rls}.log"));
        let child = command
            .env("TALLY_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("spawning tally serve")?;
        let mut child = child;
        let ask = child
            .stdin
            .take()
            .zip(child.stdout.take().map(std::io::BufReader::new));
        let server = Server {
            child,
            ask: Mutex::new(ask),
            rls,
            http,
            redis_pid,
        };
        for port in [http, rls] {
            let deadline = Instant::now() + Duration::from_secs(60);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                anyhow::ensure!(Instant::now() < deadline, "tally serve did not listen");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(server)
    }

    /// User + system CPU seconds of the server process so far.
    pub fn cpu_seconds(&self) -> f64 {
        proc_stats::proc_cpu(self.child.id())
    }
}

impl Server {
    /// Allocations the server process has made so far (its counting allocator; 0 if it does
    /// not answer).
    pub fn allocations(&self) -> u64 {
        let mut ask = self.ask.lock().unwrap_or_else(|e| e.into_inner());
        let Some((stdin, stdout)) = ask.as_mut() else {
            return 0;
        };
        let mut line = String::new();
        let asked = writeln!(stdin, "allocs").and_then(|()| stdin.flush());
        if asked.is_err() || stdout.read_line(&mut line).is_err() {
            return 0;
        }
        line.trim().parse().unwrap_or(0)
    }

    /// Context switches of all the server's threads so far (voluntary: a thread parked or
    /// waited; a measure of wake-ups per decision).
    pub fn context_switches(&self) -> u64 {
        let tasks = format!("/proc/{}/task", self.child.id());
        let Ok(dir) = std::fs::read_dir(tasks) else {
            return 0;
        };
        dir.flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .flat_map(|status| {
                status
                    .lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// CPU seconds, allocations and context switches so far, to subtract.
    pub fn usage(&self) -> Usage {
        Usage {
            cpu: self.cpu_seconds(),
            redis_cpu: self.redis_pid.map_or(0.0, proc_stats::proc_cpu),
            client_cpu: proc_stats::proc_cpu(std::process::id()),
            allocs: self.allocations(),
            switches: self.context_switches(),
        }
    }
}

/// The server's use of the machine, from [`Server::usage`].
#[derive(Clone, Copy)]
pub struct Usage {
    pub cpu: f64,
    /// The redis-server's CPU seconds.
    pub redis_cpu: f64,
    /// This process' (the callers') CPU seconds.
    pub client_cpu: f64,
    pub allocs: u64,
    pub switches: u64,
}

impl std::ops::Sub for Usage {
    type Output = Usage;

    fn sub(self, before: Usage) -> Usage {
        Usage {
            cpu: self.cpu - before.cpu,
            redis_cpu: self.redis_cpu - before.redis_cpu,
            client_cpu: self.client_cpu - before.client_cpu,
            allocs: self.allocs.saturating_sub(before.allocs),
            switches: self.switches.saturating_sub(before.switches),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.ask.lock().map(|mut a| a.take()));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
