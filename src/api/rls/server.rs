//! The gRPC port: hyper's HTTP/2 connections serving the two generated tonic services, routed
//! by path, the bearer token checked on the request's headers.
//!
//! Not tonic's `transport::Server`: per call it routes through an axum router (URL parameters
//! percent-decoded into the request's extensions), inserts the peer's address, wraps a timeout
//! and load-shedding layers and boxes the request and response bodies again; measured with the
//! RLS bench's counting allocator that was ~15 of ~84 allocations per decision and several
//! per cent of the server's CPU (docs/lab/benchmarks.md). What `ShouldRateLimit` needs
//! is one path match.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::{http, Service};
use tonic::server::NamedService;

use super::Rls;
use crate::api::edge::auth::{self, Access};
use crate::api::edge::listener::accept;
use crate::api::edge::slots::Slots;
use crate::api::edge::tls::{secure, PortStream, Tls};
use crate::api::rlqs::slots::Connection;
use crate::api::rlqs::Rlqs;
use crate::config::Tokens;
use crate::ops::log_limit::LogLimiter;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// Time a call in flight gets to finish on shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// The services of the port, routed by the call's path.
#[derive(Clone)]
pub(super) struct Routes<H> {
    /// `envoy.service.ratelimit.v3.RateLimitService`.
    pub rls: RateLimitServiceServer<Rls>,
    /// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` when `[[rlqs.buckets]]` are
    /// configured (the same token check).
    pub rlqs: Option<RateLimitQuotaServiceServer<Rlqs>>,
    /// `grpc.health.v1.Health` (open, as `/health/*` is).
    pub health: H,
    /// Set once the connection made a call that passed the token check (with no token set:
    /// any call); a connection without one by `first_call_timeout` is closed, and may be closed
    /// before to make room on a full port. One per connection (its slot's; the routes are
    /// cloned per connection).
    pub admitted: Arc<AtomicBool>,
    /// Who may call the rate limit service: with `http.token` set, a caller sending
    /// `authorization: Bearer <http.token>` (or `http.admin_token`) as gRPC metadata. The
    /// health service stays open, as `/health/*` does.
    pub tokens: Tokens,
    /// The connection (its peer, its client certificate, its quota streams), for the quota
    /// service's per-peer and per-connection caps and its log. One per connection, as
    /// `admitted`; `None` until the connection is accepted.
    pub connection: Option<Connection>,
}

/// What a generated tonic service is.
pub(super) trait GrpcService:
    Service<
        http::Request<Incoming>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> GrpcService for S where
    S: Service<
            http::Request<Incoming>,
            Response = http::Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

impl<H> Routes<H> {
    /// The routes of a port, for a connection not yet accepted.
    pub fn new(rls: Arc<Rls>, rlqs: Option<Rlqs>, health: H, tokens: Tokens) -> Routes<H> {
        Routes {
            // A call within the caps of `call` is a few KiB; a larger message is refused before
            // it is decoded (tonic's default lets 4 MiB in).
            rls: RateLimitServiceServer::from_arc(rls)
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES),
            rlqs: rlqs.map(Rlqs::into_service),
            health,
            admitted: Default::default(),
            tokens,
            connection: None,
        }
    }

    /// A call of a token-guarded service: UNAUTHENTICATED without the token; else the connection
    /// is admitted (it made an admitted call) and `Ok` lets the call through with its access.
    fn authorize(
        &self,
        req: &http::Request<Incoming>,
    ) -> Result<Access, BoxFuture<'static, Result<http::Response<Body>, Infallible>>> {
        let access = auth::check(&self.tokens, req.headers());
        if access == Access::Denied {
            let status = tonic::Status::unauthenticated(
                "missing or wrong bearer token (authorization metadata)",
            );
            return Err(Box::pin(async move { Ok(status.into_http()) }));
        }
        // Read first: a store on every call would bounce the line between workers.
        if !self.admitted.load(Ordering::Relaxed) {
            self.admitted.store(true, Ordering::Relaxed);
        }
        Ok(access)
    }

    /// Who makes a quota call, in its extensions: the connection and the token it carried.
    fn identify(&self, req: &mut http::Request<Incoming>, access: Access) {
        let Some(connection) = self.connection.clone() else {
            return;
        };
        let token = match access {
            Access::Admin if self.tokens.admin.is_some() => Some("admin_token"),
            _ if self.tokens.token.is_some() => Some("token"),
            _ => None,
        };
        let client = connection.client(token);
        req.extensions_mut().insert(connection);
        req.extensions_mut().insert(client);
    }
}

impl<H: GrpcService> hyper::service::Service<http::Request<Incoming>> for Routes<H> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let service = req.uri().path().get(1..).and_then(|p| p.split_once('/'));
        match service.map(|(s, _)| s) {
            Some(RateLimitServiceServer::<Rls>::NAME) => {
                if let Err(refused) = self.authorize(&req) {
                    return refused;
                }
                // The generated services are always ready (no `poll_ready` to wait for).
                let mut rls = self.rls.clone();
                Box::pin(async move { rls.call(req).await })
            }
            Some(RateLimitQuotaServiceServer::<Rlqs>::NAME) if self.rlqs.is_some() => {
                let access = match self.authorize(&req) {
                    Ok(access) => access,
                    Err(refused) => return refused,
                };
                let mut req = req;
                self.identify(&mut req, access);
                let mut rlqs = self.rlqs.clone();
                Box::pin(async move {
                    match rlqs.as_mut() {
                        Some(rlqs) => rlqs.call(req).await,
                        None => {
                            Ok(tonic::Status::unimplemented("no such grpc service").into_http())
                        }
                    }
                })
            }
            Some(name) if name == H::NAME => {
                // Open to all; it admits the connection only with the token (Envoy's gRPC health
                // checker sends `initial_metadata` too), or where none is needed.
                if !self.admitted.load(Ordering::Relaxed)
                    && auth::check(&self.tokens, req.headers()) != Access::Denied
                {
                    self.admitted.store(true, Ordering::Relaxed);
                }
                let mut health = self.health.clone();
                Box::pin(async move { health.call(req).await })
            }
            _ => Box::pin(async move {
                Ok(tonic::Status::unimplemented("no such grpc service").into_http())
            }),
        }
    }
}

