//! Wiring: build every stage from a validated config and run them until shutdown.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use crate::aggregate::Counter;
use crate::config::{Config, KafkaConfig};
use crate::decode::{Decoder, FieldRole};
use crate::health::Health;
use crate::metrics::Metrics;

mod lane;

use lane::{Lane, Shared};

/// The decoder and compiled counters for `config` (also used by the benchmark).
pub fn build_stages(config: &Config) -> anyhow::Result<(Decoder, Vec<Counter>)> {
    let mut fields: Vec<(String, FieldRole)> = Vec::new();
    for c in &config.counters {
        for d in &c.dimensions {
            if !fields.iter().any(|(n, _)| n == d) {
                fields.push((d.clone(), FieldRole::Dimension));
            }
        }
        if let Some(m) = &c.member {
            if !fields.iter().any(|(n, _)| n == m) {
                fields.push((m.clone(), FieldRole::Dimension));
            }
        }
        if let Some(v) = &c.value_field {
            if !fields.iter().any(|(n, _)| n == v) {
                fields.push((v.clone(), FieldRole::Value));
            }
        }
    }
    let decoder = Decoder::new(&config.decode, &fields);
    let counters = crate::model::compile_all(&config.counters)?
        .iter()
        .map(|spec| {
            Counter::new(spec, |name| {
                decoder.field_index(name).expect("field registered above")
            })
        })
        .collect();
    Ok((decoder, counters))
}

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
        // librdkafka prefetches up to 64 MiB by default; 16 MiB (~160K typical events) keeps
        // the fetcher ahead of the consumer at a quarter of the memory.
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

/// One tally process: metrics and health are created up front so callers can observe them.
pub struct Tally {
    config: Config,
    /// Every exported metric.
    pub metrics: Metrics,
    /// Readiness of Kafka and Redis.
    pub health: Arc<Health>,
}

impl Tally {
    /// Prepare a process for a validated `config`.
    pub fn new(config: Config) -> Tally {
        let names: Vec<String> = config.counters.iter().map(|c| c.name.clone()).collect();
        Tally {
            health: Arc::new(Health::new(config.kafka.unreachable_after)),
            config,
            metrics: Metrics::new(&names),
        }
    }

    /// Run until `shutdown` is cancelled, then flush, commit and return.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let config = self.config;
        let lanes = config.kafka.consumers.resolve();
        let abort = CancellationToken::new();
        let close_gate = Arc::new(lane::CloseGate::new(lanes));
        let shared = Shared {
            config: &config,
            lanes,
            metrics: &self.metrics,
            health: &self.health,
            shutdown: &shutdown,
            abort: &abort,
            close_gate: &close_gate,
        };
        let grace = config.flush.shutdown_grace;
        let mut running = tokio::task::JoinSet::new();
        let mut failure: Option<anyhow::Error> = None;
        for index in 0..lanes {
            match Lane::start(&shared, index).await {
                Ok(lane) => {
                    running.spawn(lane.supervise(shutdown.clone(), abort.clone(), grace));
                }
                Err(e) if index == 0 => return Err(e),
                Err(e) => {
                    // The lanes already started flush what they have and stop; they do not wait
                    // at the close gate for lanes that never started.
                    for _ in index..lanes {
                        close_gate.arrive();
                    }
                    failure = Some(e.context(format!("starting consumer lane {index}")));
                    shutdown.cancel();
                    break;
                }
            }
        }

        let http_stop = CancellationToken::new();
        let mut http_task = None;
        if !config.http.listen.is_empty() && failure.is_none() {
            let query = Arc::new(crate::query::Query::new(&config)?);
            let requests = Arc::new(
                crate::request::Requests::new(&config, self.metrics.clone())?
                    .with_deferral(crate::request::Deferral::new(&config)?),
            );
            let (local, handle) = crate::http::serve(
                &config.http,
                self.metrics.clone(),
                self.health.clone(),
                Some(query),
                Some(requests),
                http_stop.clone(),
            )
            .await?;
            tracing::info!(%local, "serving /metrics and /health");
            http_task = Some(handle);
        }
        // Jobs led by one replica at a time; stopped with the HTTP server.
        let jobs = tokio::spawn(crate::jobs::run(
            config.clone(),
            self.metrics.clone(),
            http_stop.clone(),
        ));
        tracing::info!(topic = %config.kafka.topic, group = %config.kafka.group_id, lanes, "consuming");

        // The final flush is bounded by `grace`; closing the Kafka consumer can hang on a group
        // rebalance in progress, so it gets a bounded wait too. Nothing is lost if it is cut:
        // Redis holds the applied offsets.
        let limit = grace + Duration::from_secs(10);
        // Supervision: every lane and the HTTP server run until shutdown. If one stops on its
        // own, that is a failure: shutdown is cancelled (every lane flushes what it can and
        // commits) and the process exits non-zero.
        let finished = loop {
            tokio::select! {
                ended = running.join_next() => match ended {
                    None => break true,
                    Some(Ok(Ok(()))) => {}
                    Some(Ok(Err(e))) => { failure.get_or_insert(e); }
                    Some(Err(e)) => { failure.get_or_insert_with(|| anyhow::anyhow!("a consumer lane's supervisor failed: {e}")); }
                },
                ended = async { http_task.as_mut().expect("guarded").await }, if http_task.is_some() => {
                    http_task = None;
                    if !http_stop.is_cancelled() {
                        tracing::error!(?ended, "the http server stopped unexpectedly; shutting down");
                        failure.get_or_insert_with(|| anyhow::anyhow!("the http server stopped unexpectedly"));
                        shutdown.cancel();
                    }
                }
                _ = async { shutdown.cancelled().await; tokio::time::sleep(limit).await } => break false,
            }
        };
        if !finished {
            tracing::warn!(
                ?limit,
                "kafka consumer did not close in time; exiting anyway"
            );
            abort.cancel();
        }
        http_stop.cancel();
        // The job releases its leadership on the way out (bounded: one Redis call).
        let _ = tokio::time::timeout(Duration::from_secs(2), jobs).await;
        failure.map_or(Ok(()), Err)
    }
}
