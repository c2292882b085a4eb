//! What the worker knows about its partitions beyond the aggregator: how they start (the I/O
//! around [`recovery`](super::recovery)'s decision), which are parked and why, which are being
//! rebuilt, which are being revoked.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::{RecoveryConfig, StartFrom};
use crate::ops::health::Health;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::{HaltReason, LaneGauges, Metrics, ResetReason};
use crate::stream::aggregate::Aggregator;

use super::recovery::{self, Halt, Origin, Start};
use super::{TallyContext, KAFKA_TIMEOUT};

/// How often parked partitions are tried again.
const RETRY_PARKED: Duration = Duration::from_secs(5);

/// How the worker reaches and recovers tally's state in Redis.
pub struct StateAccess {
    /// Where a partition tally never counted starts.
    pub start_from: StartFrom,
    /// What to do when Redis lost tally's state.
    pub recovery: RecoveryConfig,
    /// Readiness, which lists halted partitions.
    pub health: Arc<Health>,
    /// Longest wait for Redis' answer about fences.
    pub init_timeout: Duration,
    /// Which consumer lane of the process this is (0 for the first).
    pub lane: usize,
    /// Connections the lane's sink has made (`Sink::connections`): the fences are re-read
    /// after each new one.
    pub connections: Arc<AtomicU64>,
    /// The lane's topic when the process reads several: halts then name it, and their repair
    /// commands take `--topic`. None with one topic (messages as they always were).
    pub topic: Option<String>,
}

/// What Kafka holds for a partition, for [`recovery::decide`].
#[derive(Debug, Clone, Copy)]
pub(super) struct KafkaOffsets {
    /// The group has committed an offset for the partition.
    pub(super) has_commit: bool,
    /// The earliest retained offset.
    pub(super) low: i64,
    /// The end of the partition (next offset to be written).
    pub(super) high: i64,
}

/// Read the commit and watermarks of each of `parts`.
pub(super) fn kafka_offsets(
    consumer: &BaseConsumer<TallyContext>,
    topic: &str,
    parts: &[i32],
) -> Vec<(i32, Result<KafkaOffsets, Halt>)> {
    let mut tpl = TopicPartitionList::new();
    for &p in parts {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, KAFKA_TIMEOUT);
    // Every partition's watermarks in two requests (earliest, latest), not two per partition:
    // a failover reopens every partition of a lane at once, and one by one their round trips
    // added up (219-363 ms per lane of 4 after a Sentinel failover).
    let low = list_offsets(consumer, topic, parts, Offset::Beginning);
    let high = list_offsets(consumer, topic, parts, Offset::End);
    let read = |p: i32| {
        let has_commit = match &committed {
            Ok(c) => c
                .find_partition(topic, p)
                .is_some_and(|e| matches!(e.offset(), Offset::Offset(n) if n >= 0)),
            Err(e) => return Err(Halt::KafkaUnavailable(e.to_string())),
        };
        Ok(KafkaOffsets {
            has_commit,
            low: offset_of(&low, topic, p)?,
            high: offset_of(&high, topic, p)?,
        })
    };
    parts.iter().map(|&p| (p, read(p))).collect()
}

/// One ListOffsets request for `parts`: `Offset::Beginning` asks for each one's earliest
/// retained offset, `Offset::End` for its end (the same request `fetch_watermarks` sends per
/// partition).
pub(super) fn list_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    parts: &[i32],
    which: Offset,
) -> KafkaResult<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for &p in parts {
        tpl.add_partition_offset(topic, p, which)?;
    }
    consumer.offsets_for_times(tpl, KAFKA_TIMEOUT)
}

/// Partition `p`'s offset in a [`list_offsets`] answer.
fn offset_of(answer: &KafkaResult<TopicPartitionList>, topic: &str, p: i32) -> Result<i64, Halt> {
    let list = answer
        .as_ref()
        .map_err(|e| Halt::KafkaUnavailable(e.to_string()))?;
    let elem = list
        .find_partition(topic, p)
        .ok_or_else(|| Halt::KafkaUnavailable(format!("no offsets for partition {p}")))?;
    elem.error()
        .map_err(|e| Halt::KafkaUnavailable(e.to_string()))?;
    match elem.offset() {
        Offset::Offset(n) => Ok(n),
        other => Err(Halt::KafkaUnavailable(format!(
            "partition {p}: no offset in the answer ({other:?})"
        ))),
    }
}

