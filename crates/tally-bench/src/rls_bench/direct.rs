//! Part 1 and 2: `ShouldRateLimit` over gRPC vs `POST /v1/limit`, closed loop and at a fixed
//! offered rate, every caller a task of this process, `tally serve` in its own.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rand::RngExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::transport::Channel;

use super::h2conn::GrpcConn;
use super::pacing::{self, Arrivals};
use super::server_time::{self, Which};
use super::stats::Phase;
use super::{Server, Usage};

/// Where `tally serve` listens.
pub struct Targets {
    pub rls: u16,
    pub http: u16,
}

/// One caller's connection.
enum Caller {
    Grpc(RateLimitServiceClient<Channel>),
    Lean(Box<GrpcConn>),
    Http(HttpConn),
}

/// The paths compared.
#[derive(Clone, Copy)]
enum Path {
    /// tonic's client, the callers sharing `channels` connections.
    Grpc,
    /// The lean client ([`GrpcConn`]), the callers sharing `channels` connections.
    Lean,
    /// The lean client, one connection per caller.
    LeanOwn,
    /// `POST /v1/limit`, one hand-written HTTP/1.1 connection per caller.
    Http,
}

impl Path {
    /// The server's histogram of this path's decisions.
    fn which(self) -> Which {
        match self {
            Path::Http => Which::HttpLimit,
            _ => Which::Rls,
        }
    }
}

const PATHS: [(&str, Path); 4] = [
    ("gRPC, tonic client, shared connections", Path::Grpc),
    ("gRPC, lean client, shared connections", Path::Lean),
    ("gRPC, lean client, a connection each", Path::LeanOwn),
    ("HTTP POST /v1/limit", Path::Http),
];

