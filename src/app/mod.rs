//! The application: the processes `tally run` ([`Tally`]: consumer lanes, HTTP, jobs) and
//! `tally serve` ([`serve`]: HTTP and jobs, no Kafka) built from one compiled [`Model`], every
//! long-lived task under one [`Supervisor`]. Wiring only: each stage builds itself from the
//! model (`Decoder::for_counters`, `Counter::for_decoder`, `Sink::new`, ...).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use anyhow::Context as _;

use crate::config::{KafkaConfig, Model};
use crate::health::Health;
use crate::metrics::Metrics;

mod lane;
pub mod serve;
mod supervisor;

use lane::{Lane, Shared};
pub use supervisor::Supervisor;

/// librdkafka settings: tally's required ones, sensible defaults, then the user's properties.
pub fn kafka_client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &kafka.brokers)
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // tally chooses every start offset itself (from Redis, or `start_from` for a partition
        // it never counted); this only applies when a chosen offset has been deleted meanwhile,
        // and "latest" would then skip the whole retained backlog.
        .set("auto.offset.reset", "earliest")
        // librdkafka's default (1000 ms) caps a fast consumer near 180K msg/s.
        .set("fetch.queue.backoff.ms", "10")
        // librdkafka prefetches up to 64 MiB by default, and each queued message costs a few
        // hundred bytes beyond its payload. 4 MiB (~45K typical events, tens of ms at full
        // speed) keeps the fetcher ahead of the consumer: at 16 MiB a plain consumer peaked at
        // 61 MB, at 4 MiB at 39 MB, consuming as fast (docs/benchmarks.md, issue 24).
        .set(
            "queued.max.messages.kbytes",
            lane::QUEUED_KBYTES.to_string(),
        )
        // Readiness hears from the statistics whether a broker is connected: report often
        // enough that `unreachable_after` spans at least three reports.
        .set(
            "statistics.interval.ms",
            statistics_interval_ms(kafka.unreachable_after).to_string(),
        )
        .set("session.timeout.ms", "10000");
    for (k, v) in &kafka.properties {
        cc.set(k, v);
    }
    cc
}

/// librdkafka's statistics interval for `unreachable_after`: a third of it, 100 ms to 5 s.
pub fn statistics_interval_ms(unreachable_after: Duration) -> u128 {
    (unreachable_after.as_millis() / 3).clamp(100, 5_000)
}

/// One `tally run` process: metrics and health are created up front so callers can observe them.
pub struct Tally {
    /// The configuration, compiled once.
    model: Arc<Model>,
    /// Every exported metric.
    pub metrics: Metrics,
    /// Readiness of Kafka and Redis.
    pub health: Arc<Health>,
}

impl Tally {
    /// Prepare a process for a compiled configuration.
    pub fn new(model: Arc<Model>) -> Tally {
        Tally {
            health: Arc::new(Health::new(model.config.kafka.unreachable_after)),
            metrics: Metrics::new(&model.counter_names()).with_status(model.config.status.hot_keys),
            model,
        }
    }

    /// Run until `shutdown` is cancelled (or a task fails), then flush, commit and return.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let config = &self.model.config;
        let lanes = config.kafka.consumers.resolve();
        let mut tasks = Supervisor::new(shutdown.clone());
        let close_gate = Arc::new(lane::CloseGate::new(lanes));
        let shared = Shared {
            model: &self.model,
            lanes,
            metrics: &self.metrics,
            health: &self.health,
            shutdown: &shutdown,
            deadline: &tasks.deadline().clone(),
            close_gate: &close_gate,
        };
        let grace = config.flush.shutdown_grace;
        for index in 0..lanes {
            match Lane::start(&shared, index).await {
                Ok(lane) => {
                    let deadline = tasks.deadline().clone();
                    tasks.spawn(
                        "a consumer lane",
                        lane.supervise(shutdown.clone(), deadline, grace),
                    );
                }
                Err(e) if index == 0 => return Err(e),
                Err(e) => {
                    // The lanes already started flush what they have and stop; they do not wait
                    // at the close gate for lanes that never started.
                    for _ in index..lanes {
                        close_gate.arrive();
                    }
                    tasks.fail(e.context(format!("starting consumer lane {index}")));
                    break;
                }
            }
        }
        if !shutdown.is_cancelled() {
            if let Err(e) = self.serve_http(&mut tasks).await {
                tasks.fail(e);
            }
            // Jobs led by one replica at a time.
            let jobs = crate::jobs::run(self.model.clone(), self.metrics.clone(), shutdown.clone());
            tasks.spawn("the jobs", jobs);
            let sampler = self.metrics.status.clone().run_sampler(shutdown.clone());
            tasks.spawn("the status sampler", sampler);
            tracing::info!(topic = %config.kafka.topic, group = %config.kafka.group_id, lanes, "consuming");
        }
        // The final flush is bounded by `grace`; closing the Kafka consumer can hang on a group
        // rebalance in progress, so it gets a bounded wait too. Nothing is lost if it is cut:
        // Redis holds the applied offsets.
        tasks.wait(grace + Duration::from_secs(10)).await
    }

    /// Start the HTTP server (metrics, health, queries, the request path) under `tasks`.
    async fn serve_http(&self, tasks: &mut Supervisor) -> anyhow::Result<()> {
        let config = &self.model.config;
        if config.http.listen.is_empty() {
            return Ok(());
        }
        let query = Arc::new(crate::query::Query::new(self.model.clone())?);
        let requests = Arc::new(
            crate::request::Requests::new(&self.model, self.metrics.clone())?
                .with_deferral(crate::request::Deferral::new(&self.model)),
        );
        let (local, server) = crate::http::serve(
            &config.http,
            self.metrics.clone(),
            self.health.clone(),
            Some(query),
            Some(requests),
            tasks.shutdown().clone(),
        )
        .await?;
        tracing::info!(%local, page = %format!("http://{local}/"), "serving /metrics, /health and the status page");
        tasks.spawn("the http server", async move {
            server.await.context("http server")
        });
        Ok(())
    }
}