/// A partition being recounted after Redis lost its state.
struct Rebuild {
    /// End of the partition when the rebuild began: done once the position passes it.
    end: i64,
    /// Where it began (the earliest retained offset), for progress.
    from: i64,
    /// When it began, for the rate and the estimate of what is left.
    started: Instant,
    /// A replay after the partition reopened behind where it was (Redis took the applied offset
    /// back, or refused a unit), not a rebuild of a lost state: readiness waits for it.
    rollback: bool,
}

/// The partitions' states besides counting: parked, rebuilding, being revoked.
pub(super) struct PartitionStates {
    /// Start policy, recovery policy, readiness, Redis wait.
    access: StateAccess,
    /// Assigned partitions not consumed until their state allows it, and why.
    parked: BTreeMap<i32, Halt>,
    /// Parked partitions are retried every [`RETRY_PARKED`], not at every tick.
    last_parked_retry: Instant,
    /// Partitions being recounted after Redis lost their state.
    rebuilding: HashMap<i32, Rebuild>,
    /// Rebuild progress is logged once per interval.
    progress_log: LogLimiter,
    /// Partitions being revoked right now: never seek or recover them.
    revoking: Vec<i32>,
    /// The live status, which lists halted partitions with their repair command.
    status: Arc<crate::ops::status::Status>,
}

impl PartitionStates {
    pub(super) fn new(
        access: StateAccess,
        status: Arc<crate::ops::status::Status>,
    ) -> PartitionStates {
        PartitionStates {
            status,
            access,
            parked: BTreeMap::new(),
            last_parked_retry: Instant::now(),
            rebuilding: HashMap::new(),
            progress_log: LogLimiter::after_interval(),
            revoking: Vec::new(),
        }
    }

    /// Which consumer lane of the process this is.
    pub(super) fn lane(&self) -> usize {
        self.access.lane
    }

    /// Longest wait for Redis' answer about fences.
    pub(super) fn init_timeout(&self) -> Duration {
        self.access.init_timeout
    }

    /// Where Redis should create the state of a partition it has none for (-1: nowhere).
    pub(super) fn fresh_start(&self, kafka: &KafkaOffsets) -> i64 {
        recovery::fresh_start(
            kafka.has_commit,
            self.access.recovery.on_state_lost,
            self.access.start_from,
            kafka.low,
            kafka.high,
        )
        .unwrap_or(-1)
    }

    /// Report how `partition` opens, and track its rebuild if it is one.
    pub(super) fn opened(&mut self, partition: i32, start: &Start, metrics: &Metrics) {
        match start.origin {
            Origin::Rebuild { from, end } => {
                metrics.recovery.state_rebuilds.inc();
                tracing::error!(
                    partition,
                    from,
                    to = end,
                    "redis lost tally's state for this partition; recounting it from the earliest retained offset (windows whose events are no longer retained stay undercounted)"
                );
                let started = Instant::now();
                let rebuild = Rebuild {
                    end,
                    from,
                    started,
                    rollback: false,
                };
                self.rebuilding.insert(partition, rebuild);
            }
            Origin::New => {
                tracing::info!(
                    partition,
                    start = start.offset,
                    "partition new to tally's state"
                )
            }
            Origin::Fence => {}
        }
        if let Some(applied) = start.gap_from {
            metrics.recovery.offset_reset(ResetReason::BeforeLogStart);
            tracing::error!(
                partition,
                applied,
                log_start = start.offset,
                lost = start.offset - applied,
                "offsets between the applied offset and the start of the topic were deleted by retention before tally counted them; continuing at the start of the topic"
            );
        }
    }

    pub(super) fn is_parked(&self, partition: i32) -> bool {
        self.parked.contains_key(&partition)
    }

