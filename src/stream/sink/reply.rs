//! What Redis answers to the scripts of [`super::script`], as types, and how a flush's replies
//! add up to its [`FlushOutcome`].
//!
//! Every script reports a fence with the codes of `fence_status` (`lua/prelude.lua`); they
//! are read in one place, [`FenceCode::from_pair`], and every reply type maps from it.

use std::time::Instant;

use redis::Value;
use tally_counters::script::{int_array, ReplyShapeError};

use crate::ops::metrics::{Metrics, RejectReason};

/// The state of one fence, as every script reports it: the one mapping from the scripts'
/// codes to their meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCode {
    /// `1`: the fence is where the call expects it (or, for
    /// [`INIT_LUA`](super::script::INIT_LUA), exists), at this offset.
    Ready(i64),
    /// `0`: the call's whole range was applied already.
    Done,
    /// `-1`: Redis applied another range, up to this offset.
    Conflict(i64),
    /// `-2`: the fence is gone but the marker names the partition: the marker's copy of the
    /// applied offset, if readable (the script sends -1 when not).
    Missing(Option<i64>),
    /// `-3`: the fence or the marker holds something that is not an offset.
    Corrupt,
    /// `-4`: neither fence nor marker entry.
    Absent,
}

impl FenceCode {
    /// A `code` and the value after it (`None` where the reply has none: `{0}`, `{-3}`,
    /// `{-4}`); `None` for a code that is not a fence's.
    pub fn from_pair(code: i64, value: Option<i64>) -> Option<FenceCode> {
        Some(match (code, value) {
            (1, Some(applied)) => FenceCode::Ready(applied),
            (0, _) => FenceCode::Done,
            (-1, Some(applied)) => FenceCode::Conflict(applied),
            (-2, Some(copy)) => FenceCode::Missing(Some(copy).filter(|n| *n >= 0)),
            (-3, _) => FenceCode::Corrupt,
            (-4, _) => FenceCode::Absent,
            _ => return None,
        })
    }
}

/// What Redis answered to one [`APPLY_LUA`](super::script::APPLY_LUA) call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyReply {
    /// The unit was applied.
    Applied {
        /// Keys skipped because their expiry passed before the script ran.
        late: u64,
        /// Keys whose INCRBY would overflow a 64-bit integer (left unchanged).
        overflow: u64,
        /// Keys holding a value that is not an integer, or another type (left unchanged).
        rejected: u64,
    },
    /// Redis had already applied the unit's whole range (a retry or a replay).
    AlreadyApplied,
    /// Redis applied a different range: the caller's view is stale (zombie, or lost writes).
    Conflict {
        /// The offset Redis has applied up to.
        applied: i64,
    },
    /// The fence is gone but the marker still names the partition: part of the state was lost.
    FenceMissing {
        /// The marker's copy of the applied offset, if readable.
        marker_copy: Option<i64>,
    },
    /// The fence or marker holds something that is not an offset.
    Corrupt,
    /// No fence and no marker entry: Redis lost this shard's state.
    StateLost,
    /// Not applied because another partition of the same merged call was refused: nothing of
    /// the call was written.
    NotApplied,
}

impl From<FenceCode> for ApplyReply {
    /// A fence's state as the answer for its range. A fence that was ready but whose range was
    /// not applied only occurs in a refused merged call (another of its fences refused it).
    fn from(code: FenceCode) -> ApplyReply {
        match code {
            FenceCode::Ready(_) => ApplyReply::NotApplied,
            FenceCode::Done => ApplyReply::AlreadyApplied,
            FenceCode::Conflict(applied) => ApplyReply::Conflict { applied },
            FenceCode::Missing(marker_copy) => ApplyReply::FenceMissing { marker_copy },
            FenceCode::Corrupt => ApplyReply::Corrupt,
            FenceCode::Absent => ApplyReply::StateLost,
        }
    }
}

/// A reply outside its script's contract (a bug, or a script of another version): the attempt
/// is retried, and the text says what came back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// Not an array of integers.
    #[error("unexpected reply: {0}")]
    Shape(#[from] ReplyShapeError),
    /// Fewer values than the script's status needs, or a status no script gives (the script
    /// named, the reply as Redis sent it).
    #[error("unexpected reply from {script}: {reply}")]
    Unknown {
        /// The script.
        script: &'static str,
        /// What came back.
        reply: String,
    },
    /// A pipeline or a merged call that answered for another number of items than it was sent.
    #[error("unexpected reply: {got} answers for {sent} items")]
    Count {
        /// Answers.
        got: usize,
        /// Items sent.
        sent: usize,
    },
}

impl ReplyError {
    pub(super) fn unknown(script: &'static str, value: &Value) -> ReplyError {
        ReplyError::Unknown {
            script,
            reply: format!("{value:?}"),
        }
    }
}

