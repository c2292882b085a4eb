//! Role `tally` (part 2): `tally::app::Tally` in its own process; how the parent starts it
//! and reads its `/metrics`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use tally::app::Tally;
use tally::config::Config;
use tally_testkit::http::Client;

use crate::child::{wait_for_stdin_eof, ChildRole};
use crate::config_toml;
use crate::proc_stats::unix_secs_f64;
use crate::store::Store;

pub fn role_tally(config: &Path, partitions: i64) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TALLY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let config = Config::load(Some(config), &serde_json::json!({}))?;
    let tally = Tally::new(tally::config::Model::compile(config)?);
    let metrics = tally.metrics.clone();
    // Tell the parent when every partition is assigned: measurement starts there.
    std::thread::Builder::new()
        .name("bench-watch".into())
        .spawn(move || loop {
            if metrics.consumer.assigned_partitions.get() >= partitions {
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
pub struct Scrape(String);

impl Scrape {
    pub fn get(port: u16) -> anyhow::Result<Scrape> {
        let answer = Client::new(Duration::from_secs(5)).get(port, "/metrics", &[])?;
        anyhow::ensure!(answer.status == 200, "/metrics: HTTP {}", answer.status);
        Ok(Scrape(answer.body))
    }

    /// The scrapes of several processes, as one: every sample line's value summed by name.
    pub fn sum(ports: &[u16]) -> anyhow::Result<Scrape> {
        let mut totals: Vec<(String, f64)> = Vec::new();
        for &port in ports {
            let one = Scrape::get(port)?;
            for line in one.0.lines().filter(|l| !l.starts_with('#')) {
                let Some((name, v)) = line.rsplit_once(' ') else {
                    continue;
                };
                let Ok(v) = v.trim().parse::<f64>() else {
                    continue;
                };
                match totals.iter_mut().find(|(n, _)| n == name) {
                    Some((_, t)) => *t += v,
                    None => totals.push((name.to_string(), v)),
                }
            }
        }
        Ok(Scrape(
            totals.iter().map(|(n, v)| format!("{n} {v}\n")).collect(),
        ))
    }

    pub fn value(&self, name: &str) -> f64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Quantile `q` of histogram `name`, interpolated linearly inside its bucket (like
    /// Prometheus' `histogram_quantile`).
    pub fn quantile(&self, name: &str, q: f64) -> f64 {
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

/// What every phase of the parent needs.
pub struct Ctx {
    pub broker_pid: u32,
    pub exe_args_partitions: i32,
    pub bootstrap: String,
    /// The standalone `redis-server` (parts 2, 3, 4 and latency).
    pub redis_url: String,
    pub perf: Option<PathBuf>,
    /// `--kafka-property` values (`key=value`), for the raw consumers and part 2.
    pub kafka_properties: Vec<String>,
}

/// What one tally process of part 2 is: its lanes, and the partitions it reports assigned at.
#[derive(Debug, Clone, Copy)]
pub struct Share {
    pub lanes: usize,
    pub partitions: i64,
    pub merge: bool,
}

/// Start tally on `topic` as `group`, writing to `store`. Returns the child, the port of its
/// `/metrics`, and its config file (to remove afterwards).
pub fn spawn_tally(
    ctx: &Ctx,
    store: &Store,
    topic: &str,
    group: &str,
    name: &str,
    kafka_properties: &str,
    share: Share,
) -> anyhow::Result<(ChildRole, u16, PathBuf)> {
    let partitions = share.partitions;
    let port = tally_testkit::local_redis::free_port()?;
    let mut properties = kafka_properties.to_string();
    for p in &ctx.kafka_properties {
        if let Some((k, v)) = p.split_once('=') {
            properties.push_str(&format!("\n{k:?} = {v:?}"));
        }
    }
    let path = std::env::temp_dir().join(format!("tally-bench-{}-{name}.toml", std::process::id()));
    std::fs::write(
        &path,
        config_toml(
            &ctx.bootstrap,
            topic,
            group,
            &store.redis_toml(),
            &format!("127.0.0.1:{port}"),
            &properties,
            share,
        ),
    )?;
    let child = ChildRole::spawn(
        &[
            "tally".into(),
            "--config".into(),
            path.display().to_string(),
            "--partitions".into(),
            partitions.to_string(),
        ],
        name,
    )?;
    Ok((child, port, path))
}