    /// The parked partitions.
    pub(super) fn parked(&self) -> impl Iterator<Item = i32> + '_ {
        self.parked.keys().copied()
    }

    /// Stop counting `partition` until it can be opened again (the caller pauses it).
    pub(super) fn park(&mut self, partition: i32, halt: Halt, gauges: &mut LaneGauges) {
        self.forget_rebuild(partition);
        if self.parked.get(&partition) == Some(&halt) {
            return;
        }
        match &halt {
            Halt::RedisUnavailable(_) | Halt::KafkaUnavailable(_) => {
                tracing::warn!(partition, reason = %halt.describe(partition), "partition waiting")
            }
            _ => tracing::error!(partition, reason = %halt.describe(partition), "partition halted"),
        }
        self.parked.insert(partition, halt);
        self.publish_halts(gauges);
    }

    /// Forget a parked partition (opened again).
    pub(super) fn unpark(&mut self, partition: i32, gauges: &mut LaneGauges) {
        if self.parked.remove(&partition).is_some() {
            self.publish_halts(gauges);
        }
    }

    /// Forget everything about a revoked partition.
    pub(super) fn revoked(&mut self, partition: i32, gauges: &mut LaneGauges) {
        self.unpark(partition, gauges);
        self.forget_rebuild(partition);
    }

    /// `partition` reopened behind where it was (Redis took its applied offset back, or
    /// refused a unit): it is replayed from `from` and not ready until its position reaches
    /// `until`. A rebuild of a lost state keeps its own entry.
    pub(super) fn replaying(&mut self, partition: i32, from: i64, until: i64) {
        let until = match self.rebuilding.get(&partition) {
            Some(r) if !r.rollback => return,
            Some(r) => r.end.max(until),
            None => until,
        };
        let started = Instant::now();
        let replay = Rebuild {
            end: until,
            from,
            started,
            rollback: true,
        };
        self.rebuilding.insert(partition, replay);
        self.publish_replays();
    }

    fn forget_rebuild(&mut self, partition: i32) {
        if self
            .rebuilding
            .remove(&partition)
            .is_some_and(|r| r.rollback)
        {
            self.publish_replays();
        }
    }

    /// Readiness and the status list the partitions replaying.
    fn publish_replays(&self) {
        let replays = || self.rebuilding.iter().filter(|(_, r)| r.rollback);
        self.access.health.set_replaying(
            self.access.lane,
            replays().map(|(p, r)| {
                self.named(format!(
                    "partition {p}: reopened behind where it was (redis took its applied offset back, or refused a unit); replaying offsets {} to {} from kafka",
                    r.from, r.end
                ))
            }),
        );
        self.status
            .set_replaying(self.access.lane, replays().map(|(&p, r)| (p, r.end)));
    }

    /// Readiness and the per-reason gauge follow the parked set.
    fn publish_halts(&self, gauges: &mut LaneGauges) {
        for &reason in HaltReason::ALL {
            let n = self
                .parked
                .values()
                .filter(|h| h.reason() == reason)
                .count();
            gauges.set_halted(reason, n);
        }
        self.access.health.set_halted(
            self.access.lane,
            self.parked.iter().map(|(p, h)| self.named(h.describe(*p))),
        );
        self.status.set_halted(
            self.access.lane,
            self.parked.iter().map(|(&p, h)| {
                let halt = crate::ops::status::HaltedPartition {
                    reason: h.reason().label(),
                    detail: self.named(h.describe(p)),
                    repair: h.repair_args(p).map(|a| self.with_topic_arg(a)),
                };
                (p, halt)
            }),
        );
    }

    /// `text` (a halt's description or repair arguments) naming the lane's topic when the
    /// process reads several.
    fn named(&self, text: String) -> String {
        match &self.access.topic {
            None => text,
            Some(t) => format!("topic {t}: {}", self.with_topic_arg(text)),
        }
    }

    /// `text` with `--topic` added to the repair command it holds, when several topics are read.
    fn with_topic_arg(&self, text: String) -> String {
        match &self.access.topic {
            None => text,
            Some(t) => text.replace(
                "repair --partition",
                &format!("repair --topic {t} --partition"),
            ),
        }
    }

    /// The parked partitions to try again now (every few seconds), except those being revoked.
    pub(super) fn retry_due(&mut self) -> Vec<i32> {
        if self.parked.is_empty() || self.last_parked_retry.elapsed() < RETRY_PARKED {
            return Vec::new();
        }
        self.last_parked_retry = Instant::now();
        self.parked()
            .filter(|p| !self.revoking.contains(p))
            .collect()
    }

    /// `partitions` are being revoked (until [`PartitionStates::revoke_done`]).
    pub(super) fn revoking(&mut self, partitions: &[i32]) {
        self.revoking = partitions.to_vec();
    }

    pub(super) fn revoke_done(&mut self) {
        self.revoking.clear();
    }

    pub(super) fn is_revoking(&self, partition: i32) -> bool {
        self.revoking.contains(&partition)
    }

    /// Report how far rebuilding partitions have come (metric always, log every 10 s).
    pub(super) fn report_rebuilds(&mut self, agg: &Aggregator, gauges: &mut LaneGauges) {
        if self.rebuilding.is_empty() {
            gauges.rebuild_remaining.set(0);
            return;
        }
        let log = self.progress_log.allow().is_some();
        let mut total_remaining = 0;
        let mut replayed = false;
        self.rebuilding.retain(|&p, rebuild| {
            let Some(position) = agg.position(p) else {
                return true;
            };
            let remaining = (rebuild.end - position).max(0);
            if remaining == 0 {
                tracing::info!(
                    partition = p,
                    offsets = rebuild.end - rebuild.from,
                    seconds = rebuild.started.elapsed().as_secs_f64(),
                    "{}",
                    if rebuild.rollback {
                        "replay reached where the partition was before it reopened"
                    } else {
                        "rebuild read everything the topic held when it began"
                    }
                );
                replayed |= rebuild.rollback;
                return false;
            }
            total_remaining += remaining;
            if log {
                rebuild.log_progress(p, position, remaining);
            }
            true
        });
        gauges.rebuild_remaining.set(total_remaining);
        if replayed {
            self.publish_replays();
        }
    }
}

