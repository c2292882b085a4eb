//! `tally serve`: the request path (and queries, metrics, health) over HTTP, and Envoy's rate
//! limit service over gRPC when `rls.listen` is set ([`crate::rls`]), without consuming Kafka.
//! Ready while Redis answers a PING (probed every second); the RLS's gRPC health follows it.
//! The HTTP server, the RLS server and its reloader, the jobs and the probe run under one
//! [`Supervisor`]: the first that fails stops the others.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::Supervisor;
use crate::config::Model;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::request::Requests;

/// Serve until `shutdown` (or until a task fails).
pub async fn run(model: Arc<Model>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = Metrics::new(&model.counter_names()).with_status(0);
    let health = Arc::new(Health::without_kafka());
    let requests = Arc::new(Requests::new(&model, metrics.clone())?);
    let query = Arc::new(crate::query::Query::new(model.clone())?);
    let mut tasks = Supervisor::new(shutdown.clone());
    let (local, server) = crate::http::serve(
        &model.config.http,
        metrics.clone(),
        health.clone(),
        Some(query),
        Some(requests.clone()),
        shutdown.clone(),
    )
    .await
    .context("http")?;
    tracing::info!(%local, page = %format!("http://{local}/"), "serving the request path");
    tasks.spawn("the http server", async move {
        server.await.context("http server")
    });
    let mut rls_health = None;
    if !model.config.rls.listen.is_empty() {
        let tokens = crate::rls::Tokens {
            token: model.config.http.bearer_token()?,
            admin: model.config.http.admin_token.clone(),
        };
        let rls = crate::rls::serve(
            &model.config.rls,
            tokens,
            requests.client().clone(),
            metrics.clone(),
            shutdown.clone(),
        )
        .await
        .context("rls")?;
        tracing::info!(local = %rls.local, "serving envoy's rate limit service");
        tasks.spawn("the rls server", rls.server);
        tasks.spawn("the rls limits reloader", rls.reloader);
        rls_health = Some(rls.health);
    }
    let jobs = crate::jobs::run(model.clone(), metrics, shutdown.clone());
    tasks.spawn("the jobs", jobs);
    tasks.spawn(
        "the redis probe",
        probe(requests, health, rls_health, shutdown),
    );
    tasks
        .wait(model.config.flush.shutdown_grace + Duration::from_secs(10))
        .await
}

/// Keep `health.redis` (and the RLS's gRPC health status) up to date until `stop`.
async fn probe(
    requests: Arc<Requests>,
    health: Arc<Health>,
    rls: Option<crate::rls::HealthStatus>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    let mut reported = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = every.tick() => {
                let ok = requests
                    .client()
                    .query::<String>(&redis::cmd("PING"))
                    .await
                    .is_ok();
                if health.redis.swap(ok, Ordering::Relaxed) != ok {
                    tracing::info!(redis = ok, "redis reachability changed");
                }
                if let Some(rls) = rls.as_ref().filter(|_| reported != Some(ok)) {
                    rls.set(ok).await;
                    reported = Some(ok);
                }
            }
        }
    }
}
