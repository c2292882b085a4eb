//! Wiring: build every stage from a validated config and run them until shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::BaseConsumer;
use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use crate::aggregate::{Aggregator, Counter};
use crate::config::{Config, KafkaConfig};
use crate::consumer::{self, StateAccess, TallyContext, Worker};
use crate::decode::{Decoder, FieldRole};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::sink::{FenceScope, Sink};

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
        .set("queued.max.messages.kbytes", "16384")
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
        let (decoder, counters) = build_stages(&config)?;
        let scope = FenceScope::new(&config.redis, &config.kafka.group_id, &config.kafka.topic);
        let agg = Aggregator::new(counters, 1, config.flush.max_keys_per_call)
            .with_layout(scope.layout.clone());
        let mut sink = Sink::new(
            &config.redis,
            config.flush.clone(),
            scope,
            self.metrics.clone(),
            self.health.clone(),
        )
        .context("redis configuration")?;
        sink.preflight().await.map_err(|e| anyhow::anyhow!(e))?;
        let (sink_tx, sink_rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = CancellationToken::new();
        let mut sink_task = Some(tokio::spawn(sink.run(sink_rx, abort.clone())));

        let http_stop = CancellationToken::new();
        let mut http_task = None;
        if !config.http.listen.is_empty() {
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

        let mut worker = Worker::new(
            agg,
            decoder,
            sink_tx,
            self.metrics.clone(),
            config.kafka.topic.clone(),
            config.flush.clone(),
            StateAccess {
                start_from: config.kafka.start_from,
                recovery: config.recovery.clone(),
                health: self.health.clone(),
                init_timeout: config.redis.connect_timeout + config.redis.response_timeout,
            },
        );
        if let Some(topic) = &config.decode.dead_letter_topic {
            let dlq = crate::consumer::DeadLetters::new(&config.kafka, topic, self.metrics.clone())
                .context("dead-letter producer")?;
            worker = worker.with_dead_letters(dlq);
        }
        let ctx = TallyContext::new(worker, self.health.clone(), shutdown.clone());
        let consumer: BaseConsumer<TallyContext> = kafka_client_config(&config.kafka)
            .create_with_context(ctx)
            .context("kafka configuration")?;
        let grace = config.flush.shutdown_grace;
        tracing::info!(topic = %config.kafka.topic, group = %config.kafka.group_id, "consuming");
        // The thread reports its end over a channel rather than being joined from a blocking
        // task: if closing the Kafka consumer hangs, the process can still exit.
        let (done_tx, mut join) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("tally-consumer".into())
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    consumer::run(consumer, grace)
                }));
                let _ = done_tx.send(result);
            })?;
        // The final flush is bounded by `grace`; closing the Kafka consumer can hang on a group
        // rebalance in progress, so it gets a bounded wait too. Nothing is lost if it is cut:
        // Redis holds the applied offsets.
        let limit = grace + Duration::from_secs(10);
        // Supervision: the sink and the HTTP server run until the consumer is done. If either
        // stops on its own, that is a failure: shutdown is cancelled (the consumer flushes what
        // it can and commits) and the process exits non-zero.
        let mut failure: Option<anyhow::Error> = None;
        let joined = loop {
            tokio::select! {
                joined = &mut join => break Some(joined),
                ended = async { sink_task.as_mut().expect("guarded").await }, if sink_task.is_some() => {
                    sink_task = None;
                    // After shutdown the consumer drops its sender and the sink ends normally.
                    if !shutdown.is_cancelled() || ended.is_err() {
                        tracing::error!(?ended, "the redis sink stopped unexpectedly; shutting down");
                        failure.get_or_insert_with(|| anyhow::anyhow!("the redis sink stopped unexpectedly"));
                        shutdown.cancel();
                    }
                }
                ended = async { http_task.as_mut().expect("guarded").await }, if http_task.is_some() => {
                    http_task = None;
                    if !http_stop.is_cancelled() {
                        tracing::error!(?ended, "the http server stopped unexpectedly; shutting down");
                        failure.get_or_insert_with(|| anyhow::anyhow!("the http server stopped unexpectedly"));
                        shutdown.cancel();
                    }
                }
                _ = async { shutdown.cancelled().await; tokio::time::sleep(limit).await } => break None,
            }
        };
        let Some(joined) = joined else {
            tracing::warn!(
                ?limit,
                "kafka consumer did not close in time; exiting anyway"
            );
            abort.cancel();
            http_stop.cancel();
            return failure.map_or(Ok(()), Err);
        };

        // The consumer (and with it the sink's sender) is gone: the sink finishes what it has.
        if let Some(task) = sink_task {
            if tokio::time::timeout(grace, task).await.is_err() {
                abort.cancel();
            }
        }
        http_stop.cancel();
        // The job releases its leadership on the way out (bounded: one Redis call).
        let _ = tokio::time::timeout(Duration::from_secs(2), jobs).await;
        if let Some(failure) = failure {
            return Err(failure);
        }
        match joined {
            Ok(Ok(result)) => result.context("kafka consumer"),
            Ok(Err(_)) => anyhow::bail!("consumer thread panicked"),
            Err(_) => anyhow::bail!("consumer thread ended without a result"),
        }
    }
}