impl Rebuild {
    fn log_progress(&self, partition: i32, position: i64, remaining: i64) {
        let done = position - self.from;
        let rate = done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        let eta_s = if rate > 0.0 {
            remaining as f64 / rate
        } else {
            f64::INFINITY
        };
        tracing::info!(
            partition,
            done,
            remaining,
            rate = rate.round(),
            eta_s = eta_s.round(),
            "rebuilding from the earliest retained offset"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecoveryConfig;

    #[test]
    fn a_rollback_replay_holds_readiness_and_the_status_until_it_reaches_where_it_was() {
        let health = Arc::new(Health::default());
        let status = Arc::new(crate::ops::status::Status::default());
        let metrics = Metrics::new(&[]);
        let mut gauges = LaneGauges::new(&metrics);
        let access = StateAccess {
            start_from: StartFrom::Earliest,
            recovery: RecoveryConfig::default(),
            health: health.clone(),
            init_timeout: Duration::from_secs(1),
            lane: 0,
            connections: Arc::default(),
            topic: None,
        };
        let mut parts = PartitionStates::new(access, status.clone());
        let mut agg = Aggregator::new(Vec::new(), 1, 100);
        agg.assign(3, &[100]);
        parts.replaying(3, 100, 250);
        let listed = |h: &Health| h.describe().contains("replaying: partition 3");
        assert!(listed(&health), "{}", health.describe());
        let view = status.view(&health, true);
        let until = |v: &crate::ops::status::view::StatusAnswer| {
            v.stream
                .as_ref()
                .unwrap()
                .partitions
                .iter()
                .find(|p| p.partition == 3)
                .and_then(|p| p.replaying_until)
        };
        assert_eq!(until(&view), Some(250));

        // Half way: still replaying.
        agg.skip(3, 180);
        parts.report_rebuilds(&agg, &mut gauges);
        assert!(listed(&health));
        // Where it was when the rollback was found: ready again as far as replays go.
        agg.skip(3, 249);
        parts.report_rebuilds(&agg, &mut gauges);
        assert!(!listed(&health), "{}", health.describe());
        assert!(health.replaying.lock().is_empty());
        assert_eq!(until(&status.view(&health, true)), None);
    }
}
