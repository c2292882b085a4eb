//! The request path: answers while a request is in flight. Every primitive is one atomic Lua
//! script (run by SHA, reloaded on NOSCRIPT) over keys that share one hash tag, so it works the
//! same on a single server and on Redis Cluster:
//!
//! * [`Counters::hit`]: add to a windowed counter (the stream path's keys) and return the total;
//!   the key gets its window's absolute expiry in the same step; an idempotency key makes a
//!   retried hit count once.
//! * [`RateLimiter`]: fixed window, exact sliding log, sliding window counter and GCRA; several
//!   policies decided in one call; shadow mode.
//! * [`Quota`]: the first N win, optionally once per user; release.
//! * [`Once`]: the first call per subject and window.
//! * [`Pool`]: distinct items handed out, at most one per user.
//! * [`Unique`]: distinct items seen in a sliding window.
//! * [`Ledger`]: Envoy's rate limit quota service: reported usage per window and each Envoy's
//!   reservation, capped so that their sum stays within the limit.
//!
//! Concurrent rate-limit decisions share script calls when every in-flight slot of the
//! [`Client`] is taken (group commit, [`Batching`]): each decision still runs as if alone and
//! gets its own reply; see `batch.rs`.
//!
//! Each has `peek` (read without changing) and `reset`. Redis errors are returned as
//! [`RequestError`], never panics; what to do without Redis (fail open or closed) is the
//! caller's choice, and [`RateLimiter`] carries it per policy.

mod batch;
mod client;
mod confirm;
mod expiry;
mod hit;
mod limit;
mod link;
mod once;
mod policy;
mod pool;
mod quota;
mod rlqs;
mod unique;

pub use batch::Batching;
pub use client::Client;
pub use confirm::Durability;
pub use expiry::Expiry;
pub use hit::{Counters, Hit, HitReply};
pub use limit::{
    decide, decide_settling, unsupported_for_reservations, Algorithm, Ask, Decision, FailureMode,
    LimitPolicy, Phase, PolicyError, PolicyVerdict, RateLimiter, Reservation, Settled,
    LIMIT_BATCH_LUA, LIMIT_LUA, MAX_LOG_COST, MAX_RESERVATION,
};
pub use once::Once;
pub use pool::{Claim, Pool};
pub use quota::{Quota, QuotaReply, MAX_QUOTA_SIZE};
pub use rlqs::{BucketKeys, Granted, Ledger, LedgerAsk, Need, Standing};
pub use unique::{Unique, DEFAULT_MAX_ITEMS, MAX_ITEM_BYTES};

/// Why a request-path call has no answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Redis could not be reached or answered with an error; whether the command ran is told by
    /// [`RequestError::did_not_run`].
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No connection to Redis could be opened: nothing was sent.
    #[error("redis unreachable: {0}")]
    Unreachable(redis::RedisError),
    /// A hit was sent but no answer came (a response timeout, a connection lost in flight): it
    /// may have been counted. Only a retry with the same idempotency key is safe.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(redis::RedisError),
    /// Redis answered something the script's contract does not allow.
    #[error("unexpected reply from {script}: {detail}")]
    Reply {
        /// The script.
        script: &'static str,
        /// What came back.
        detail: String,
    },
    /// The caller's input cannot be used (bad numbers, unknown names, wrong actions).
    #[error("{0}")]
    Invalid(String),
    /// One input cannot be used: `field` names it (a lock's name, a unique item, a token).
    #[error("{detail}")]
    InvalidField {
        /// The input at fault, as the caller names it.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A hit's `delta` would take the counter out of the signed 64-bit range Redis counts in;
    /// nothing was added. Bad input (like [`RequestError::Invalid`]), typed so that callers can
    /// tell it apart.
    #[error(
        "delta: adding {delta} to counter `{counter}` would leave the range \
         -9223372036854775808..=9223372036854775807 (signed 64-bit); nothing was added"
    )]
    Overflow {
        /// The counter.
        counter: String,
        /// The refused delta.
        delta: i64,
    },
    /// The hit would take the counter past the bound it was given ([`Hit::max_value`]);
    /// nothing was added.
    #[error("this hit would take counter `{counter}` past {max} (either sign); nothing was added")]
    AboveMax {
        /// The counter.
        counter: String,
        /// The bound.
        max: i64,
    },
    /// The write was made on the primary but did not reach the replicas asked for within the
    /// time allowed ([`Durability`]): a failover could undo it, so it is not an admission.
    #[error(
        "the write reached {acked} of the {wanted} replicas asked for (request durability) in time: \
         not confirmed; a failover could undo it"
    )]
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that had it in time.
        acked: u32,
    },
    /// The request contradicts one made before (an idempotency key reused for another key).
    #[error("{0}")]
    Conflict(String),
    /// The counter, its dimension values or the time cannot address a key.
    #[error(transparent)]
    Lookup(#[from] crate::model::LookupError),
}

