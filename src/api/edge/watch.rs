//! What stops a watcher of files (a port's TLS files, the RLS limits file) before its shutdown.

/// A watcher that could not go on; the message names what it watched.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// SIGHUP cannot be listened for.
    #[error("{what}: cannot listen for SIGHUP: {source}")]
    Signal {
        what: &'static str,
        source: std::io::Error,
    },
    /// A reload (run off the async workers) panicked or was cancelled.
    #[error("{what}: the reload failed: {source}")]
    Reload {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

/// The process's SIGHUP, for the watcher of `what`.
pub(crate) fn hangup(what: &'static str) -> Result<tokio::signal::unix::Signal, WatchError> {
    use tokio::signal::unix::{signal, SignalKind};
    signal(SignalKind::hangup()).map_err(|source| WatchError::Signal { what, source })
}
