//! Where a partition starts, and what happens when tally's state in Redis does not allow a safe
//! start. A partition is *opened* from the applied offsets (fences) Redis holds; when the state
//! needs an operator, or Redis or Kafka cannot answer, it is *parked*: paused, not counted,
//! listed by `/health/ready`, and retried every few seconds (an operator's repair with
//! `tally state` is picked up without a restart).
//!
//! | Redis has                                   | Kafka has a commit | start                       |
//! |---------------------------------------------|--------------------|-----------------------------|
//! | the fence                                   | any                | the fence                   |
//! | no fence, no marker entry                   | no                 | `kafka.start_from`          |
//! | no fence, no marker entry (state lost)      | yes                | earliest retained (rebuild) or halt, per `recovery.on_state_lost` |
//! | no fence, but the marker names the partition | any               | halt (partial loss)         |
//! | a fence that is not a number                | any                | halt                        |
//! | a fence beyond the end of the topic         | any                | halt                        |
//! | a fence before the start of the topic       | any                | earliest retained (counted as a reset; the gap is lost) |

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::{OnStateLost, StartFrom};
use crate::metrics::{HaltReason, ResetReason};
use crate::sink::{FenceState, SinkRequest};

use super::worker::{StateAccess, Worker};
use super::{TallyContext, KAFKA_TIMEOUT};

/// How often parked partitions are tried again.
const RETRY_PARKED: Duration = Duration::from_secs(5);
/// How often rebuild progress is logged.
const LOG_PROGRESS: Duration = Duration::from_secs(10);

/// Why a partition is not consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Halt {
    /// Redis did not answer in time.
    RedisUnavailable(String),
    /// The partition's offsets could not be read from Kafka.
    KafkaUnavailable(String),
    /// The fence is gone while the marker still names the partition (partial loss).
    FenceMissing {
        shard: u32,
        marker_copy: Option<i64>,
    },
    /// The fence or marker holds something that is not an offset.
    FenceCorrupt { shard: u32 },
    /// Redis lost the partition's state and `recovery.on_state_lost = "halt"`.
    StateLost,
    /// Redis has applied offsets the topic does not have (recreated or truncated topic).
    BeyondEnd { applied: i64, high: i64 },
}

impl Halt {
    /// The metric label.
    pub(super) fn reason(&self) -> HaltReason {
        match self {
            Halt::RedisUnavailable(_) => HaltReason::RedisUnavailable,
            Halt::KafkaUnavailable(_) => HaltReason::KafkaUnavailable,
            Halt::FenceMissing { .. } => HaltReason::FenceMissing,
            Halt::FenceCorrupt { .. } => HaltReason::FenceCorrupt,
            Halt::StateLost => HaltReason::StateLost,
            Halt::BeyondEnd { .. } => HaltReason::BeyondEnd,
        }
    }

    /// What happened and what the operator can do, for logs and `/health/ready`.
    pub(super) fn describe(&self, partition: i32) -> String {
        match self {
            Halt::RedisUnavailable(e) => format!("partition {partition}: redis unavailable ({e}); retrying"),
            Halt::KafkaUnavailable(e) => format!("partition {partition}: cannot read offsets from kafka ({e}); retrying"),
            Halt::FenceMissing { shard, marker_copy } => format!(
                "partition {partition}: applied offset of shard {shard} is missing while the rest of tally's state exists (deleted, evicted or partially restored); replaying would count twice. Inspect with `tally state`, repair with `tally state repair --partition {partition}` ({})",
                match marker_copy {
                    Some(n) => format!("the state marker's copy says {n}"),
                    None => "no copy in the state marker: pass --offset".to_string(),
                }
            ),
            Halt::FenceCorrupt { shard } => format!(
                "partition {partition}: applied offset or state marker of shard {shard} holds something that is not an offset; inspect with `tally state`, repair with `tally state repair --partition {partition} --offset N`"
            ),
            Halt::StateLost => format!(
                "partition {partition}: redis lost tally's state and recovery.on_state_lost = \"halt\"; repair with `tally state repair --partition {partition} --offset N`"
            ),
            Halt::BeyondEnd { applied, high } => format!(
                "partition {partition}: redis has applied up to offset {applied} but the topic ends at {high} (topic recreated or truncated?); repair with `tally state repair --partition {partition} --offset N`"
            ),
        }
    }
}