impl ApplyReply {
    /// Parse a reply of [`APPLY_LUA`](super::script::APPLY_LUA).
    pub fn parse(value: &Value) -> Result<ApplyReply, ReplyError> {
        let ints = int_array(value)?;
        let count = |i: usize| {
            ints.get(i)
                .map(|n| (*n).max(0) as u64)
                .ok_or_else(|| ReplyError::unknown("apply", value))
        };
        match ints.first() {
            Some(1) => Ok(ApplyReply::Applied {
                late: count(1)?,
                overflow: count(2)?,
                rejected: count(3)?,
            }),
            Some(&code) => FenceCode::from_pair(code, ints.get(1).copied())
                .map(ApplyReply::from)
                .ok_or_else(|| ReplyError::unknown("apply", value)),
            None => Err(ReplyError::unknown("apply", value)),
        }
    }
}

/// What Redis answered to one [`APPLY_MERGED_LUA`](super::script::APPLY_MERGED_LUA) call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedReply {
    /// Applied (every range), or already applied (every range).
    All(ApplyReply),
    /// Nothing written: each fence's state, in the order of the call's ranges.
    Refused(Vec<ApplyReply>),
}

impl MergedReply {
    /// Parse a reply of [`APPLY_MERGED_LUA`](super::script::APPLY_MERGED_LUA).
    pub fn parse(value: &Value) -> Result<MergedReply, ReplyError> {
        let ints = int_array(value)?;
        if ints.first() != Some(&-9) {
            return ApplyReply::parse(value).map(MergedReply::All);
        }
        ints[1..]
            .chunks(2)
            .map(|pair| match *pair {
                [code, n] => FenceCode::from_pair(code, Some(n)).map(ApplyReply::from),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(MergedReply::Refused)
            .ok_or_else(|| ReplyError::unknown("apply_merged", value))
    }
}

/// What [`INIT_LUA`](super::script::INIT_LUA) found for one (partition, shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceState {
    /// The fence exists: Redis has applied up to here.
    Existing(i64),
    /// The state had nothing for the partition; its fence was created here.
    Created(i64),
    /// The fence is gone but the marker names the partition.
    Missing {
        /// The marker's copy of the applied offset, if readable.
        marker_copy: Option<i64>,
    },
    /// The fence or marker holds something that is not an offset.
    Corrupt,
    /// No state, and the caller asked not to create it.
    Absent,
}

impl FenceState {
    /// Parse one `{code, value}` item of an [`INIT_LUA`](super::script::INIT_LUA) reply.
    pub fn parse(value: &Value) -> Result<FenceState, ReplyError> {
        let ints = int_array(value)?;
        let (code, n) = match ints.as_slice() {
            [code, n] => (*code, *n),
            _ => return Err(ReplyError::unknown("init", value)),
        };
        if code == 2 {
            return Ok(FenceState::Created(n));
        }
        match FenceCode::from_pair(code, Some(n)) {
            Some(FenceCode::Ready(applied)) => Ok(FenceState::Existing(applied)),
            Some(FenceCode::Missing(marker_copy)) => Ok(FenceState::Missing { marker_copy }),
            Some(FenceCode::Corrupt) => Ok(FenceState::Corrupt),
            Some(FenceCode::Absent) => Ok(FenceState::Absent),
            _ => Err(ReplyError::unknown("init", value)),
        }
    }
}

/// A unit Redis refused, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Kafka partition of the unit.
    pub partition: i32,
    /// Shard of the unit.
    pub shard: u32,
    /// What the script found instead of the expected applied offset.
    pub reply: ApplyReply,
}

/// What happened to a flushed batch.
#[derive(Debug, Default)]
pub struct FlushOutcome {
    /// Units refused: another range applied, or tally's state missing or corrupt.
    pub refusals: Vec<Refusal>,
    /// Units whose whole range Redis had already applied (nothing written).
    pub already_applied: u64,
    /// Keys written.
    pub keys_written: u64,
    /// Keys skipped by the script because their expiry had passed before it ran.
    pub late_keys: u64,
    /// Keys whose INCRBY would overflow a 64-bit integer (left unchanged).
    pub overflow_keys: u64,
    /// Keys whose Redis value was not an integer (left unchanged).
    pub rejected_keys: u64,
}

/// What reading a call's reply needs once its keys are encoded.
pub(super) struct UnitMeta {
    /// The partitions of the call (one, unless merged).
    pub(super) partitions: smallvec::SmallVec<[i32; 1]>,
    /// Sent with [`APPLY_MERGED_LUA`](super::script::APPLY_MERGED_LUA) (its reply is a [`MergedReply`]).
    pub(super) merged: bool,
    pub(super) shard: u32,
    /// Keys the call writes when applied.
    pub(super) keys: u64,
}

