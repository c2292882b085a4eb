//! Range queries: a counter's values over several windows (the current one, the last N, or those
//! between two times), combined into one figure, for one dimension tuple or a batch of them.
//! A sliding window ("the last 60 minutes") is a range over tumbling buckets: its error is the
//! bucket granularity (the oldest bucket counts whole), plus the HyperLogLog error for distinct
//! counters kept as HyperLogLogs.
//!
//! The reads of one request go out together: one pipeline on a server, one per slot (all at
//! once) on a cluster.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Query, QueryError};
use crate::model::{CounterSpec, Kind};
use crate::window::Window;

/// Most windows one query may span (per dimension tuple).
pub const MAX_WINDOWS: usize = 1440;
/// Most leaderboard members one answer lists.
pub const MAX_TOP: usize = 1000;
/// Most (tuple, window) reads one batch may ask for.
pub const MAX_BATCH_READS: usize = 100_000;

/// Which windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The window holding this time (Unix ms).
    At(i64),
    /// The last N windows up to and including the one holding `now`.
    Last(usize),
    /// Every window from the one holding `from` to the one holding `to` (Unix ms).
    Between(i64, i64),
}

/// One window's value.
#[derive(Debug, Clone, Serialize)]
pub struct WindowValue {
    /// Window start, Unix ms.
    pub start_ms: i64,
    /// Window end, Unix ms.
    pub end_ms: i64,
    /// The stored key (and hash field).
    pub key: String,
    /// Hash storage: the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The value (count, sum, distinct count, leaderboard members); None: nothing stored.
    pub value: Option<i64>,
    /// The window's keys have expired (window end + retention is past): a missing value means
    /// nothing is kept, not zero.
    pub expired: bool,
}

/// A range's answer for one dimension tuple.
#[derive(Debug, Clone, Serialize)]
pub struct RangeAnswer {
    /// Counter name.
    pub counter: String,
    /// The dimension values asked for.
    pub dimensions: BTreeMap<String, String>,
    /// Combined over the windows: the sum for counts; the union's cardinality for distinct and
    /// leaderboards (None where it cannot be computed, see `note`).
    pub value: Option<i64>,
    /// Leaderboards: the best members over the range (scores summed), best first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top: Option<Vec<(String, i64)>>,
    /// Oldest first.
    pub windows: Vec<WindowValue>,
    /// What the figure does not cover (expired windows, approximations).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Query {
    /// The windows of `spec` that `span` covers, oldest first.
    fn windows(spec: &CounterSpec, span: Span, now_ms: i64) -> Result<Vec<Window>, QueryError> {
        let (from, to) = match span {
            Span::At(t) => (t, t),
            Span::Between(a, b) if a > b => {
                return Err(QueryError::BadRange {
                    field: "from",
                    detail: "`from` is after `to`".into(),
                })
            }
            Span::Between(a, b) => (a, b),
            Span::Last(0) => {
                return Err(QueryError::BadRange {
                    field: "last",
                    detail: "`last` must be at least 1".into(),
                })
            }
            Span::Last(n) if n > MAX_WINDOWS => {
                return Err(QueryError::BadRange {
                    field: "last",
                    detail: format!("at most {MAX_WINDOWS} windows per query"),
                })
            }
            Span::Last(n) => {
                let mut w = spec.window.window_of(now_ms);
                let mut out = vec![w];
                while out.len() < n {
                    w = spec.window.window_of(w.start_ms - 1);
                    out.push(w);
                }
                out.reverse();
                return Ok(out);
            }
        };
        let mut out = Vec::new();
        let mut w = spec.window.window_of(from);
        loop {
            out.push(w);
            if w.end_ms > to {
                return Ok(out);
            }
            if out.len() >= MAX_WINDOWS {
                return Err(QueryError::BadRange {
                    field: "from",
                    detail: format!(
                        "the range spans more than {MAX_WINDOWS} windows of {}s",
                        spec.window.size_secs()
                    ),
                });
            }
            w = spec.window.window_of(w.end_ms);
        }
    }

    /// `counter`'s values for each tuple of `tuples` over `span` (leaderboards: the top 10).
    pub async fn range(
        &self,
        counter: &str,
        tuples: &[BTreeMap<String, String>],
        span: Span,
        now_ms: i64,
    ) -> Result<Vec<RangeAnswer>, QueryError> {
        self.range_top(counter, tuples, span, now_ms, super::TOP as usize)
            .await
    }

    /// As [`Query::range`], listing the best `top` members of leaderboards (1 to [`MAX_TOP`]).
    pub async fn range_top(
        &self,
        counter: &str,
        tuples: &[BTreeMap<String, String>],
        span: Span,
        now_ms: i64,
        top: usize,
    ) -> Result<Vec<RangeAnswer>, QueryError> {
        if !(1..=MAX_TOP).contains(&top) {
            return Err(QueryError::BadRange {
                field: "top",
                detail: format!("top must be between 1 and {MAX_TOP}"),
            });
        }
        let spec = self.spec(counter)?;
        let windows = Self::windows(spec, span, now_ms)?;
        if tuples.len().saturating_mul(windows.len()) > MAX_BATCH_READS {
            return Err(QueryError::BadRange {
                field: "dimensions",
                detail: format!(
                    "{} tuples × {} windows is more than {MAX_BATCH_READS} reads",
                    tuples.len(),
                    windows.len()
                ),
            });
        }
        let mut answers = Vec::with_capacity(tuples.len());
        let mut cmds = Vec::with_capacity(tuples.len() * windows.len());
        for dims in tuples {
            answers.push(self.tuple_reads(spec, dims, &windows, now_ms, &mut cmds)?);
        }
        let replies = self.pipe_keyed(cmds).await?;
        let mut replies = replies.into_iter();
        for answer in &mut answers {
            combine(spec, answer, &mut replies, top)?;
        }
        Ok(answers)
    }

