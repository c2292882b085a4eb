//! What `tally run` and `tally serve` both serve: the HTTP port (the request path, queries,
//! metrics, health, the status page), Envoy's rate limit service over gRPC when `rls.listen` is
//! set ([`crate::api::rls`]), the jobs and the status sampler, all over one request-side Redis
//! client (multiplexed: concurrent calls pipeline over one connection per node).
//!
//! Without Kafka (`tally serve`) the process is ready while Redis answers a PING (probed every
//! second); the RLS's gRPC health follows the same probe in both roles.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context as _;
use tally_counters::request::Client;
use tokio_util::sync::CancellationToken;

use super::{Role, Supervisor, Tally};
use crate::api::primitives::{Deferral, Primitives};
use crate::api::query::Query;
use crate::config::Model;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;

/// `tally serve`: serve until `shutdown` (or until a task fails).
pub async fn run(model: Arc<Model>, shutdown: CancellationToken) -> anyhow::Result<()> {
    for section in model.config.ignored_by_serve() {
        tracing::warn!(
            section,
            "{section} is set but `tally serve` does not consume Kafka: it applies to `tally run` only"
        );
    }
    Tally::with_role(model, Role::Serve).run(shutdown).await
}

/// The parts a process's ports are built from.
pub(super) struct Ports<'a> {
    pub(super) model: &'a Arc<Model>,
    pub(super) role: Role,
    pub(super) metrics: &'a Metrics,
    pub(super) health: &'a Arc<Health>,
}

impl Ports<'_> {
    /// Bind the ports (a taken port fails start-up) and start every task under `tasks`.
    pub(super) async fn start(&self, tasks: &mut Supervisor) -> anyhow::Result<()> {
        let (model, metrics) = (self.model, self.metrics);
        let shutdown = tasks.shutdown().clone();
        let client = super::request_client(model)?;
        let mut requests = Primitives::new(model, client.clone(), metrics.clone())?;
        if self.role == Role::Run {
            // A hit Redis did not run can become an event of the topic this process consumes.
            if let Some(deferral) = Deferral::new(model) {
                requests = requests.with_deferral(deferral);
            }
        }
        let requests = Arc::new(requests);
        if self.role == Role::Serve {
            // `tally run` says it from its sink's first connection.
            let client = client.clone();
            tokio::spawn(async move {
                if let Ok(mut conn) = client.conn().await {
                    crate::stream::sink::warn_if_aof_loads_truncated(&mut conn).await;
                }
            });
        }
        self.start_http(tasks, &client, &requests).await?;
        let rls_health = self.start_rls(tasks, &client).await?;
        // Jobs are led by one replica at a time.
        let jobs = crate::jobs::run(
            model.clone(),
            client.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        tasks.spawn("the jobs", async move { Ok(jobs.await?) });
        let sampler = metrics.status.clone().run_sampler(shutdown.clone());
        tasks.spawn("the status sampler", async move {
            sampler.await;
            Ok(())
        });
        // With Kafka, the sinks report Redis's reachability; without, the probe does.
        let readiness = (self.role == Role::Serve).then(|| self.health.clone());
        if readiness.is_some() || rls_health.is_some() {
            let target = model.config.redis_target();
            let probe = probe(client, readiness, rls_health, target, shutdown);
            tasks.spawn("the redis probe", probe);
        }
        Ok(())
    }

    /// The HTTP port (`http.listen`, when set): the request path, queries, metrics and status.
    async fn start_http(
        &self,
        tasks: &mut Supervisor,
        client: &Client,
        requests: &Arc<Primitives>,
    ) -> anyhow::Result<()> {
        let (model, metrics) = (self.model, self.metrics);
        let config = &model.config;
        let shutdown = tasks.shutdown().clone();
        if config.http.listen.is_empty() {
            return Ok(());
        }
        {
            let query = Arc::new(Query::new(model.clone(), client.clone()));
            let (local, server) = crate::api::http::serve(
                &config.http,
                metrics.clone(),
                self.health.clone(),
                Some(query),
                Some(requests.clone()),
                model.tokens.clone(),
                shutdown.clone(),
            )
            .await
            .context("http")?;
            tracing::info!(%local, page = %format!("http://{local}/"), "serving the request path, /metrics, /health and the status page");
            tasks.spawn("the http server", async move {
                server.await.context("http server")
            });
        }
        Ok(())
    }

    /// Envoy's rate limit service (and its quota service), when `rls.listen` is set; its
    /// health, for the Redis probe.
    async fn start_rls(
        &self,
        tasks: &mut Supervisor,
        client: &Client,
    ) -> anyhow::Result<Option<crate::api::rls::HealthStatus>> {
        let (model, metrics) = (self.model, self.metrics);
        let config = &model.config;
        let shutdown = tasks.shutdown().clone();
        let mut rls_health = None;
        // Validation requires `rls.limits_file` with `rls.listen`, and the model loads it.
        let rls_file = model.rls_limits.clone().zip(config.rls.limits_file.clone());
        if let Some((limits, path)) = rls_file {
            // Envoy's quota service rides on the same port when limits are configured.
            let rlqs = (!config.rlqs.buckets.is_empty()).then(|| {
                crate::api::rlqs::Rlqs::new(
                    &config.rlqs,
                    client.durable(config.request.durability),
                    metrics.clone(),
                )
            });
            let rls = crate::api::rls::serve(
                &config.rls,
                crate::api::rls::LimitsFile { path, limits },
                rlqs,
                model.tokens.clone(),
                client.durable(config.request.durability),
                metrics.clone(),
                shutdown.clone(),
            )
            .await
            .context("rls")?;
            tracing::info!(local = %rls.local, "serving envoy's rate limit service");
            let (server, reloader) = (rls.server, rls.reloader);
            tasks.spawn("the rls server", async move { Ok(server.await?) });
            tasks.spawn(
                "the rls limits reloader",
                async move { Ok(reloader.await?) },
            );
            rls_health = Some(rls.health);
        }
        Ok(rls_health)
    }
}

/// Every second until `stop`: PING Redis, and keep `health.redis` (when given) and the RLS's
/// gRPC health status (when given) up to date.
async fn probe(
    client: Client,
    health: Option<Arc<Health>>,
    rls: Option<crate::api::rls::HealthStatus>,
    target: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut reported = None;
    // While Redis does not answer: a WARN at once, then one every 10 s (with how many held back).
    let log = crate::ops::log_limit::LogLimiter::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = every.tick() => {
                let answer = client.query::<String>(&redis::cmd("PING")).await;
                let ok = answer.is_ok();
                if let Some(health) = &health {
                    let was = health.redis.swap(ok, Ordering::Relaxed);
                    match &answer {
                        Err(e) => {
                            if let Some(suppressed) = log.allow() {
                                tracing::warn!(redis = %target, error = %e, suppressed, "redis unreachable: request-path calls answer 503 or decide by on_redis_error, not ready");
                            }
                        }
                        Ok(_) if !was => tracing::info!(redis = %target, "redis reachable"),
                        Ok(_) => {}
                    }
                }
                if let Some(rls) = rls.as_ref().filter(|_| reported != Some(ok)) {
                    rls.set(ok).await;
                    reported = Some(ok);
                }
            }
        }
    }
}