/// How much the port's clients may take; from `rls.*`.
pub(super) struct GrpcLimits {
    /// A silent connection is PINGed after this long...
    pub keepalive_interval: Duration,
    /// ...and closed when the PING is not answered within this.
    pub keepalive_timeout: Duration,
    /// A connection must have made an admitted call by then, or it is closed.
    pub first_call_timeout: Duration,
    /// TLS on the port (`[rls.tls]`); the handshake counts in `first_call_timeout`.
    pub tls: Option<Arc<Tls>>,
}

/// Serve `routes` on `listener` (HTTP/2 only, as gRPC is) until `stop`; each connection then
/// finishes its calls in flight (up to [`DRAIN`]) and closes.
pub(super) async fn run<H: GrpcService>(
    listener: TcpListener,
    routes: Routes<H>,
    slots: Arc<Slots>,
    limits: GrpcLimits,
    stop: CancellationToken,
) {
    let mut http = http2::Builder::new(TokioExecutor::new());
    http.timer(TokioTimer::new())
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    // Each connection holds a sender: once all are dropped, every connection has closed.
    let (open, mut closed) = tokio::sync::mpsc::channel::<()>(1);
    let log = LogLimiter::new();
    loop {
        let Some((stream, peer)) = accept(&listener, &stop, &log, "rls").await else {
            break;
        };
        // Refused: closed without a byte written (a TLS client sees the connection close, not
        // a record it cannot read).
        let Ok(slot) = slots.take(peer.ip()) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut routes = routes.clone();
        routes.admitted = slot.admitted();
        let accepted = Accepted {
            stream,
            peer: peer.ip(),
            slot,
            first_call: limits.first_call_timeout,
            tls: limits.tls.clone(),
        };
        let (stop, open, http) = (stop.clone(), open.clone(), http.clone());
        tokio::spawn(async move {
            let _held = open;
            connection(accepted, routes, http, stop).await;
        });
    }
    // The port closes now; the connections drain.
    drop(listener);
    drop(open);
    let _ = closed.recv().await;
}

/// A connection accepted, with its slot.
struct Accepted {
    stream: tokio::net::TcpStream,
    peer: std::net::IpAddr,
    slot: crate::api::edge::slots::Slot,
    /// It must have made an admitted call by then (TLS handshake included).
    first_call: Duration,
    tls: Option<Arc<Tls>>,
}

/// Serve one connection until it closes, `stop` (then drained up to [`DRAIN`]), its eviction,
/// or its first call deadline without an admitted call.
async fn connection<H: GrpcService>(
    accepted: Accepted,
    mut routes: Routes<H>,
    http: http2::Builder<TokioExecutor>,
    stop: CancellationToken,
) {
    let Accepted {
        stream,
        peer,
        slot,
        first_call,
        tls,
    } = accepted;
    let (admitted, evicted) = (slot.admitted(), slot.evicted());
    // A peer that sends no preface, or never makes an admitted call, would hold its slot for
    // good (hyper has no deadline for the preface): closed at the deadline, which the TLS
    // handshake (in this task, not the accept loop) counts in.
    let deadline = tokio::time::Instant::now() + first_call;
    let stream = tokio::select! {
        stream = secure(tls.as_deref(), stream, first_call) => stream,
        _ = evicted.cancelled() => None,
    };
    let Some(stream) = stream else {
        return;
    };
    if routes.rlqs.is_some() {
        routes.connection = Some(Connection::new(
            peer,
            slot.peer(),
            certificate_name(&stream),
        ));
    }
    let connection = http.serve_connection(TokioIo::new(stream), routes);
    tokio::pin!(connection);
    let deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(deadline);
    let result = loop {
        tokio::select! {
            result = connection.as_mut() => break result,
            _ = stop.cancelled() => {
                connection.as_mut().graceful_shutdown();
                break tokio::time::timeout(DRAIN, connection).await.unwrap_or(Ok(()));
            }
            // Evicted only while it has made no admitted call: nothing in flight is lost.
            _ = evicted.cancelled() => {
                tracing::debug!("rls connection closed to make room");
                break Ok(());
            }
            _ = &mut deadline, if !admitted.load(Ordering::Relaxed) => {
                if !admitted.load(Ordering::Relaxed) {
                    tracing::debug!("rls connection closed: no admitted call within rls.first_call_timeout");
                    break Ok(());
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "rls connection closed");
    }
}

/// The client certificate's name (with mutual TLS), for the quota service's log.
fn certificate_name(stream: &PortStream) -> Option<Arc<str>> {
    match stream {
        tokio_util::either::Either::Right(tls) => tls
            .get_ref()
            .1
            .peer_certificates()?
            .first()
            .and_then(|c| super::client_cert::name(c)),
        tokio_util::either::Either::Left(_) => None,
    }
}