fn request(user: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

impl Caller {
    /// One decision for `user`; true when it was answered OK (admitted).
    async fn call(&mut self, user: u32) -> bool {
        match self {
            Caller::Grpc(c) => c
                .should_rate_limit(request(user))
                .await
                .is_ok_and(|r| r.into_inner().overall_code == Code::Ok as i32),
            Caller::Lean(c) => c
                .call(&request(user))
                .await
                .is_ok_and(|r| r.overall_code == Code::Ok as i32),
            Caller::Http(h) => h.limit(user).await.is_ok_and(|s| s == 200),
        }
    }
}

pub async fn run(
    t: &Targets,
    tasks: usize,
    channels: usize,
    (rate, arrivals): (u64, Arrivals),
    phase: Duration,
    server: &Server,
) -> anyhow::Result<()> {
    let mut grpc = Vec::new();
    for _ in 0..channels.max(1) {
        grpc.push(
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", t.rls))
                .await?
                .max_decoding_message_size(1 << 20),
        );
    }
    let mut lean = Vec::new();
    for _ in 0..channels.max(1) {
        lean.push(GrpcConn::shared(t.rls).await?);
    }
    let callers = |path: Path, n: usize| {
        let grpc = &grpc;
        let lean = &lean;
        async move {
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                out.push(match path {
                    Path::Grpc => Caller::Grpc(grpc[i % grpc.len()].clone()),
                    Path::Lean => Caller::Lean(Box::new(lean[i % lean.len()].caller())),
                    Path::LeanOwn => Caller::Lean(Box::new(GrpcConn::connect(t.rls).await?)),
                    Path::Http => Caller::Http(HttpConn::connect(t.http).await?),
                });
            }
            anyhow::Ok(out)
        }
    };
    // Warm up: connections, scripts loaded, the server's pools.
    for (_, path) in PATHS {
        closed(callers(path, tasks).await?, Duration::from_millis(500)).await;
    }

    println!("## Direct: decisions/s and latency\n");
    println!("| path | offered | decisions/s | p50 ms | p99 ms | p99.9 ms | p99 from due ms | tally's own p99 ms | errors | server CPU-s per 100K decisions | server allocations per decision | server context switches per decision | Redis CPU-s per 100K | client CPU-s per 100K | cores busy (all three) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Each phase connects its own callers just before it runs: an HTTP connection left idle
    // during the other phase would be closed by the server's `http.header_timeout` (5 s).
    let mut rows = Vec::new();
    for (label, path) in PATHS {
        let callers = callers(path, tasks).await?;
        let (mut p, used) = observed(server, t, path, closed(callers, phase)).await;
        print_row(
            label,
            &format!("closed loop, {tasks} callers"),
            &mut p,
            used,
        );
        rows.push(p.per_second());
    }
    // 40 callers, each on its own schedule: `rate` in all.
    let n = 40usize;
    for (label, path) in PATHS {
        let callers = callers(path, n).await?;
        let run = async {
            match arrivals {
                Arrivals::Ticks => ticks(callers, rate, phase).await,
                _ => paced(callers, rate, arrivals, phase).await,
            }
        };
        let (mut p, used) = observed(server, t, path, run).await;
        print_row(
            label,
            &format!("{rate}/s, {}", arrivals.label()),
            &mut p,
            used,
        );
    }
    println!(
        "\ngRPC ÷ HTTP, closed loop decisions/s: {:.2}× (tonic client), {:.2}× (lean client, shared), {:.2}× (lean, a connection each)",
        rows[0] / rows[3].max(1e-9),
        rows[1] / rows[3].max(1e-9),
        rows[2] / rows[3].max(1e-9)
    );
    Ok(())
}

/// Run one phase, with what the server used meanwhile and tally's own p99 (its histogram).
async fn observed(
    server: &Server,
    t: &Targets,
    path: Path,
    phase: impl std::future::Future<Output = Phase>,
) -> (Phase, (Usage, Option<f64>)) {
    let before = server.usage();
    let own = server_time::read(t.http, path.which()).await;
    let p = phase.await;
    let used = server.usage() - before;
    let own = server_time::read(t.http, path.which())
        .await
        .quantile_ms_since(&own, 0.99);
    (p, (used, own))
}

pub(super) fn print_row(
    label: &str,
    offered: &str,
    p: &mut Phase,
    (used, own): (Usage, Option<f64>),
) {
    let decisions = p.micros.len().max(1) as f64;
    let per_100k = used.cpu / decisions * 100_000.0;
    let allocs = used.allocs as f64 / decisions;
    let switches = used.switches as f64 / decisions;
    let redis = used.redis_cpu / decisions * 100_000.0;
    let client = used.client_cpu / decisions * 100_000.0;
    let busy = (used.cpu + used.redis_cpu + used.client_cpu) / p.elapsed.as_secs_f64().max(1e-9);
    println!(
        "| {label} | {offered} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {per_100k:.2} | {allocs:.1} | {switches:.2} | {redis:.2} | {client:.2} | {busy:.2} |",
        p.per_second(),
        p.quantile_ms(0.5),
        p.quantile_ms(0.99),
        p.quantile_ms(0.999),
        match p.due_micros.is_empty() {
            true => "–".to_string(),
            false => format!("{:.2}", p.due_quantile_ms(0.99)),
        },
        own.map_or("–".to_string(), |ms| format!("{ms:.2}")),
        p.errors
    );
}

/// Every caller calls again as soon as it is answered, for `phase`.
async fn closed(callers: Vec<Caller>, phase: Duration) -> Phase {
    let started = Instant::now();
    let handles: Vec<_> = callers
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut p = Phase::default();
                while started.elapsed() < phase {
                    let user = rand::rng().random_range(0..10_000);
                    let t = Instant::now();
                    let ok = c.call(user).await;
                    p.micros.push(t.elapsed().as_micros() as u64);
                    p.errors += u64::from(!ok);
                }
                p
            })
        })
        .collect();
    collect(handles, started).await
}

