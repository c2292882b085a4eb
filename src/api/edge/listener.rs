//! Accepting connections on a port, the same for HTTP and gRPC: a failed accept is retried
//! without spinning. How many are held at once is [`super::slots`]'s.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::ops::log_limit::LogLimiter;

/// The next connection of `listener` and its peer's address, or `None` once `shutdown` is
/// cancelled. A failed accept
/// (out of file descriptors and the like) is logged (rate-limited, as `port`) and retried after
/// 100 ms: no spinning, and the port keeps serving.
pub(crate) async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    log: &LogLimiter,
    port: &str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => return Some(accepted),
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
