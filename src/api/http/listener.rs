//! The HTTP port's connections: a bounded number at once ([`Slots`]), each closed when it does
//! not send its request headers in time (slowloris, idle keep-alive) or does not read its answer
//! (a write blocked for `request_timeout`), each drained on shutdown.

use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::write_timeout::WriteTimeout;
use crate::api::edge::listener::{accept, Slots};
use crate::api::edge::tls::{secure, Tls};
use crate::ops::log_limit::LogLimiter;

/// How much a client may take; from `http.*`.
pub(super) struct ConnLimits {
    /// Time to send a request's headers, from connecting or from the previous answer.
    pub header_timeout: Duration,
    /// Time a request in flight gets to finish on shutdown, and a blocked write to progress.
    pub request_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// TLS on the port (`[http.tls]`); the handshake must finish within `header_timeout`.
    pub tls: Option<std::sync::Arc<Tls>>,
}

/// What an over-limit connection is told before it is closed.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Serve `app` on `listener` until `shutdown`.
pub(super) async fn run(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) {
    let slots = Slots::new(limits.max_connections, "http.max_connections");
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let log = LogLimiter::new();
    loop {
        let Some(stream) = accept(&listener, &shutdown, &log, "http").await else {
            return;
        };
        let Some(permit) = slots.take(&log) else {
            // Non-blocking: a client that does not read cannot hold up the accept loop.
            let _ = stream.try_write(BUSY);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (shutdown, drain, tls) = (shutdown.clone(), limits.request_timeout, limits.tls.clone());
        let (http, app, handshake) = (http.clone(), app.clone(), limits.header_timeout);
        tokio::spawn(async move {
            let _permit = permit;
            // In the connection's task: a slow handshake holds its slot (bounded), not the loop.
            let Some(stream) = secure(tls.as_deref(), stream, handshake).await else {
                return;
            };
            let stream = WriteTimeout::new(stream, drain);
            let connection =
                http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
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
        });
    }
}