/// What the worker knows about its partitions beyond the aggregator: how they start and recover,
/// which are halted, which are being rebuilt.
pub(super) struct PartitionStates {
    /// Start policy, recovery policy, readiness, Redis wait.
    pub(super) access: StateAccess,
    /// Assigned partitions not consumed until their state allows it, and why.
    pub(super) parked: BTreeMap<i32, Halt>,
    last_parked_retry: Instant,
    /// Partitions being recounted after Redis lost their state.
    pub(super) rebuilding: HashMap<i32, Rebuild>,
    last_progress_log: Instant,
}

impl PartitionStates {
    pub(super) fn new(access: StateAccess) -> PartitionStates {
        PartitionStates {
            access,
            parked: BTreeMap::new(),
            last_parked_retry: Instant::now(),
            rebuilding: HashMap::new(),
            last_progress_log: Instant::now(),
        }
    }
}

/// A partition being recounted after Redis lost its state.
pub(super) struct Rebuild {
    /// End of the partition when the rebuild began: done once the position passes it.
    end: i64,
    from: i64,
    started: Instant,
}

impl Worker {
    /// Decide where each of `parts` starts, from Redis' fences and Kafka's offsets. `Ok(start)`:
    /// the partition is tracked and must be consumed from `start`; `Err`: it must not be.
    pub(super) fn open_partitions(
        &mut self,
        consumer: &BaseConsumer<TallyContext>,
        parts: &[i32],
    ) -> Vec<(i32, Result<i64, Halt>)> {
        let mut tpl = TopicPartitionList::new();
        for &p in parts {
            tpl.add_partition(&self.topic, p);
        }
        let committed = consumer.committed_offsets(tpl, KAFKA_TIMEOUT);
        let mut out = Vec::with_capacity(parts.len());
        let mut ready = Vec::with_capacity(parts.len());
        for &p in parts {
            let has_commit = match &committed {
                Ok(c) => c
                    .find_partition(&self.topic, p)
                    .is_some_and(|e| matches!(e.offset(), Offset::Offset(n) if n >= 0)),
                Err(e) => {
                    out.push((p, Err(Halt::KafkaUnavailable(e.to_string()))));
                    continue;
                }
            };
            let (low, high) = match consumer.fetch_watermarks(&self.topic, p, KAFKA_TIMEOUT) {
                Ok(w) => w,
                Err(e) => {
                    out.push((p, Err(Halt::KafkaUnavailable(e.to_string()))));
                    continue;
                }
            };
            // Where to start if Redis has no state for the partition (-1: do not create it).
            let fresh = match (
                has_commit,
                self.states.access.recovery.on_state_lost,
                self.states.access.start_from,
            ) {
                (true, OnStateLost::Rebuild, _) => low,
                (true, OnStateLost::Halt, _) => -1,
                (false, _, StartFrom::Earliest) => low,
                (false, _, StartFrom::Latest) => high,
            };
            ready.push((p, fresh, has_commit, low, high));
        }
        if ready.is_empty() {
            return out;
        }
        let request: Vec<(i32, i64)> = ready.iter().map(|r| (r.0, r.1)).collect();
        let fences = match self.init_fences(request) {
            Ok(fences) => fences,
            Err(e) => {
                out.extend(
                    ready
                        .iter()
                        .map(|r| (r.0, Err(Halt::RedisUnavailable(e.clone())))),
                );
                return out;
            }
        };
        for ((p, states), &(_, _, has_commit, low, high)) in fences.into_iter().zip(&ready) {
            out.push((p, self.open_one(p, &states, has_commit, low, high)));
        }
        out
    }

