//! The HTTP port's connections: a bounded number at once, and per peer ([`Slots`]), each closed
//! when it does not send its request headers in time (slowloris, idle keep-alive), does not read
//! its answer (a write blocked for `request_timeout`), or has made no request with the token when
//! the port is full and another client connects; each drained on shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::write_timeout::WriteTimeout;
use crate::api::edge::auth::{self, Access};
use crate::api::edge::listener::accept;
use crate::api::edge::slots::Slots;
use crate::api::edge::tls::{secure, Tls};
use crate::config::Tokens;
use crate::ops::log_limit::LogLimiter;

/// How much a client may take; from `http.*`.
pub(super) struct ConnLimits {
    /// Time to send a request's headers, from connecting or from the previous answer.
    pub header_timeout: Duration,
    /// Time a request in flight gets to finish on shutdown, and a blocked write to progress.
    pub request_timeout: Duration,
    /// TLS on the port (`[http.tls]`); the handshake must finish within `header_timeout`.
    pub tls: Option<Arc<Tls>>,
    /// A request with the token admits its connection (see [`Admitting`]).
    pub tokens: Arc<Tokens>,
}

/// What an over-limit connection of a plain-HTTP port is told before it is closed. A TLS port
/// writes nothing: a client in the middle of its handshake would read these bytes as a broken
/// TLS record (`WRONG_VERSION_NUMBER`), not as an answer.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Serve `app` on `listener`, holding connections within `slots`, until `shutdown`.
pub(super) async fn run(
    listener: TcpListener,
    app: Router,
    slots: Arc<Slots>,
    limits: ConnLimits,
    shutdown: CancellationToken,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let log = LogLimiter::new();
    loop {
        let Some((stream, peer)) = accept(&listener, &shutdown, &log, slots.port()).await else {
            return;
        };
        let Ok(slot) = slots.take(peer.ip()) else {
            if limits.tls.is_none() {
                // Non-blocking: a client that does not read cannot hold up the accept loop.
                let _ = stream.try_write(BUSY);
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (shutdown, drain, tls) = (shutdown.clone(), limits.request_timeout, limits.tls.clone());
        let (http, handshake, port) = (http.clone(), limits.header_timeout, slots.port());
        let service = Admitting {
            app: TowerToHyperService::new(app.clone()),
            admitted: slot.admitted(),
            tokens: limits.tokens.clone(),
        };
        tokio::spawn(async move {
            let evicted = slot.evicted();
            let served = async move {
                // In the connection's task: a slow handshake holds its slot (bounded), not the loop.
                let Some(stream) = secure(tls.as_deref(), stream, handshake).await else {
                    return;
                };
                let stream = WriteTimeout::new(stream, drain);
                let connection = http.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(connection);
                let result = tokio::select! {
                    result = connection.as_mut() => result,
                    _ = shutdown.cancelled() => {
                        // Finish the request in flight (bounded), close an idle connection now.
                        connection.as_mut().graceful_shutdown();
                        tokio::time::timeout(drain, connection).await.unwrap_or(Ok(()))
                    }
                };
                if let Err(e) = result {
                    tracing::debug!(error = %e, "http connection closed");
                }
            };
            tokio::select! {
                _ = served => {}
                // No request yet: nothing in flight is lost.
                _ = evicted.cancelled() => tracing::debug!(port, "connection closed to make room"),
            }
            drop(slot);
        });
    }
}

/// The app, marking its connection admitted (never closed to make room) while it has a request
/// in flight, and for good once it made a request with the token (any request without
/// `http.token`, as on the RLS port): a client of the open endpoints (health, metrics) alone
/// stays evictable between its requests.
#[derive(Clone)]
struct Admitting {
    app: TowerToHyperService<Router>,
    admitted: Arc<AtomicBool>,
    tokens: Arc<Tokens>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Admitting {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        // Read first: a store on every request would bounce the line between workers.
        if self.admitted.load(Ordering::Relaxed) {
            return Box::pin(self.app.call(request));
        }
        let keeps = auth::check(&self.tokens, request.headers()) != Access::Denied;
        self.admitted.store(true, Ordering::Relaxed);
        let (answer, admitted) = (self.app.call(request), self.admitted.clone());
        Box::pin(async move {
            let answer = answer.await;
            if !keeps {
                admitted.store(false, Ordering::Relaxed);
            }
            answer
        })
    }
}