/// `rate` calls per second in all, spaced by `arrivals` and handed to the callers in turn by
/// the pacer thread; each call is timed from sending it and from when it was due (so a slow
/// answer is not hidden by the calls it delayed: no coordinated omission).
async fn paced(callers: Vec<Caller>, rate: u64, arrivals: Arrivals, phase: Duration) -> Phase {
    let started = Instant::now() + Duration::from_millis(5);
    let dues = pacing::start(arrivals, callers.len(), rate, started, phase);
    let handles: Vec<_> = callers
        .into_iter()
        .zip(dues)
        .map(|(mut c, mut dues)| {
            tokio::spawn(async move {
                let mut p = Phase::default();
                while let Some(due) = dues.recv().await {
                    call_due(&mut c, due, &mut p).await;
                }
                p
            })
        })
        .collect();
    collect(handles, started).await
}

/// The same on tokio's timer (the default): each caller on its own schedule (period = callers ÷
/// rate, staggered), woken on 1 ms ticks (see [`pacing`]).
async fn ticks(callers: Vec<Caller>, rate: u64, phase: Duration) -> Phase {
    let n = callers.len() as u64;
    let period = Duration::from_nanos(n * 1_000_000_000 / rate.max(1));
    let started = Instant::now();
    let handles: Vec<_> = callers
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let first = started + period * i as u32 / n as u32;
            tokio::spawn(async move {
                let mut p = Phase::default();
                let mut due = first;
                while due < started + phase {
                    tokio::time::sleep_until(due.into()).await;
                    call_due(&mut c, due, &mut p).await;
                    due += period;
                }
                p
            })
        })
        .collect();
    collect(handles, started).await
}

/// One call that was due at `due`, timed from sending it and from `due`, into `p`.
async fn call_due(c: &mut Caller, due: Instant, p: &mut Phase) {
    let user = rand::rng().random_range(0..10_000);
    let sent = Instant::now();
    let ok = c.call(user).await;
    p.micros.push(sent.elapsed().as_micros() as u64);
    p.due_micros.push(due.elapsed().as_micros() as u64);
    p.errors += u64::from(!ok);
}

async fn collect(handles: Vec<tokio::task::JoinHandle<Phase>>, started: Instant) -> Phase {
    let mut all = Phase::default();
    for h in handles {
        if let Ok(p) = h.await {
            all.merge(p);
        }
    }
    all.elapsed = started.elapsed();
    all
}

/// One keep-alive HTTP/1.1 connection posting `/v1/limit` (the bytes written by hand: the
/// client costs next to nothing).
struct HttpConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl HttpConn {
    async fn connect(port: u16) -> anyhow::Result<HttpConn> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(HttpConn {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// The status of one `POST /v1/limit`.
    async fn limit(&mut self, user: u32) -> anyhow::Result<u16> {
        let body = format!(r#"{{"policy":"per_user","subject":"{user}"}}"#);
        let req = format!(
            "POST /v1/limit HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(req.as_bytes()).await?;
        self.buf.clear();
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end])?;
                let status: u16 = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| anyhow::anyhow!("bad status line"))?;
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .ok_or_else(|| anyhow::anyhow!("no content-length"))?;
                while self.buf.len() < end + 4 + length {
                    self.read().await?;
                }
                return Ok(status);
            }
            self.read().await?;
        }
    }

    async fn read(&mut self) -> anyhow::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "connection closed");
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The fixed-rate phase over the lean client's shared connections `conns` (40 callers in all, as
/// in part 2), with what the server used meanwhile and tally's own p99.
pub(super) async fn lean_fixed_rate(
    server: &Server,
    t: &Targets,
    conns: &[GrpcConn],
    rate: u64,
    phase: Duration,
) -> (Phase, (Usage, Option<f64>)) {
    let callers = (0..40)
        .map(|i| Caller::Lean(Box::new(conns[i % conns.len()].caller())))
        .collect();
    observed(server, t, Path::Lean, ticks(callers, rate, phase)).await
}