    /// The answer for the tuple `dims` before any value is known: one cell per window, and its
    /// reads appended to `cmds` (one per window, plus the merged count of a HyperLogLog range).
    fn tuple_reads(
        &self,
        spec: &CounterSpec,
        dims: &BTreeMap<String, String>,
        windows: &[Window],
        now_ms: i64,
        cmds: &mut Vec<(Vec<u8>, redis::Cmd)>,
    ) -> Result<RangeAnswer, QueryError> {
        let values = spec.values_in_order(dims)?;
        let mut cells = Vec::with_capacity(windows.len());
        let mut union = redis::cmd("PFCOUNT");
        for w in windows {
            let (key, field, _) = spec.location_at(&values, w.start_ms, &self.model.layout);
            let cmd = read_cmd(&spec.kind, &key, field.as_deref());
            union.arg(&key);
            cmds.push((key.clone(), cmd));
            cells.push(WindowValue {
                start_ms: w.start_ms,
                end_ms: w.end_ms,
                key: String::from_utf8_lossy(&key).into_owned(),
                field: field.map(|f| String::from_utf8_lossy(&f).into_owned()),
                value: None,
                expired: spec.expire_at(w.end_ms) <= now_ms,
            });
        }
        if merges_hll(spec, windows.len()) {
            // Every window of a series lives in one slot: one PFCOUNT merges them.
            let first = spec
                .location_at(&values, windows[0].start_ms, &self.model.layout)
                .0;
            cmds.push((first, union));
        }
        Ok(RangeAnswer {
            counter: spec.name.clone(),
            dimensions: dims.clone(),
            value: None,
            top: None,
            windows: cells,
            notes: Vec::new(),
        })
    }
}

/// The read of one window's `key` (and hash `field`) of a counter of `kind`.
fn read_cmd(kind: &Kind, key: &[u8], field: Option<&[u8]>) -> redis::Cmd {
    match (kind, field) {
        (Kind::HashCount { .. }, Some(f)) => redis::cmd("HGET").arg(key).arg(f).clone(),
        (Kind::Distinct { exact: true, .. }, _) => redis::cmd("SMEMBERS").arg(key).clone(),
        (Kind::Distinct { exact: false, .. }, _) => redis::cmd("PFCOUNT").arg(key).clone(),
        (Kind::Leaderboard { .. }, _) => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .clone(),
        _ => redis::cmd("GET").arg(key).clone(),
    }
}

/// Whether a range of `n` windows of `spec` gets a merged HyperLogLog count.
fn merges_hll(spec: &CounterSpec, n: usize) -> bool {
    matches!(spec.kind, Kind::Distinct { exact: false, .. }) && n > 1
}

/// Fill `answer`'s values from the next replies, and combine them.
fn combine(
    spec: &CounterSpec,
    answer: &mut RangeAnswer,
    replies: &mut impl Iterator<Item = redis::Value>,
    top_n: usize,
) -> Result<(), QueryError> {
    use redis::FromRedisValue;
    let bad = |e: redis::RedisError| QueryError::Redis(e);
    let mut sum: i64 = 0;
    let mut members: std::collections::BTreeSet<String> = Default::default();
    let mut scores: BTreeMap<String, i64> = BTreeMap::new();
    for w in &mut answer.windows {
        let reply = replies.next().unwrap_or(redis::Value::Nil);
        match &spec.kind {
            Kind::Count | Kind::HashCount { .. } => {
                w.value = Option::<i64>::from_redis_value(reply).map_err(|e| bad(e.into()))?;
                sum = sum.saturating_add(w.value.unwrap_or(0));
            }
            Kind::Distinct { exact: true, .. } => {
                let set: Vec<String> = Vec::from_redis_value(reply).map_err(|e| bad(e.into()))?;
                w.value = (!set.is_empty()).then_some(set.len() as i64);
                members.extend(set);
            }
            Kind::Distinct { exact: false, .. } => {
                let n = i64::from_redis_value(reply).map_err(|e| bad(e.into()))?;
                w.value = (n > 0).then_some(n);
            }
            Kind::Leaderboard { .. } => {
                let board: Vec<(String, i64)> =
                    Vec::from_redis_value(reply).map_err(|e| bad(e.into()))?;
                w.value = (!board.is_empty()).then_some(board.len() as i64);
                for (m, s) in board {
                    *scores.entry(m).or_default() += s;
                }
            }
        }
    }
    match &spec.kind {
        Kind::Count | Kind::HashCount { .. } => answer.value = Some(sum),
        Kind::Distinct { exact: true, .. } => answer.value = Some(members.len() as i64),
        Kind::Distinct { exact: false, .. } => {
            answer.value = if merges_hll(spec, answer.windows.len()) {
                let merged = replies.next().unwrap_or(redis::Value::Nil);
                Some(i64::from_redis_value(merged).map_err(|e| bad(e.into()))?)
            } else {
                answer.windows[0].value.or(Some(0))
            };
        }
        Kind::Leaderboard { .. } => {
            answer.value = Some(scores.len() as i64);
            let mut top: Vec<(String, i64)> = scores.into_iter().collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(top_n);
            answer.top = Some(top);
        }
    }
    let expired = answer.windows.iter().filter(|w| w.expired).count();
    if expired > 0 {
        answer.notes.push(format!(
            "{expired} window(s) are past their expiry (window end + retention): what they held is gone, not zero"
        ));
    }
    Ok(())
}
