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

/// Why a port did not start; the message names the setting.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The setting is not an address.
    #[error("{key}: `{value}` is not an ip:port address ({source})")]
    Address {
        key: &'static str,
        value: String,
        source: std::net::AddrParseError,
    },
    /// The address cannot be bound (taken, not this host's, not allowed).
    #[error("{key}: cannot listen on {addr}: {source}")]
    Bind {
        key: &'static str,
        addr: String,
        source: std::io::Error,
    },
    /// The port's TLS files do not load.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
}

/// Bind `addr` (the value of setting `key`); the bound listener and its address (the port
/// chosen when it was 0).
pub(crate) async fn bind(
    key: &'static str,
    addr: &str,
) -> Result<(TcpListener, SocketAddr), PortError> {
    let bind_error = |source| PortError::Bind {
        key,
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// `value` (of setting `key`) as an address.
pub(crate) fn address(key: &'static str, value: &str) -> Result<SocketAddr, PortError> {
    value.parse().map_err(|source| PortError::Address {
        key,
        value: value.to_string(),
        source,
    })
}
