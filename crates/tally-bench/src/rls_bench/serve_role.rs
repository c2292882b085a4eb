//! The `serve` role: `tally serve` in this binary, so that its CPU and allocations are its own.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{allocs, LIMIT};

/// [`Options`] as the `serve` role's command line gives them.
pub(crate) type ServeOptions = (Option<(usize, usize)>, Option<Vec<PathBuf>>, u32);

/// The `serve` role: the RLS and the HTTP request path with the same fixed-window policy.
pub(crate) fn serve(
    redis: String,
    http: u16,
    rls: u16,
    limits: &Path,
    (batch, tls, wait_replicas): ServeOptions,
    spread_subject: bool,
) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .try_init();
    let mut config = tally::config::Config::default();
    match redis.strip_prefix("cluster:") {
        Some(nodes) => {
            config.redis.mode = tally_counters::config::RedisMode::Cluster;
            config.redis.nodes = nodes.split(',').map(str::to_string).collect();
        }
        None => config.redis.url = redis,
    }
    if spread_subject {
        config.rls.spread = tally::config::Spread::Subject;
    }
    config.http.listen = format!("127.0.0.1:{http}");
    config.http.max_connections = 4096;
    config.rls.listen = format!("127.0.0.1:{rls}");
    config.rls.limits_file = Some(limits.to_path_buf());
    config.request.durability.replicas = wait_replicas;
    if let Some([cert, key]) = tls.as_deref() {
        config.rls.tls.cert_file = Some(cert.clone());
        config.rls.tls.key_file = Some(key.clone());
    }
    if let Some((max_calls, in_flight)) = batch {
        config.request.batch.max_calls = max_calls;
        config.request.batch.in_flight = in_flight;
    }
    config
        .request
        .limits
        .push(tally_counters::request::LimitPolicy {
            name: "per_user".into(),
            algorithm: tally_counters::request::Algorithm::Fixed,
            limit: LIMIT,
            window: Duration::from_secs(3600),
            burst: None,
            shadow: false,
            on_redis_error: tally_counters::request::FailureMode::Closed,
            durability: None,
        });
    // Envoy's quota service on the same port, for part 3's third row: a limit nothing reaches.
    config.rlqs.buckets.push(tally::config::RlqsBucket {
        domain: "bench".into(),
        name: "bench".into(),
        matches: Default::default(),
        limit: u64::from(u32::MAX),
        window: Duration::from_secs(3600),
    });
    let model = tally::config::Model::compile(config)?;
    allocs::enable();
    let stop = tokio_util::sync::CancellationToken::new();
    let runtime = tokio::runtime::Runtime::new()?;
    let server = runtime.spawn(tally::app::serve::run(model, stop.clone()));
    // Until the parent closes stdin (or dies); each line asks for the allocation count.
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", allocs::total()).and_then(|()| out.flush());
    }
    stop.cancel();
    runtime.block_on(server)??;
    Ok(())
}
