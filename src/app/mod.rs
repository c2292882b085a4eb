//! The application: the processes `tally run` and `tally serve`, both a [`Tally`] built by one
//! function from one compiled [`Model`] (they differ by [`Role`]: `run` adds the consumer
//! lanes, [`lane`]), every long-lived task under one [`Supervisor`]. [`serve`] starts what both
//! serve: HTTP, Envoy's RLS, the jobs, over one request-side Redis client. Wiring only: each
//! stage builds itself from the model (`Decoder::for_counters`, `Counter::for_decoder`,
//! `Sink::new`, ...).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use crate::config::{KafkaConfig, Model};
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::stream::decode::DecodeError;

mod discover;
mod lane;
pub mod serve;
mod supervisor;

use lane::{Lane, LaneShared};
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
        // 61 MB, at 4 MiB at 39 MB, consuming as fast (docs/lab/benchmarks.md).
        .set(
            "queued.max.messages.kbytes",
            lane::QUEUED_KBYTES.to_string(),
        )
        // Readiness hears from the statistics whether a broker is connected: report often
        // enough that `unreachable_after` spans at least three reports.
        .set(
            "statistics.interval.ms",
            crate::config::statistics_interval_ms(kafka.unreachable_after).to_string(),
        )
        .set("session.timeout.ms", "10000")
        // Incremental rebalances: a member joining or leaving (a lane, a replica, a rolling
        // deploy) moves only the partitions that must move; every other partition keeps
        // counting through the rebalance. (The eager protocol revokes every partition of every
        // member first.) A group whose members still use the eager assignors needs
        // `partition.assignment.strategy` set to them in `[kafka.properties]` until all are
        // upgraded: the two protocols cannot share a group.
        .set("partition.assignment.strategy", "cooperative-sticky");
    for (k, v) in &kafka.properties {
        cc.set(k, v);
    }
    cc
}

/// The process's one request-side Redis client (multiplexed, batching per `request.batch`),
/// shared by the request path, queries, the RLS and the jobs.
pub fn request_client(model: &Model) -> anyhow::Result<tally_counters::request::Client> {
    let config = &model.config;
    Ok(tally_counters::request::Client::with_batching(
        &config.redis,
        config.request.batch.batching(),
    )?)
}

/// What a process does besides serving the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `tally run`: consume Kafka too (`kafka.consumers` lanes); readiness follows the brokers.
    Run,
    /// `tally serve`: the request path, queries, jobs and the RLS only; no Kafka.
    Serve,
}

/// One process (`tally run` or `tally serve`), wired by one function: metrics and health are
/// created up front so callers can observe them.
pub struct Tally {
    /// The configuration, compiled once.
    model: Arc<Model>,
    /// What the process runs.
    role: Role,
    /// Every exported metric.
    pub metrics: Metrics,
    /// Readiness of Kafka and Redis.
    pub health: Arc<Health>,
}

impl Tally {
    /// Prepare a `tally run` process for a compiled configuration.
    pub fn new(model: Arc<Model>) -> Tally {
        Tally::with_role(model, Role::Run)
    }

    /// Prepare a process of either role.
    pub fn with_role(model: Arc<Model>, role: Role) -> Tally {
        let (health, hot_keys) = match role {
            Role::Run => (
                Health::new(model.config.kafka.unreachable_after),
                model.config.status.hot_keys,
            ),
            Role::Serve => (Health::without_kafka(), 0),
        };
        let metrics = Metrics::new(&model.counter_names()).with_status(hot_keys);
        if role == Role::Run {
            let topics = model.config.topics();
            let topics: Vec<&str> = topics.iter().map(|t| t.name).collect();
            let group = &model.config.kafka.group_id;
            metrics.status.set_consuming(group, &topics.join(", "));
        }
        metrics
            .decode
            .register_reasons(DecodeError::ALL.map(DecodeError::reason));
        Tally {
            health: Arc::new(health),
            metrics,
            model,
            role,
        }
    }

