//! A consumer lane: one Kafka consumer (a member of the group) on its own thread, with its own
//! decoder, aggregator and Redis sink. Lanes of one process share nothing but metrics, health
//! and the shutdown token: Kafka gives each its own partitions, and every partition keeps its
//! own fences, so the exactly-once protocol is the same for one lane, several lanes, or several
//! replicas.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::ClientConfig;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{FlushConfig, KafkaConfig, Model, Topic};
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::stream::aggregate::Aggregator;
use crate::stream::consumer::{self, StateAccess, TallyContext, Worker};
use crate::stream::decode::Decoder;
use crate::stream::sink::{Sink, SinkRequest};

use super::kafka_client_config;

/// librdkafka's prefetch per process (`kafka_client_config`'s `queued.max.messages.kbytes`).
pub(super) const QUEUED_KBYTES: usize = 4096;

/// The longest a lane waits for the lanes starting with it before it joins the group alone.
const START_TIMEOUT: Duration = Duration::from_secs(60);

type ThreadEnd = std::thread::Result<Result<(), KafkaError>>;

/// A running lane.
pub(super) struct Lane {
    pub(super) index: usize,
    /// The consumer thread's end (reported over a channel rather than joined: if closing the
    /// Kafka consumer hangs, the process can still exit).
    pub(super) done: oneshot::Receiver<ThreadEnd>,
    pub(super) sink: JoinHandle<()>,
}

/// Where the lanes of a process wait for each other between their final commit and leaving the
/// group.
pub(super) struct CloseGate {
    lanes: std::sync::atomic::AtomicUsize,
    arrived: parking_lot::Mutex<usize>,
    all: parking_lot::Condvar,
}

impl CloseGate {
    pub(super) fn new(lanes: usize) -> CloseGate {
        CloseGate {
            lanes: lanes.into(),
            arrived: parking_lot::Mutex::new(0),
            all: parking_lot::Condvar::new(),
        }
    }

    /// Count this lane in, then wait (at most `timeout`) for the others.
    fn arrive_and_wait(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut arrived = self.arrived.lock();
        *arrived += 1;
        self.all.notify_all();
        while *arrived < self.lanes.load(std::sync::atomic::Ordering::SeqCst) {
            if self.all.wait_until(&mut arrived, deadline).timed_out() {
                tracing::warn!(
                    "consumer lanes did not all finish their final commit in time; closing anyway"
                );
                return;
            }
        }
    }

    /// One more lane will come (a pattern topic's, started after the others).
    pub(super) fn expect_one(&self) {
        let _arrived = self.arrived.lock();
        self.lanes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Count in a lane that ended without reaching the gate (it will not come).
    pub(super) fn arrive(&self) {
        *self.arrived.lock() += 1;
        self.all.notify_all();
    }
}

/// Where the lanes of a process wait for each other before they join the group: built one
/// after another (each reads its fences' configuration, connects a sink), they would otherwise
/// join one by one, and a lane that joins after the group's first generation formed makes the
/// running lanes give up partitions they had just opened (a rebalance of the process against
/// itself). Opened once every lane of the start is built; each waits at most `timeout`.
pub(super) struct StartGate {
    open: parking_lot::Mutex<bool>,
    opened: parking_lot::Condvar,
}

impl StartGate {
    pub(super) fn new() -> StartGate {
        StartGate {
            open: parking_lot::Mutex::new(false),
            opened: parking_lot::Condvar::new(),
        }
    }

    /// Let every lane waiting here (and every lane that comes later) join the group.
    pub(super) fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }

    /// Wait until the gate opens, `shutdown` is cancelled, or `timeout` passes.
    fn wait(&self, shutdown: &CancellationToken, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut open = self.open.lock();
        while !*open && !shutdown.is_cancelled() {
            // Short waits: a cancelled shutdown does not notify this condition variable.
            let step = (std::time::Instant::now() + Duration::from_millis(50)).min(deadline);
            if self.opened.wait_until(&mut open, step).timed_out()
                && std::time::Instant::now() >= deadline
            {
                tracing::warn!(
                    "the other consumer lanes did not start in time; joining the group alone"
                );
                return;
            }
        }
    }
}

