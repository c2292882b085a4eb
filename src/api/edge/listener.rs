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

/// At most a configured number of connections at once from one peer address, so that one host
/// cannot take every slot of [`Slots`].
pub(crate) struct PeerSlots {
    counts: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    max: usize,
    /// The setting that sets `max`, for the log line.
    setting: &'static str,
}

/// A connection's place among its peer's, given back when dropped.
pub(crate) struct PeerPermit {
    slots: Arc<PeerSlots>,
    ip: std::net::IpAddr,
}

impl PeerSlots {
    pub(crate) fn new(max: usize, setting: &'static str) -> Arc<PeerSlots> {
        Arc::new(PeerSlots {
            counts: Default::default(),
            max,
            setting,
        })
    }

    /// A place for a connection from `ip`, or None when that peer holds `max` already (logged,
    /// rate-limited): the caller then closes the connection.
    pub(crate) fn take(
        self: &Arc<Self>,
        ip: std::net::IpAddr,
        log: &LogLimiter,
    ) -> Option<PeerPermit> {
        let mut counts = self.counts.lock();
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.max {
            drop(counts);
            if let Some(suppressed) = log.allow() {
                tracing::warn!(%ip, max = self.max, suppressed, "connection refused: {} reached", self.setting);
            }
            return None;
        }
        *n += 1;
        Some(PeerPermit {
            slots: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerPermit {
    fn drop(&mut self) {
        let mut counts = self.slots.counts.lock();
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_share_and_gives_it_back() {
        let slots = PeerSlots::new(2, "test");
        let log = LogLimiter::new();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = slots.take(a, &log).expect("1 of 2");
        let _second = slots.take(a, &log).expect("2 of 2");
        assert!(slots.take(a, &log).is_none(), "a third from one peer");
        assert!(slots.take(b, &log).is_some(), "another peer has its own");
        drop(first);
        assert!(
            slots.take(a, &log).is_some(),
            "a closed connection frees its place"
        );
    }
}