    /// Run until `shutdown` is cancelled (or a task fails), then flush, commit and return.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let config = &self.model.config;
        let mut tasks = Supervisor::new(shutdown.clone());
        if self.role == Role::Run {
            self.start_lanes(&mut tasks).await?;
        }
        if !shutdown.is_cancelled() {
            let ports = serve::Ports {
                model: &self.model,
                role: self.role,
                metrics: &self.metrics,
                health: &self.health,
            };
            if let Err(e) = ports.start(&mut tasks).await {
                tasks.fail(e);
            }
        }
        // The final flush is bounded by `grace`; closing the Kafka consumer can hang on a group
        // rebalance in progress, so it gets a bounded wait too. Nothing is lost if it is cut:
        // Redis holds the applied offsets.
        tasks
            .wait(config.flush.shutdown_grace + Duration::from_secs(10))
            .await
    }

    /// Start `kafka.consumers` consumer lanes per topic under `tasks`, all members of one group
    /// (an error starting lane 0 is the process's; a later lane's stops the lanes already
    /// started).
    async fn start_lanes(&self, tasks: &mut Supervisor) -> anyhow::Result<()> {
        let config = &self.model.config;
        let shutdown = tasks.shutdown().clone();
        let per_topic = config.kafka.consumers.resolve();
        let plan: Vec<&crate::config::Topic> = self
            .model
            .topics
            .iter()
            .flat_map(|t| std::iter::repeat_n(t, per_topic))
            .collect();
        let listed = plan.len();
        // The process' bounds are shared by the listed topics' lanes and those the patterns may
        // start (`kafka.max_pattern_topics` topics).
        let lanes = match self.model.patterns.is_empty() {
            true => listed,
            false => listed + config.kafka.max_pattern_topics * per_topic,
        };
        let close_gate = Arc::new(lane::CloseGate::new(listed));
        let start_gate = Arc::new(lane::StartGate::new());
        let shared = LaneShared {
            model: &self.model,
            lanes,
            metrics: &self.metrics,
            health: &self.health,
            shutdown: &shutdown,
            deadline: &tasks.deadline().clone(),
            close_gate: &close_gate,
            start_gate: &start_gate,
        };
        let grace = config.flush.shutdown_grace;
        for (index, topic) in plan.into_iter().enumerate() {
            match Lane::start(&shared, index, topic).await {
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
                    for _ in index..listed {
                        close_gate.arrive();
                    }
                    start_gate.open();
                    tasks.fail(e.context(format!("starting consumer lane {index}")));
                    return Ok(());
                }
            }
        }
        // Every listed lane is built: they join the group together, in one generation.
        start_gate.open();
        if !self.model.patterns.is_empty() {
            self.start_discovery(tasks, &close_gate, lanes, listed);
        }
        self.start_lag_probe(tasks)?;
        let topics = config.topics();
        let topics: Vec<&str> = topics.iter().map(|t| t.name).collect();
        tracing::info!(topics = %topics.join(","), group = %config.kafka.group_id, lanes = listed, "consuming");
        Ok(())
    }

    /// Start the lanes of the topics the patterns match, numbered from `next` (`lanes` in all;
    /// they close at `close_gate` with the listed topics' lanes).
    fn start_discovery(
        &self,
        tasks: &mut Supervisor,
        close_gate: &Arc<lane::CloseGate>,
        lanes: usize,
        next: usize,
    ) {
        let discovery = discover::Discovery {
            model: self.model.clone(),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            close_gate: close_gate.clone(),
            lanes,
            next,
        };
        let (shutdown, deadline) = (tasks.shutdown().clone(), tasks.deadline().clone());
        tasks.spawn(
            "the lanes of topic patterns",
            discovery.run(shutdown, deadline),
        );
    }

    /// Start the probe of every owned partition's lag, asked of the broker on its own client
    /// and thread.
    fn start_lag_probe(&self, tasks: &mut Supervisor) -> anyhow::Result<()> {
        let config = &self.model.config;
        let probe = crate::stream::consumer::LagProbe::new(&config.kafka, self.metrics.clone())
            .context("the lag probe's kafka client")?;
        // Its own thread, not the runtime's blocking pool: a runtime dropped without a shutdown
        // (a test's) must not wait for it; it stops when this task is gone too.
        let stop = tasks.shutdown().clone();
        let (ended, task_gone) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("tally-lag-probe".into())
            .spawn(move || probe.run(&stop, || !ended.is_closed()))
            .context("the lag probe's thread")?;
        tasks.spawn("the lag probe", async move {
            let _ = task_gone.await;
            Ok(())
        });
        Ok(())
    }
}
