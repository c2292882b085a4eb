//! Lanes for topic patterns. librdkafka can subscribe to a regex (`^…`), but one consumer would
//! then read several topics, and a lane is built for one topic: its decoder, its counters'
//! rules, its fences. So the process lists the cluster's topics itself, every
//! `kafka.topics_refresh` (one metadata request), and starts `kafka.consumers` lanes of their own
//! for each new topic a pattern reads, as if it had been listed by name. The lanes are
//! supervised here: one failing stops the process, as a listed topic's lane does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Model;
use crate::ops::health::Health;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::Metrics;
use crate::stream::consumer::discover::{self, TopicLister};

use super::lane::{CloseGate, Lane, LaneShared, StartGate};

/// The pattern topics' lanes of one process.
pub(super) struct Discovery {
    pub(super) model: Arc<Model>,
    pub(super) metrics: Metrics,
    pub(super) health: Arc<Health>,
    /// Shared with the listed topics' lanes: each lane started here is expected there first.
    pub(super) close_gate: Arc<CloseGate>,
    /// The lanes the process' bounds are shared by (listed topics' and `max_pattern_topics`').
    pub(super) lanes: usize,
    /// The index of the next lane started.
    pub(super) next: usize,
}

impl Discovery {
    /// List, start lanes for new matches, sleep; until `shutdown`, then wait for the lanes.
    pub(super) async fn run(
        mut self,
        shutdown: CancellationToken,
        deadline: CancellationToken,
    ) -> anyhow::Result<()> {
        let kafka = &self.model.config.kafka;
        let lister = Arc::new(TopicLister::new(kafka).context("the topic lister's kafka client")?);
        let (refresh, max) = (kafka.topics_refresh, kafka.max_pattern_topics);
        let mut reading: BTreeSet<String> = BTreeSet::new();
        let mut lanes: JoinSet<anyhow::Result<()>> = JoinSet::new();
        let mut failure: Option<anyhow::Error> = None;
        let log = LogLimiter::new();
        while !shutdown.is_cancelled() {
            let l = lister.clone();
            let listed = tokio::task::spawn_blocking(move || l.list(Duration::from_secs(10)))
                .await
                .context("the topic lister")?;
            match listed {
                Ok(names) => {
                    let found = discover::matches(&self.model, &names);
                    let mut over = BTreeMap::new();
                    for (name, p) in &found.read {
                        if reading.contains(name) {
                            continue;
                        }
                        if reading.len() >= max {
                            *over.entry(*p).or_default() += 1;
                            continue;
                        }
                        if let Err(e) = self.start(name, &mut lanes, &shutdown, &deadline).await {
                            failure = Some(e);
                            shutdown.cancel();
                            break;
                        }
                        reading.insert(name.clone());
                    }
                    self.report(&found, &reading, &over, &log);
                }
                Err(e) => {
                    if let Some(suppressed) = log.allow() {
                        tracing::warn!(error = %e, suppressed, "cannot list kafka topics for kafka.topics[].pattern; trying again");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(refresh) => {}
                Some(ended) = lanes.join_next() => {
                    failure.get_or_insert_with(|| lane_end(ended));
                    shutdown.cancel();
                }
            }
        }
        while let Some(ended) = lanes.join_next().await {
            if let Err(e) = ended.map_err(anyhow::Error::from).and_then(|r| r) {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Start `kafka.consumers` lanes reading `name`.
    async fn start(
        &mut self,
        name: &str,
        lanes: &mut JoinSet<anyhow::Result<()>>,
        shutdown: &CancellationToken,
        deadline: &CancellationToken,
    ) -> anyhow::Result<()> {
        let Some(topic) = self.model.pattern_topic(name) else {
            return Ok(());
        };
        // The topic's lanes join the group together, once all are built.
        let start_gate = Arc::new(StartGate::new());
        let _open = OpenOnDrop(&start_gate);
        let shared = LaneShared {
            model: &self.model,
            lanes: self.lanes,
            metrics: &self.metrics,
            health: &self.health,
            shutdown,
            deadline,
            close_gate: &self.close_gate,
            start_gate: &start_gate,
        };
        let grace = self.model.config.flush.shutdown_grace;
        for _ in 0..self.model.config.kafka.consumers.resolve() {
            let index = self.next;
            self.next += 1;
            self.close_gate.expect_one();
            let lane = match Lane::start(&shared, index, &topic).await {
                Ok(lane) => lane,
                Err(e) => {
                    self.close_gate.arrive();
                    return Err(
                        e.context(format!("starting consumer lane {index} for topic {name}"))
                    );
                }
            };
            lanes.spawn(lane.supervise(shutdown.clone(), deadline.clone(), grace));
        }
        tracing::info!(topic = name, "reading a topic a pattern matches");
        Ok(())
    }

    /// `tally_pattern_topics` per pattern, and an error while matches go unread for the limit.
    fn report(
        &self,
        found: &discover::Matches,
        reading: &BTreeSet<String>,
        over: &BTreeMap<usize, usize>,
        log: &LogLimiter,
    ) {
        for (i, p) in self.model.patterns.iter().enumerate() {
            let read = found
                .read
                .iter()
                .filter(|(name, q)| *q == i && reading.contains(name))
                .count();
            let unread = found.unread.get(&i).copied().unwrap_or(0);
            let over_limit = over.get(&i).copied().unwrap_or(0);
            self.metrics
                .consumer
                .pattern_topics(&p.text, [read, unread, over_limit]);
        }
        let over: usize = over.values().sum();
        if over > 0 {
            if let Some(suppressed) = log.allow() {
                let max = self.model.config.kafka.max_pattern_topics;
                tracing::error!(over, max, suppressed, "topics matching kafka.topics[].pattern are not read: more than kafka.max_pattern_topics match");
            }
        }
    }
}

/// A lane that ended while the process runs: its error, or that it stopped on its own.
fn lane_end(ended: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Error {
    match ended {
        Ok(Err(e)) => e,
        Ok(Ok(())) => anyhow::anyhow!("a pattern topic's consumer lane stopped on its own"),
        Err(e) => anyhow::anyhow!("a pattern topic's consumer lane panicked: {e}"),
    }
}

/// Opens a start gate when dropped: on success and on every early return alike.
struct OpenOnDrop<'a>(&'a StartGate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}
