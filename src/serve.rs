//! `tally serve`: the request path (and queries, metrics, health) over HTTP, without consuming
//! Kafka. Ready while Redis answers a PING (probed every second).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::request::Requests;

/// Serve until `shutdown`; an HTTP server that stops by itself is an error.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let names: Vec<String> = config.counters.iter().map(|c| c.name.clone()).collect();
    let metrics = Metrics::new(&names);
    let health = Arc::new(Health::without_kafka());
    let requests = Arc::new(Requests::new(&config, metrics.clone())?);
    let query = Arc::new(crate::query::Query::new(&config)?);
    let stop = shutdown.child_token();
    let (local, mut server) = crate::http::serve(
        &config.http,
        metrics.clone(),
        health.clone(),
        Some(query),
        Some(requests.clone()),
        stop.clone(),
    )
    .await
    .context("http")?;
    tracing::info!(%local, "serving the request path");
    let jobs = tokio::spawn(crate::jobs::run(
        config.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    let mut probe = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            done = &mut server => {
                done.context("http server")?;
                anyhow::bail!("the http server stopped");
            }
            _ = probe.tick() => {
                let ok = requests
                    .client()
                    .query::<String>(&redis::cmd("PING"))
                    .await
                    .is_ok();
                if health.redis.swap(ok, Ordering::Relaxed) != ok {
                    tracing::info!(redis = ok, "redis reachability changed");
                }
            }
        }
    }
    let _ = server.await;
    let _ = jobs.await;
    Ok(())
}
