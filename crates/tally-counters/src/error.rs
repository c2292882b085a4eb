//! [`Error`]: every error of the library as one closed type, with the one question callers ask
//! of it: may the same call succeed later ([`Error::is_transient`])?

use crate::config::RedisConfigError;
use crate::key::{TemplateError, TimePatternError};
use crate::model::{LookupError, SpecError};
use crate::request::{PolicyError, RequestError};
use crate::script::ReplyShapeError;
use crate::window::WindowError;

/// Any error of this library. Each function returns its own error type (which says exactly what
/// can go wrong there); every one of them converts into this with `?`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request-path call failed (Redis, bad input, a reply outside the contract).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Redis failed or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The `[redis]` settings cannot be used.
    #[error(transparent)]
    RedisConfig(#[from] RedisConfigError),
    /// A counter's definition cannot be used.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A key template cannot be used.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A key template's time pattern cannot be used.
    #[error(transparent)]
    TimePattern(#[from] TimePatternError),
    /// A window size cannot be used.
    #[error(transparent)]
    Window(#[from] WindowError),
    /// A counter, its dimension values or a time that address no key.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// A limit policy's numbers cannot be used.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A script's reply outside its contract.
    #[error(transparent)]
    ReplyShape(#[from] ReplyShapeError),
}

impl Error {
    /// Whether the same call may succeed later without any change on the caller's side: Redis
    /// was unavailable, slow or not yet replicated. Bad input, bad configuration and replies
    /// outside a script's contract are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Request(e) => e.is_transient(),
            Error::Redis(e) => crate::request::redis_is_transient(e),
            Error::RedisConfig(_)
            | Error::Spec(_)
            | Error::Template(_)
            | Error::TimePattern(_)
            | Error::Window(_)
            | Error::Lookup(_)
            | Error::Policy(_)
            | Error::ReplyShape(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_outages_are_transient_and_bad_input_is_not() {
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert!(Error::from(RequestError::OutcomeUnknown(io)).is_transient());
        let loading = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "LOADING",
            "Redis is loading".to_string(),
        ));
        assert!(Error::from(loading).is_transient());
        let wrong = redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "WRONGTYPE"));
        assert!(!Error::from(wrong).is_transient());
        assert!(!Error::from(PolicyError::ZeroBurst).is_transient());
        assert!(!Error::from(RequestError::Invalid("x".into())).is_transient());
        let lag = RequestError::NotReplicated {
            wanted: 1,
            acked: 0,
        };
        assert!(Error::from(lag).is_transient());
    }
}