/// What a lane needs from the process.
pub(super) struct LaneShared<'a> {
    pub(super) model: &'a Model,
    pub(super) lanes: usize,
    pub(super) metrics: &'a Metrics,
    pub(super) health: &'a Arc<Health>,
    pub(super) shutdown: &'a CancellationToken,
    /// Stops every sink's retries when the process gives up waiting (the supervisor's deadline).
    pub(super) deadline: &'a CancellationToken,
    pub(super) close_gate: &'a Arc<CloseGate>,
    /// Opened once every lane starting with this one is built: they join the group together.
    pub(super) start_gate: &'a Arc<StartGate>,
}

impl Lane {
    /// Build lane `index`, a consumer of `topic`, and start its sink task and consumer
    /// thread. Lane 0 checks Redis first (an unsafe eviction policy refuses the start).
    pub(super) async fn start(
        shared: &LaneShared<'_>,
        index: usize,
        topic: &Topic,
    ) -> anyhow::Result<Lane> {
        let model = shared.model;
        let config = &model.config;
        shared.metrics.status.lane_reads(index, &topic.name);
        let (mut decoder, counters) = crate::stream::aggregate::stages_of(model, topic);
        decoder.wait_for_schemas(shared.shutdown.clone());
        // Fences are per topic-partition: each topic's lanes keep theirs apart.
        let scope = topic.scope.clone();
        let agg = Aggregator::new(counters, 1, config.flush.max_keys_per_call)
            .with_layout(scope.layout.clone())
            .with_watermarks(model.has_outputs());
        let flush = lane_flush(&config.flush, shared.lanes);
        let mut sink = Sink::new(
            &config.redis,
            flush.clone(),
            scope,
            shared.metrics.clone(),
            shared.health.clone(),
        )
        .context("redis configuration")?
        .reapplying(config.recovery.reapply_keys / shared.lanes.max(1));
        if index == 0 {
            sink.preflight().await?;
        }
        let (sink_tx, sink_rx) = mpsc::unbounded_channel();
        let sink_link = (sink_tx, sink.connections());
        let worker = lane_worker(shared, (index, topic), agg, decoder, sink_link, flush)?;
        let ctx = TallyContext::new(worker, shared.health.clone(), shared.shutdown.clone());
        let consumer: BaseConsumer<TallyContext> =
            lane_client_config(&config.kafka, shared.lanes, index)
                .create_with_context(ctx)
                .context("kafka configuration")?;
        let sink = tokio::spawn(sink.run(sink_rx, shared.deadline.clone()));
        let grace = config.flush.shutdown_grace;
        let gates = (shared.start_gate.clone(), shared.close_gate.clone());
        let done = spawn_consumer(consumer, index, grace, gates, shared.shutdown.clone())?;
        Ok(Lane { index, done, sink })
    }

    /// Wait for the lane's consumer thread to end; if the sink stops before (a failure), cancel
    /// `shutdown` so every lane flushes what it can and stops. Then let the sink finish what it
    /// has, within `grace` (past `deadline`, the sink stops retrying). A consumer that ends
    /// before `shutdown` is a failure, reported to the supervisor.
    pub(super) async fn supervise(
        mut self,
        shutdown: CancellationToken,
        deadline: CancellationToken,
        grace: Duration,
    ) -> anyhow::Result<()> {
        let mut failure: Option<anyhow::Error> = None;
        let mut sink_running = true;
        let joined = loop {
            tokio::select! {
                joined = &mut self.done => {
                    if !shutdown.is_cancelled() {
                        failure.get_or_insert_with(|| {
                            anyhow::anyhow!("consumer lane {} stopped on its own", self.index)
                        });
                    }
                    break joined;
                }
                ended = &mut self.sink, if sink_running => {
                    sink_running = false;
                    // After shutdown the consumer drops its sender and the sink ends normally.
                    if !shutdown.is_cancelled() || ended.is_err() {
                        tracing::error!(lane = self.index, ?ended, "the redis sink stopped unexpectedly; shutting down");
                        failure.get_or_insert_with(|| anyhow::anyhow!("the redis sink stopped unexpectedly"));
                        shutdown.cancel();
                    }
                }
            }
        };
        // The consumer (and with it the sink's sender) is gone: the sink finishes what it has.
        if sink_running && tokio::time::timeout(grace, &mut self.sink).await.is_err() {
            deadline.cancel();
        }
        match joined {
            Ok(Ok(result)) => result.context("kafka consumer")?,
            Ok(Err(_)) => anyhow::bail!("consumer thread panicked"),
            Err(_) => anyhow::bail!("consumer thread ended without a result"),
        }
        failure.map_or(Ok(()), Err)
    }
}