    fn open_one(
        &mut self,
        p: i32,
        states: &[FenceState],
        has_commit: bool,
        low: i64,
        high: i64,
    ) -> Result<i64, Halt> {
        let mut applied = Vec::with_capacity(states.len());
        let mut created = false;
        for (shard, state) in states.iter().enumerate() {
            let shard = shard as u32;
            match *state {
                FenceState::Existing(n) => applied.push(n),
                FenceState::Created(n) => {
                    created = true;
                    applied.push(n);
                }
                FenceState::Missing { marker_copy } => {
                    return Err(Halt::FenceMissing { shard, marker_copy })
                }
                FenceState::Corrupt => return Err(Halt::FenceCorrupt { shard }),
                FenceState::Absent => return Err(Halt::StateLost),
            }
        }
        let start = applied.iter().copied().min().unwrap_or(low);
        if start > high {
            self.metrics.offset_reset(ResetReason::BeyondEnd);
            return Err(Halt::BeyondEnd {
                applied: start,
                high,
            });
        }
        if created && has_commit {
            self.metrics.state_rebuilds.inc();
            tracing::error!(
                partition = p,
                from = low,
                to = high,
                "redis lost tally's state for this partition; recounting it from the earliest retained offset (windows whose events are no longer retained stay undercounted)"
            );
            self.states.rebuilding.insert(
                p,
                Rebuild {
                    end: high,
                    from: low,
                    started: Instant::now(),
                },
            );
        } else if created {
            tracing::info!(partition = p, start, "partition new to tally's state");
        }
        if start < low {
            self.metrics.offset_reset(ResetReason::BeforeLogStart);
            tracing::error!(
                partition = p,
                applied = start,
                log_start = low,
                lost = low - start,
                "offsets between the applied offset and the start of the topic were deleted by retention before tally counted them; continuing at the start of the topic"
            );
        }
        self.agg.assign(p, &applied);
        Ok(start.max(low))
    }

