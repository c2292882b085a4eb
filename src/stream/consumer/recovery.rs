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
//!
//! This module is the table and nothing else: [`fresh_start`] says what Redis should create
//! for a partition it has no state for (rows 2 and 3; the init script creates it atomically
//! with reading the fences), and [`decide`] reads the answer. Reading Kafka, asking Redis,
//! logging and metrics stay with the worker, so every row is unit-tested below.

use crate::config::{OnStateLost, StartFrom};
use crate::ops::metrics::HaltReason;
use crate::stream::sink::FenceState;

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

    /// The `tally state` arguments that repair the partition, when an operator must act
    /// (`repair --partition P [--offset N]`); None when it resumes by itself.
    pub(super) fn repair_args(&self, partition: i32) -> Option<String> {
        match self {
            Halt::RedisUnavailable(_) | Halt::KafkaUnavailable(_) => None,
            // The marker's copy is what `repair` without --offset writes.
            Halt::FenceMissing {
                marker_copy: Some(_),
                ..
            } => Some(format!("repair --partition {partition}")),
            _ => Some(format!("repair --partition {partition} --offset N")),
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

/// Where a partition opens, and what the caller must report about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Start {
    /// The first offset to consume.
    pub(super) offset: i64,
    /// The applied offset of each shard, for the aggregator (a message is counted in a shard
    /// only at or past its fence).
    pub(super) applied: Vec<i64>,
    /// Whether Redis had the state or just created it.
    pub(super) origin: Origin,
    /// The applied offset, when it lies before the start of the topic: the offsets between it
    /// and the start were deleted by retention before tally counted them (row 7).
    pub(super) gap_from: Option<i64>,
}

/// Where a partition's state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// Redis held the fences (row 1).
    Fence,
    /// New to tally: created at `kafka.start_from` (row 2).
    New,
    /// Redis lost the state while Kafka has a commit: recounted from the earliest retained
    /// offset up to the end the topic had (row 3).
    Rebuild { from: i64, end: i64 },
}

/// Where Redis should create a partition's fences if it holds no state for it (rows 2 and 3),
/// from whether Kafka has a commit and the partition's `low`/`high` watermarks; `None`: create
/// nothing (the state was lost and `recovery.on_state_lost = "halt"`).
pub(super) fn fresh_start(
    has_commit: bool,
    on_state_lost: OnStateLost,
    start_from: StartFrom,
    low: i64,
    high: i64,
) -> Option<i64> {
    match (has_commit, on_state_lost, start_from) {
        (true, OnStateLost::Rebuild, _) => Some(low),
        (true, OnStateLost::Halt, _) => None,
        (false, _, StartFrom::Earliest) => Some(low),
        (false, _, StartFrom::Latest) => Some(high),
    }
}

/// Where a partition starts, from the fence state of each of its shards (as the init script
/// read or created them, see [`fresh_start`]), whether Kafka has a commit for it, and its
/// `low`/`high` watermarks. The first shard that does not allow a start decides the halt.
pub(super) fn decide(
    states: &[FenceState],
    has_commit: bool,
    low: i64,
    high: i64,
) -> Result<Start, Halt> {
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
        return Err(Halt::BeyondEnd {
            applied: start,
            high,
        });
    }
    let origin = match (created, has_commit) {
        (true, true) => Origin::Rebuild {
            from: low,
            end: high,
        },
        (true, false) => Origin::New,
        (false, _) => Origin::Fence,
    };
    Ok(Start {
        offset: start.max(low),
        applied,
        origin,
        gap_from: (start < low).then_some(start),
    })
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
