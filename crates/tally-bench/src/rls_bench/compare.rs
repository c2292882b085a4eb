//! Two `tally serve` children side by side: `--cluster` (one on a redis-server, one on a
//! 3-primary Redis Cluster with `rls.spread = "subject"`: Redis CPU is counted for the first
//! only), `--tls` (one plain h2c, one with
//! `[rls.tls]`: a private CA's EC P-256 certificate) and `--durability` (one answering once the
//! primary has a write, one waiting for a replica: `[request.durability] replicas = 1`). Both are
//! called at the same fixed offered rate by the lean client over `channels` shared connections
//! each, in alternating rounds (A, B, A, B, …) so that drift on the machine falls on both:
//! p50/p99 and the server's CPU per decision, and B ÷ A of the medians over the rounds.

use std::time::Duration;

use super::direct::{self, Targets};
use std::path::Path;

use tally_testkit::local_redis::{free_port, LocalRedis};

use super::h2conn::{tls_connector, GrpcConn};
use super::{alloc_switch, loadavg, Cli, Server};

/// One side: a label, its server, and (over TLS) the CA that signed its certificate.
pub struct Side<'a> {
    pub label: &'a str,
    pub server: &'a Server,
    pub ca: Option<&'a std::path::Path>,
}

pub struct Setup<'a> {
    /// What is compared (the section's title).
    pub title: &'a str,
    pub a: Side<'a>,
    pub b: Side<'a>,
    pub channels: usize,
    pub rate: u64,
    pub phase: Duration,
    pub rounds: usize,
}

pub async fn run(s: &Setup<'_>) -> anyhow::Result<()> {
    let mut conns = [Vec::new(), Vec::new()];
    for (i, side) in [&s.a, &s.b].into_iter().enumerate() {
        let tls = side.ca.map(tls_connector).transpose()?;
        for _ in 0..s.channels.max(1) {
            conns[i].push(GrpcConn::shared_over(side.server.rls, tls.as_ref()).await?);
        }
    }
    let sides = [
        (s.a.label, s.a.server, &conns[0]),
        (s.b.label, s.b.server, &conns[1]),
    ];
    // Warm up both: connections, scripts, pools.
    for (_, server, conns) in sides {
        let t = targets(server);
        direct::lean_fixed_rate(server, &t, conns, s.rate, Duration::from_millis(500)).await;
    }
    println!("## {}: the same offered rate, alternating\n", s.title);
    println!("| round | port | offered | decisions/s | p50 ms | p99 ms | p99.9 ms | p99 from due ms | tally's own p99 ms | errors | server CPU-s per 100K decisions | server allocations per decision | server context switches per decision | Redis CPU-s per 100K | client CPU-s per 100K | cores busy (all three) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Per side: (p99 ms, server CPU-s per 100K) of each round.
    let mut seen: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=s.rounds {
        for (i, (label, server, conns)) in sides.into_iter().enumerate() {
            let t = targets(server);
            let (mut p, used) = direct::lean_fixed_rate(server, &t, conns, s.rate, s.phase).await;
            let cpu = used.0.cpu / p.micros.len().max(1) as f64 * 100_000.0;
            seen[i].push((p.quantile_ms(0.99), cpu));
            direct::print_row(
                &format!("{round} | {label}"),
                &format!("{}/s", s.rate),
                &mut p,
                used,
            );
        }
    }
    let median = |side: usize, f: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<f64> = seen[side].iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p99, cpu) = (|r: &(f64, f64)| r.0, |r: &(f64, f64)| r.1);
    println!(
        "\n{} ÷ {}, medians of {} rounds: p99 {:.2}× ({:.2} vs {:.2} ms), server CPU per decision {:.2}× ({:.2} vs {:.2} CPU-s per 100K)",
        s.b.label,
        s.a.label,
        s.rounds,
        median(1, p99) / median(0, p99).max(1e-9),
        median(1, p99),
        median(0, p99),
        median(1, cpu) / median(0, cpu).max(1e-9),
        median(1, cpu),
        median(0, cpu),
    );
    Ok(())
}

fn targets(server: &Server) -> Targets {
    Targets {
        rls: server.rls,
        http: server.http,
    }
}

/// `--tls` or `--durability`: two servers compared.
pub(crate) fn only(
    cli: &Cli,
    redis: &LocalRedis,
    limits: &Path,
    dir: &Path,
    phase: Duration,
) -> anyhow::Result<()> {
    let pki = tally_testkit::certs::Pki::create(dir, "bench")?;
    let files = [pki.server.cert.clone(), pki.server.key.clone()];
    let workers = cli.server_workers;
    // --durability: a replica of the redis-server, kept for the run.
    let mut _replica = None;
    // --cluster: three primaries, kept for the run.
    let mut _cluster = None;
    let (title, a, b, ca) = if cli.cluster {
        let cluster = tally_testkit::local_redis::LocalCluster::start(3, 0)?;
        let nodes = format!("cluster:{}", cluster.urls().join(","));
        let a = Server::start(redis, limits, dir, workers, (cli.batch, None, 0))?;
        let b = Server::start_on(
            &nodes,
            None,
            limits,
            dir,
            workers,
            (cli.batch, None, 0),
            true,
        )?;
        _cluster = Some(cluster);
        (
            "Redis Cluster, keys spread by subject (rls.spread)",
            (a, "one redis-server"),
            (b, "3 primaries, spread = subject"),
            None,
        )
    } else if cli.durability {
        let port = free_port()?;
        let primary = redis.url();
        let primary_port = primary.rsplit(':').next().unwrap_or_default();
        _replica = Some(LocalRedis::start_on(
            port,
            &["--replicaof", "127.0.0.1", primary_port],
        )?);
        let a = Server::start(redis, limits, dir, workers, (cli.batch, None, 0))?;
        let b = Server::start(redis, limits, dir, workers, (cli.batch, None, 1))?;
        (
            "Waiting for a replica (request durability)",
            (a, "primary only"),
            (b, "WAIT 1 replica"),
            None,
        )
    } else {
        let a = Server::start(redis, limits, dir, workers, (cli.batch, None, 0))?;
        let b = Server::start(redis, limits, dir, workers, (cli.batch, Some(&files), 0))?;
        (
            "TLS on the RLS port",
            (a, "plain h2c"),
            (b, "TLS 1.3 (rustls)"),
            Some(pki.ca.as_path()),
        )
    };
    println!("# tally RLS benchmark: {title}\n");
    println!(
        "{} cores, load average at start {}; phases of {phase:?}; 40 callers over {} connections per server (lean client); offered rate {}/s; {} rounds; allocator {}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        cli.channels,
        cli.rate,
        cli.rounds,
        alloc_switch::name(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&Setup {
        title,
        a: Side {
            label: a.1,
            server: &a.0,
            ca: None,
        },
        b: Side {
            label: b.1,
            server: &b.0,
            ca,
        },
        channels: cli.channels,
        rate: cli.rate,
        phase,
        rounds: cli.rounds.max(1),
    }))?;
    println!("\nload average at the end {}", loadavg());
    Ok(())
}
