//! Query: the Redis key (and value) of a counter for given dimension values and a time, for the
//! CLI (`tally key`, `tally query`) and HTTP (`GET /v1/count`). Uses the same template, escaping,
//! window and cluster-tag code as the pipeline, so a user never computes keys by hand.

use std::collections::BTreeMap;

use serde::Serialize;

mod range;

pub use range::{RangeAnswer, Span, WindowValue, MAX_BATCH_READS, MAX_TOP, MAX_WINDOWS};

use std::sync::Arc;

use crate::config::Model;
use crate::model::{CounterSpec, Kind, LookupError};
use crate::stream::sink::conn::Conn;
use tally_counters::request::Client;

/// Why a query cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The counter, its dimension values or the time cannot address a key.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The time could not be parsed.
    #[error("bad time `{0}`: use RFC 3339 or epoch milliseconds")]
    BadTime(String),
    /// The windows asked for cannot be read (too many, reversed), or another input is out of
    /// range: `field` names the input (a query parameter or body field).
    #[error("{detail}")]
    BadRange {
        /// The input at fault.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// The answer to a query.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = CountAnswer)]
pub struct Answer {
    /// Counter name.
    pub counter: String,
    /// The key as stored in Redis.
    pub key: String,
    /// Hash storage: the field of the hash `key` that holds the value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Current value (None: no event counted, or expired). Filled by `Query::fetch`: the count
    /// or sum; for distinct counters the number of distinct values (HyperLogLog: estimated);
    /// for leaderboards the number of members.
    pub value: Option<i64>,
    /// Leaderboards: the highest-scored members, best first (at most `top`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top: Option<Vec<(String, i64)>>,
    /// Window start, Unix ms.
    pub window_start_ms: i64,
    /// Window end, Unix ms.
    pub window_end_ms: i64,
    /// When the window expires (window end + retention), Unix ms; its keys are stored with an
    /// expiry up to the counter's `expiry_spread` later.
    pub expire_at_ms: i64,
}

/// Computes keys for a configuration and reads them.
pub struct Query {
    /// Counters and key layout, compiled once for the process.
    model: Arc<Model>,
    /// Multiplexed and shared: concurrent queries pipeline over one connection.
    client: Client,
}

impl Query {
    /// Queries of `model`'s counters over `client` (the process's request-side client).
    pub fn new(model: Arc<Model>, client: Client) -> Query {
        Query { client, model }
    }

    /// The counter a caller means: the one named, or the only one configured when none is.
    pub fn counter_named(&self, given: Option<String>) -> Result<String, QueryError> {
        match (given, self.model.counters.as_slice()) {
            (Some(name), _) => Ok(name),
            (None, [only]) => Ok(only.name.clone()),
            (None, _) => Err(QueryError::BadRange {
                field: "counter",
                detail: "name the counter (`counter`): more than one is configured".into(),
            }),
        }
    }

    /// The counter named `counter`.
    fn spec(&self, counter: &str) -> Result<&CounterSpec, QueryError> {
        self.model
            .counter(counter)
            .ok_or_else(|| LookupError::UnknownCounter(counter.to_string()).into())
    }

    /// Run single-key reads in as few round trips as the deployment allows (one pipeline per
    /// cluster slot), replies in order; a broken connection is replaced on the next call.
    async fn pipe_keyed(
        &self,
        cmds: Vec<(Vec<u8>, redis::Cmd)>,
    ) -> Result<Vec<redis::Value>, QueryError> {
        let mut conn = self.client.conn().await.map_err(redis_error)?;
        match conn.pipe_keyed(cmds).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.client.forget(&e);
                Err(e.into())
            }
        }
    }

    /// The key of `counter` for `dims` at `at_ms` (Unix ms).
    pub fn key(
        &self,
        counter: &str,
        dims: &BTreeMap<String, String>,
        at_ms: i64,
    ) -> Result<Answer, QueryError> {
        let c = self.spec(counter)?;
        let values = c.values_in_order(dims)?;
        let (key, field, window) = c.location_at(&values, at_ms, &self.model.layout);
        let key = String::from_utf8_lossy(&key).into_owned();
        Ok(Answer {
            counter: c.name.clone(),
            key,
            field: field.map(|f| String::from_utf8_lossy(&f).into_owned()),
            value: None,
            top: None,
            window_start_ms: window.start_ms,
            window_end_ms: window.end_ms,
            expire_at_ms: c.expire_at(window.end_ms),
        })
    }

    /// `key` plus the current value read from Redis.
    pub async fn fetch(
        &self,
        counter: &str,
        dims: &BTreeMap<String, String>,
        at_ms: i64,
    ) -> Result<Answer, QueryError> {
        let mut answer = self.key(counter, dims, at_ms)?;
        let mut conn = self.client.conn().await.map_err(redis_error)?;
        let kind = &self.spec(counter)?.kind;
        match read(&mut conn, kind, &mut answer).await {
            Ok(()) => Ok(answer),
            Err(e) => {
                self.client.forget(&e);
                Err(e.into())
            }
        }
    }
}

/// A request-path client error as a query error (both are Redis failures here).
fn redis_error(e: tally_counters::request::RequestError) -> QueryError {
    match e {
        tally_counters::request::RequestError::Redis(r)
        | tally_counters::request::RequestError::Unreachable(r)
        | tally_counters::request::RequestError::OutcomeUnknown(r) => QueryError::Redis(r),
        other => QueryError::Redis(redis::RedisError::from(std::io::Error::other(
            other.to_string(),
        ))),
    }
}

/// Most members a leaderboard answer lists (by default).
pub const TOP: isize = crate::model::DEFAULT_TOP as isize;

/// Read `answer`'s value the way its counter's kind keeps it.
async fn read(conn: &mut Conn, kind: &Kind, answer: &mut Answer) -> redis::RedisResult<()> {
    let key = &answer.key;
    let exists = |n: i64| (n > 0).then_some(n);
    match kind {
        Kind::Count => answer.value = conn.query(redis::cmd("GET").arg(key)).await?,
        Kind::HashCount { .. } => {
            let field = answer.field.as_deref().unwrap_or_default();
            answer.value = conn.query(redis::cmd("HGET").arg(key).arg(field)).await?;
        }
        Kind::Distinct { exact, .. } => {
            let cmd = if *exact { "SCARD" } else { "PFCOUNT" };
            answer.value = exists(conn.query(redis::cmd(cmd).arg(key)).await?);
        }
        Kind::Leaderboard { .. } => {
            answer.value = exists(conn.query(redis::cmd("ZCARD").arg(key)).await?);
            let top: Vec<(String, i64)> = conn
                .query(
                    redis::cmd("ZREVRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(TOP - 1)
                        .arg("WITHSCORES"),
                )
                .await?;
            answer.top = Some(top);
        }
    }
    Ok(())
}

/// Parse a time given as RFC 3339 or epoch milliseconds; None means now.
pub fn parse_time(text: Option<&str>) -> Result<i64, QueryError> {
    match text {
        None => Ok(chrono::Utc::now().timestamp_millis()),
        Some(t) => t
            .parse::<i64>()
            .or_else(|_| chrono::DateTime::parse_from_rfc3339(t).map(|d| d.timestamp_millis()))
            .map_err(|_| QueryError::BadTime(t.to_string())),
    }
}
