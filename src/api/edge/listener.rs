//! Accepting connections on a port, the same for HTTP and gRPC: a failed accept is retried
//! without spinning, and at most a configured number of connections are held at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::ops::log_limit::LogLimiter;

/// The next connection of `listener`, or `None` once `shutdown` is cancelled. A failed accept
/// (out of file descriptors and the like) is logged (rate-limited, as `port`) and retried after
/// 100 ms: no spinning, and the port keeps serving.
pub(crate) async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    log: &LogLimiter,
    port: &str,
) -> Option<TcpStream> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => return Some(stream),
                Err(e) => {
                    if let Some(suppressed) = log.allow() {
                        tracing::warn!(error = %e, suppressed, "{port} accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// At most a configured number of connections at once (one permit each, held by the
/// connection's task).
pub(crate) struct Slots {
    permits: Arc<Semaphore>,
    max: usize,
    /// The setting that sets `max`, for the log line.
    setting: &'static str,
}

impl Slots {
    pub(crate) fn new(max: usize, setting: &'static str) -> Slots {
        Slots {
            permits: Arc::new(Semaphore::new(max)),
            max,
            setting,
        }
    }

    /// A slot for a connection just accepted, or None when all are taken (logged,
    /// rate-limited): the caller then closes the connection.
    pub(crate) fn take(&self, log: &LogLimiter) -> Option<OwnedSemaphorePermit> {
        let permit = self.permits.clone().try_acquire_owned().ok();
        if permit.is_none() {
            if let Some(suppressed) = log.allow() {
                tracing::warn!(
                    max = self.max,
                    suppressed,
                    "connection refused: {} reached",
                    self.setting
                );
            }
        }
        permit
    }
}
