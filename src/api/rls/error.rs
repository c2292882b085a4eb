//! Why a `ShouldRateLimit` call has no answer: a closed enum the parse and decide steps return,
//! turned into a gRPC status only at the edge ([`super::render::status`]).

use tally_counters::request::RequestError;

use super::sizes::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE_BYTES};

/// A call refused or not decided. Each message is what the caller reads in the status.
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    /// The request names no domain.
    #[error("rate limit domain must not be empty")]
    NoDomain,
    /// The request has no descriptor.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// The domain is longer than [`MAX_VALUE_BYTES`].
    #[error("the domain is {bytes} bytes; at most {MAX_VALUE_BYTES} are accepted")]
    LongDomain { bytes: usize },
    /// More than [`MAX_DESCRIPTORS`] descriptors.
    #[error("{count} descriptors; at most {MAX_DESCRIPTORS} are accepted")]
    TooManyDescriptors { count: usize },
    /// A descriptor with more than [`MAX_ENTRIES`] entries.
    #[error("descriptor {descriptor} has {count} entries; at most {MAX_ENTRIES} are accepted")]
    TooManyEntries { descriptor: usize, count: usize },
    /// An entry's key longer than [`MAX_VALUE_BYTES`].
    #[error(
        "descriptor {descriptor}'s key is {bytes} bytes; at most {MAX_VALUE_BYTES} are accepted"
    )]
    LongKey { descriptor: usize, bytes: usize },
    /// An entry's value longer than [`MAX_VALUE_BYTES`].
    #[error("descriptor {descriptor}'s value of `{key}` is {bytes} bytes; at most {MAX_VALUE_BYTES} are accepted")]
    LongValue {
        descriptor: usize,
        key: String,
        bytes: usize,
    },
    /// A descriptor's own `limit` names a unit Envoy does not define.
    #[error("limit override: unknown unit {unit}")]
    OverrideUnit { unit: i32 },
    /// A descriptor's own `limit` of 0 requests.
    #[error("limit override: requests_per_unit 0")]
    OverrideZero,
    /// A descriptor's own `limit` the limiter cannot hold (the policy's own check says why).
    #[error("{reason}")]
    Override {
        reason: tally_counters::request::PolicyError,
    },
    /// The limiter refused or failed the call.
    #[error(transparent)]
    Limiter(#[from] RequestError),
    /// Redis did not answer and a limit of the call has no `on_redis_error`: Envoy's
    /// `failure_mode_deny` decides.
    #[error("redis is unavailable")]
    RedisUnavailable,
}

/// What kind of failure (`tally_rls_errors_total{kind}`), which is also the gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlsErrorKind {
    /// The call cannot be decided as sent: INVALID_ARGUMENT.
    Invalid,
    /// Redis is needed and not there: UNAVAILABLE (retry, or Envoy's failure mode).
    Unavailable,
    /// Anything else: INTERNAL.
    Internal,
}

impl RlsErrorKind {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RlsErrorKind::Invalid => "invalid",
            RlsErrorKind::Unavailable => "unavailable",
            RlsErrorKind::Internal => "internal",
        }
    }
}

impl RlsError {
    /// The kind of the failure.
    pub fn kind(&self) -> RlsErrorKind {
        match self {
            RlsError::Limiter(RequestError::NotReplicated { .. }) | RlsError::RedisUnavailable => {
                RlsErrorKind::Unavailable
            }
            RlsError::Limiter(RequestError::Invalid(_) | RequestError::InvalidField { .. }) => {
                RlsErrorKind::Invalid
            }
            RlsError::Limiter(_) => RlsErrorKind::Internal,
            _ => RlsErrorKind::Invalid,
        }
    }
}