impl FlushOutcome {
    /// Add the reply of one call (`call`: what it held) to the outcome.
    pub(super) fn absorb(&mut self, call: &UnitMeta, reply: &Value) -> Result<(), ReplyError> {
        let parsed = if call.merged {
            MergedReply::parse(reply)?
        } else {
            MergedReply::All(ApplyReply::parse(reply)?)
        };
        let each = match parsed {
            MergedReply::All(ApplyReply::Applied {
                late,
                overflow,
                rejected,
            }) => {
                self.late_keys += late;
                self.overflow_keys += overflow;
                self.rejected_keys += rejected;
                self.keys_written += call.keys.saturating_sub(late + overflow + rejected);
                return Ok(());
            }
            MergedReply::All(reply) => vec![reply; call.partitions.len()],
            MergedReply::Refused(each) if each.len() == call.partitions.len() => each,
            MergedReply::Refused(each) => {
                return Err(ReplyError::Count {
                    got: each.len(),
                    sent: call.partitions.len(),
                })
            }
        };
        for (&partition, reply) in call.partitions.iter().zip(each) {
            match reply {
                ApplyReply::AlreadyApplied => self.already_applied += 1,
                reply => self.refusals.push(Refusal {
                    partition,
                    shard: call.shard,
                    reply,
                }),
            }
        }
        Ok(())
    }

    /// Count this landed flush (`keys`: entries sent, `started`: when it was received).
    pub(super) fn observe(&self, metrics: &Metrics, started: Instant, keys: usize) {
        metrics
            .sink
            .flush_duration
            .observe(started.elapsed().as_secs_f64());
        metrics.sink.flush_keys.observe(keys as f64);
        metrics.sink.keys_flushed.inc_by(self.keys_written);
        metrics.sink.late_keys.inc_by(self.late_keys);
        metrics.sink.fence_conflicts.inc_by(
            self.refusals
                .iter()
                .filter(|r| matches!(r.reply, ApplyReply::Conflict { .. }))
                .count() as u64,
        );
        metrics
            .sink
            .keys_refused(RejectReason::Overflow, self.overflow_keys);
        metrics
            .sink
            .keys_refused(RejectReason::NotInteger, self.rejected_keys);
        metrics
            .sink
            .units_already_applied
            .inc_by(self.already_applied);
        if self.rejected_keys > 0 || self.overflow_keys > 0 {
            tracing::error!(
                not_integer = self.rejected_keys,
                overflow = self.overflow_keys,
                "redis refused increments: counter keys hold non-integer values or would overflow; left unchanged (tally_keys_rejected_total)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(ints: &[i64]) -> Value {
        Value::Array(ints.iter().map(|n| Value::Int(*n)).collect())
    }

    fn call(partitions: &[i32], merged: bool) -> UnitMeta {
        UnitMeta {
            partitions: partitions.iter().copied().collect(),
            merged,
            shard: 2,
            keys: 10,
        }
    }

    #[test]
    fn every_reply_type_reads_the_fence_codes_alike() {
        assert_eq!(ApplyReply::parse(&reply(&[-4])), Ok(ApplyReply::StateLost));
        assert_eq!(
            ApplyReply::parse(&reply(&[-2, -1])),
            Ok(ApplyReply::FenceMissing { marker_copy: None })
        );
        assert!(
            ApplyReply::parse(&reply(&[-1])).is_err(),
            "a conflict names its offset"
        );
        assert_eq!(
            MergedReply::parse(&reply(&[-9, 1, 5, -1, 9])),
            Ok(MergedReply::Refused(vec![
                ApplyReply::NotApplied,
                ApplyReply::Conflict { applied: 9 }
            ]))
        );
        assert_eq!(
            FenceState::parse(&reply(&[-2, 4])),
            Ok(FenceState::Missing {
                marker_copy: Some(4)
            })
        );
        assert!(FenceState::parse(&reply(&[-1, 4])).is_err());
        assert!(MergedReply::parse(&reply(&[-9, 7, 0])).is_err());
    }

    #[test]
    fn absorb_counts_applied_keys_and_names_each_refused_partition() {
        let mut outcome = FlushOutcome::default();
        outcome
            .absorb(&call(&[0], false), &reply(&[1, 1, 2, 3]))
            .unwrap();
        assert_eq!(
            (
                outcome.keys_written,
                outcome.late_keys,
                outcome.overflow_keys
            ),
            (4, 1, 2)
        );
        outcome.absorb(&call(&[1, 2], true), &reply(&[0])).unwrap();
        assert_eq!(outcome.already_applied, 2);
        outcome
            .absorb(&call(&[3, 4], true), &reply(&[-9, 0, 8, -1, 9]))
            .unwrap();
        assert_eq!(outcome.already_applied, 3);
        assert_eq!(
            outcome.refusals,
            vec![Refusal {
                partition: 4,
                shard: 2,
                reply: ApplyReply::Conflict { applied: 9 }
            }]
        );
        assert!(outcome
            .absorb(&call(&[5], true), &reply(&[-9, 1, 0, -4, 0]))
            .is_err());
    }
}