/// A lane's flush settings: the bounds on keys held in memory and sent in one flush are the
/// process', shared evenly by the lanes.
fn lane_flush(process: &FlushConfig, lanes: usize) -> FlushConfig {
    let mut flush = process.clone();
    flush.max_keys = (flush.max_keys / lanes).max(1);
    flush.max_pending_keys = (flush.max_pending_keys / lanes).max(flush.max_keys);
    flush
}

/// The consumer's worker of lane `index` reading `topic`: its aggregator and decoder, the
/// sender to its sink, and a dead-letter producer if the topic's decoding names one.
fn lane_worker(
    shared: &LaneShared<'_>,
    (index, topic): (usize, &Topic),
    agg: Aggregator,
    decoder: Decoder,
    (sink_tx, connections): (mpsc::UnboundedSender<SinkRequest>, Arc<AtomicU64>),
    flush: FlushConfig,
) -> anyhow::Result<Worker> {
    let config = &shared.model.config;
    let mut worker = Worker::new(
        agg,
        decoder,
        sink_tx,
        shared.metrics.clone(),
        topic.name.clone(),
        flush,
        StateAccess {
            start_from: config.kafka.start_from,
            recovery: config.recovery.clone(),
            health: shared.health.clone(),
            init_timeout: config.redis.connect_timeout + config.redis.response_timeout,
            lane: index,
            connections,
            topic: (shared.model.topics.len() > 1 || !shared.model.patterns.is_empty())
                .then(|| topic.name.clone()),
        },
    );
    if let Some(dead) = &topic.decode.config.dead_letter_topic {
        let dlq = crate::stream::consumer::DeadLetters::new(
            &config.kafka,
            &topic.name,
            dead,
            shared.metrics.clone(),
        )
        .context("dead-letter producer")?;
        worker = worker.with_dead_letters(dlq);
    }
    Ok(worker)
}

/// The Kafka client settings of lane `index` of `lanes`.
fn lane_client_config(kafka: &KafkaConfig, lanes: usize, index: usize) -> ClientConfig {
    let mut client = kafka_client_config(kafka);
    if !kafka.instance_id.is_empty() {
        client.set(
            "group.instance.id",
            format!("{}-{index}", kafka.instance_id),
        );
    }
    if lanes > 1 {
        // Each lane is its own group member: distinct client ids in broker logs, and
        // distinct static member ids if the user configured one.
        let base = kafka
            .properties
            .get("client.id")
            .map_or("tally", String::as_str);
        client.set("client.id", format!("{base}-{index}"));
        if let Some(id) = kafka.properties.get("group.instance.id") {
            client.set("group.instance.id", format!("{id}-{index}"));
        }
        // The prefetch budget is the process', like the pending keys.
        if !kafka.properties.contains_key("queued.max.messages.kbytes") {
            let kbytes = (QUEUED_KBYTES / lanes).max(4096);
            client.set("queued.max.messages.kbytes", kbytes.to_string());
        }
    }
    client
}

/// Run `consumer` on thread `tally-consumer{index}`; its result arrives on the returned
/// channel. Before it joins the group the lane waits at `start` for the lanes starting with it;
/// after its final commit it waits (at most `grace`) at `close` for the others.
fn spawn_consumer(
    consumer: BaseConsumer<TallyContext>,
    index: usize,
    grace: Duration,
    (start, gate): (Arc<StartGate>, Arc<CloseGate>),
    shutdown: CancellationToken,
) -> std::io::Result<oneshot::Receiver<ThreadEnd>> {
    let (done_tx, done) = oneshot::channel();
    // Thread names are cut at 15 bytes: `tally-consumer`, `tally-consumer1`, ...
    let name = match index {
        0 => "tally-consumer".to_string(),
        i => format!("tally-consumer{i}"),
    };
    std::thread::Builder::new().name(name).spawn(move || {
        let mut waited = false;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let ready = || start.wait(&shutdown, START_TIMEOUT);
            consumer::run(consumer, grace, ready, || {
                waited = true;
                gate.arrive_and_wait(grace);
            })
        }));
        if !waited {
            gate.arrive();
        }
        let _ = done_tx.send(result);
    })?;
    Ok(done)
}