impl RequestError {
    /// Whether the same call may succeed later without a change on the caller's side: Redis
    /// was unavailable or slow (the outcome unknown: retry with the same idempotency key), or
    /// the write did not reach its replicas in time. Bad input, conflicts and replies outside
    /// the script's contract are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            RequestError::Redis(e) => redis_is_transient(e),
            RequestError::Unreachable(_)
            | RequestError::OutcomeUnknown(_)
            | RequestError::NotReplicated { .. } => true,
            _ => false,
        }
    }

    /// Whether the error says Redis was unavailable (as opposed to bad input or a bad reply).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            RequestError::Redis(_) | RequestError::Unreachable(_) | RequestError::OutcomeUnknown(_)
        )
    }

    /// Whether the error proves that Redis did not run the command: no connection could be
    /// opened, or Redis refused the command before running it (NOSCRIPT, OOM before the first
    /// write, LOADING, BUSY, a replica or a cluster that cannot take writes). A response timeout
    /// or a connection lost in flight proves nothing: the command may have run.
    pub fn did_not_run(&self) -> bool {
        match self {
            RequestError::Unreachable(_) => true,
            RequestError::Redis(e) => refused_before_running(e),
            _ => false,
        }
    }
}

/// A Redis error that a later try may not meet: the connection, a timeout, a failover, a busy
/// or loading server; not a command Redis refuses for what it is (a wrong type, a bad script).
pub(crate) fn redis_is_transient(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.code(),
            Some("LOADING" | "BUSY" | "MASTERDOWN" | "READONLY" | "TRYAGAIN" | "CLUSTERDOWN")
        )
}

/// An error of a command that was sent: unless Redis refused it, it may have run.
pub(crate) fn unknown_unless_refused(e: RequestError) -> RequestError {
    match e {
        RequestError::Redis(r) if !refused_before_running(&r) => RequestError::OutcomeUnknown(r),
        other => other,
    }
}

/// Error replies that Redis gives instead of running a command (a script that hits OOM or
/// READONLY fails at its first write, so it wrote nothing); and a refused connection.
fn refused_before_running(e: &redis::RedisError) -> bool {
    e.is_connection_refusal()
        || matches!(
            e.code(),
            Some(
                "NOSCRIPT"
                    | "OOM"
                    | "LOADING"
                    | "BUSY"
                    | "MASTERDOWN"
                    | "READONLY"
                    | "CLUSTERDOWN"
                    | "TRYAGAIN"
                    | "NOAUTH"
                    // A cluster node that does not serve the slot (a failover or a resharding
                    // moved it) redirects instead of running the command.
                    | "MOVED"
                    | "ASK"
            )
        )
}

/// A key of a request-path primitive: `<prefix><kind>:<escaped name>:<escaped subject>:{tag}`.
/// Names and subjects are escaped (so two pairs never share a key) and the hash tag is a hash of
/// `tag_of`, so every key of one decision lives in one cluster slot.
pub(crate) fn key(prefix: &str, kind: &str, name: &str, subject: &str, tag_of: &str) -> String {
    let mut buf = Vec::with_capacity(prefix.len() + name.len() + subject.len() + 32);
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(kind.as_bytes());
    buf.push(b':');
    crate::key::escape_into(&mut buf, name);
    buf.push(b':');
    crate::key::escape_into(&mut buf, subject);
    let mut out = String::from_utf8(buf).unwrap_or_default();
    out.push_str(&format!(":{{{:016x}}}", fnv1a(tag_of.as_bytes())));
    out
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The current time, Unix ms (the caller's clock: used to pick a window, never to decide limits).
pub(crate) use crate::clock::unix_ms as now_ms;

/// Parse a reply that must be an array of integers, naming the script in the error.
pub(crate) fn ints(script: &'static str, value: &redis::Value) -> Result<Vec<i64>, RequestError> {
    crate::script::int_array(value).map_err(|e| RequestError::Reply {
        script,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_and_tagged_by_their_group() {
        let a = key("t:", "limit", "api", "u:1", "u:1");
        let b = key("t:", "limit", "api:u", "1", "u:1");
        assert_ne!(a, b, "escaping keeps (name, subject) pairs apart");
        assert!(a.starts_with("t:limit:api:u%3A1:{"), "{a}");
        let other = key("t:", "limit", "daily", "u:1", "u:1");
        let tag = |k: &str| k[k.rfind('{').unwrap()..].to_string();
        assert_eq!(tag(&a), tag(&other), "one subject's policies share a slot");
        assert_ne!(tag(&a), tag(&key("t:", "limit", "api", "u:2", "u:2")));
    }
}