    /// Ask the sink for the fences of `partitions`, waiting at most the init timeout.
    fn init_fences(
        &mut self,
        partitions: Vec<(i32, i64)>,
    ) -> Result<Vec<(i32, Vec<FenceState>)>, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.sink
            .send(SinkRequest::InitFences {
                partitions,
                reply: tx,
            })
            .map_err(|_| "redis sink stopped".to_string())?;
        match rx.recv_timeout(self.states.access.init_timeout) {
            Ok(result) => result,
            Err(_) => Err(format!(
                "no answer within {:?}",
                self.states.access.init_timeout
            )),
        }
    }

    /// Stop counting `partition` until it can be opened again. Pauses it when `consumer` is
    /// given (after a rebalance assigns it, the caller pauses parked partitions itself).
    pub(super) fn park(
        &mut self,
        consumer: Option<&BaseConsumer<TallyContext>>,
        partition: i32,
        halt: Halt,
    ) {
        self.agg.revoke(partition);
        self.states.rebuilding.remove(&partition);
        if let Some(consumer) = consumer {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.topic, partition);
            if let Err(e) = consumer.pause(&tpl) {
                tracing::warn!(partition, error = %e, "cannot pause partition");
            }
        }
        if self.states.parked.get(&partition) == Some(&halt) {
            return;
        }
        match &halt {
            Halt::RedisUnavailable(_) | Halt::KafkaUnavailable(_) => {
                tracing::warn!(partition, reason = %halt.describe(partition), "partition waiting")
            }
            _ => tracing::error!(partition, reason = %halt.describe(partition), "partition halted"),
        }
        self.states.parked.insert(partition, halt);
        self.publish_halts();
    }

    /// Forget a parked partition (revoked, or opened again).
    pub(super) fn unpark(&mut self, partition: i32) {
        if self.states.parked.remove(&partition).is_some() {
            self.publish_halts();
        }
    }

    /// Readiness and the per-reason gauge follow the parked set.
    fn publish_halts(&mut self) {
        for &reason in HaltReason::ALL {
            let n = self
                .states
                .parked
                .values()
                .filter(|h| h.reason() == reason)
                .count();
            self.gauges.set_halted(reason, n);
        }
        self.states.access.health.set_halted(
            self.states.access.lane,
            self.states.parked.iter().map(|(p, h)| h.describe(*p)),
        );
    }

    /// Pause every parked partition (after a rebalance assigned them).
    pub(super) fn pause_parked(&self, consumer: &BaseConsumer<TallyContext>) {
        let mut tpl = TopicPartitionList::new();
        for &p in self.states.parked.keys() {
            tpl.add_partition(&self.topic, p);
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.pause(&tpl) {
                tracing::warn!(error = %e, "cannot pause parked partitions");
            }
        }
    }

    /// Try parked partitions again (every few seconds); resume those that open.
    pub(super) fn retry_parked(&mut self, consumer: &BaseConsumer<TallyContext>) {
        if self.states.parked.is_empty() || self.states.last_parked_retry.elapsed() < RETRY_PARKED {
            return;
        }
        self.states.last_parked_retry = Instant::now();
        let parts: Vec<i32> = self
            .states
            .parked
            .keys()
            .copied()
            .filter(|p| !self.revoking.contains(p))
            .collect();
        for (p, result) in self.open_partitions(consumer, &parts) {
            match result {
                Ok(start) => {
                    if let Err(e) =
                        consumer.seek(&self.topic, p, Offset::Offset(start), KAFKA_TIMEOUT)
                    {
                        tracing::warn!(partition = p, error = %e, "cannot seek; will retry");
                        self.agg.revoke(p);
                        continue;
                    }
                    self.unpark(p);
                    if !self.paused {
                        let mut tpl = TopicPartitionList::new();
                        tpl.add_partition(&self.topic, p);
                        let _ = consumer.resume(&tpl);
                    }
                    tracing::info!(partition = p, start, "partition resumed");
                }
                Err(halt) => self.park(None, p, halt),
            }
        }
    }

    /// Report how far rebuilding partitions have come (metric always, log every 10 s).
    pub(super) fn report_rebuilds(&mut self) {
        if self.states.rebuilding.is_empty() {
            self.gauges.rebuild_remaining.set(0);
            return;
        }
        let log = self.states.last_progress_log.elapsed() >= LOG_PROGRESS;
        if log {
            self.states.last_progress_log = Instant::now();
        }
        let mut finished = Vec::new();
        let mut total_remaining = 0;
        for (&p, rebuild) in &self.states.rebuilding {
            let Some(position) = self.agg.position(p) else {
                continue;
            };
            let remaining = (rebuild.end - position).max(0);
            if remaining == 0 {
                finished.push(p);
                tracing::info!(
                    partition = p,
                    offsets = rebuild.end - rebuild.from,
                    seconds = rebuild.started.elapsed().as_secs_f64(),
                    "rebuild read everything the topic held when it began"
                );
                continue;
            }
            total_remaining += remaining;
            if log {
                let done = position - rebuild.from;
                let rate = done as f64 / rebuild.started.elapsed().as_secs_f64().max(1e-3);
                let eta_s = if rate > 0.0 {
                    remaining as f64 / rate
                } else {
                    f64::INFINITY
                };
                tracing::info!(
                    partition = p,
                    done,
                    remaining,
                    rate = rate.round(),
                    eta_s = eta_s.round(),
                    "rebuilding from the earliest retained offset"
                );
            }
        }
        self.gauges.rebuild_remaining.set(total_remaining);
        for p in finished {
            self.states.rebuilding.remove(&p);
        }
    }
}
