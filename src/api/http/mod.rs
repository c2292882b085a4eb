//! HTTP: `/metrics` (Prometheus text), `/health/live`, `/health/ready`, `GET /v1/count` and the
//! request path (`POST /v1/hit`, `/v1/limit`, `/v1/quota`, `/v1/once`, `/v1/unique`, `/v1/pool`).
//!
//! The server defends itself (`listener.rs`): a connection must send its request headers within
//! `http.header_timeout`, a request is answered within `http.request_timeout`, and at most
//! `http.max_connections` are served at once, `http.max_connections_per_peer` from one peer; a
//! full port closes a connection that made no request with the token to make room.
//! `http.probe_listen` serves the health endpoints alone, on connections of their own
//! (`probe.rs`). With `http.token` (or `http.token_file`) set,
//! `/v1/*` needs `Authorization: Bearer <token>`, and with `http.admin_token` destructive calls
//! need that one (`auth.rs`); metrics, health and `/openapi.json` (the description of every
//! route, `openapi/`) stay open for scrapers, probes and clients, and so does the status page
//! `GET /` (it holds no data; it asks for the token to read `/v1/status`, `status.rs`). Every
//! error answer is a problem detail (RFC 9457, [`Problem`]).

mod answers;
mod auth;
mod counters;
pub(crate) mod listener;
mod locks;
mod openapi;
mod probe;
mod problem;
mod request;
mod schemas;
mod status;
mod write_timeout;

pub use locks::MAX_LOCK_WAIT_MS;
pub use problem::{Body, Problem, ProblemKind};
pub use request::{MAX_COST, MAX_LOCK_TTL_MS, MAX_POLICIES};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::future::OptionFuture;
use tokio_util::sync::CancellationToken;

use crate::api::edge::listener::{self as edge_listener, PortError};
use crate::api::edge::slots::{SlotLimits, Slots};
use crate::api::edge::tls::Tls;
use crate::api::primitives::Primitives;
use crate::api::query::{parse_time, Query};
use crate::config::{HttpConfig, Tokens};
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Arc<Health>,
    query: Option<Arc<Query>>,
}

/// What the routes answer from: everything but the sockets, so that a test can build the
/// [`router`] and call it without a port.
#[derive(Clone)]
pub struct HttpState {
    /// Rendered at `/metrics`; the request metrics count every answer.
    pub metrics: Metrics,
    /// `/health/*` and the status page.
    pub health: Arc<Health>,
    /// `GET /v1/count` and the counter routes (none: 404).
    pub query: Option<Arc<Query>>,
    /// The request path's primitives and locks (none: their routes are absent).
    pub requests: Option<Arc<Primitives>>,
    /// Who may call `/v1/*` (and the admin routes).
    pub tokens: Arc<Tokens>,
}

/// Every route of the port, with the token check, the request timeout and the answer counting:
/// what [`serve`] serves on its connections.
pub fn router(config: &HttpConfig, state: HttpState) -> Router {
    let mut v1 = Router::new()
        .route("/v1/count", get(count_handler))
        .route("/v1/status", get(status_handler));
    if let Some(query) = &state.query {
        v1 = v1.merge(counters::routes(query.clone()));
    }
    if let Some(requests) = state.requests {
        v1 = v1
            .merge(locks::routes(requests.clone()))
            .merge(request::routes(requests));
    }
    let gate = auth::Gate {
        tokens: Tokens::clone(&state.tokens),
        max_value: config.max_value,
    };
    v1 = v1.route_layer(middleware::from_fn_with_state(
        Arc::new(gate),
        auth::authorize,
    ));
    let counted = state.metrics.request.clone();
    let state = AppState {
        metrics: state.metrics,
        health: state.health,
        query: state.query,
    };
    Router::new()
        .route("/metrics", get(metrics_handler))
        .merge(health_routes())
        .route("/openapi.json", get(openapi::handler))
        .route("/", get(status::page))
        .merge(v1)
        .route_layer(middleware::from_fn(answers::name_route))
        .fallback(|| async { Problem::new(ProblemKind::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                ProblemKind::MethodNotAllowed,
                "this route does not take that method",
            )
        })
        .layer(middleware::from_fn_with_state(
            config.request_timeout,
            limit_time,
        ))
        .layer(middleware::from_fn_with_state(counted, answers::count))
        .with_state(state)
}

/// Bind `config.listen` now (so a taken port fails start-up) and serve until `shutdown`.
pub async fn serve(
    config: &HttpConfig,
    metrics: Metrics,
    health: Arc<Health>,
    query: Option<Arc<Query>>,
    requests: Option<Arc<Primitives>>,
    tokens: Tokens,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), PortError> {
    let addr = edge_listener::address("http.listen", &config.listen)?;
    if tokens.token.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "serving /v1/count beyond loopback without http.token");
    }
    // The certificate files are read before the port is bound: a bad file fails start-up.
    let tls = Tls::load("http", &config.tls, &[b"http/1.1"], &metrics.request)?;
    let (listener, local) = edge_listener::bind("http.listen", &config.listen).await?;
    let probe = probe::bind(config).await?;
    let tokens = Arc::new(tokens);
    let state = HttpState {
        metrics,
        health,
        query,
        requests,
        tokens: tokens.clone(),
    };
    let limits = listener::ConnLimits {
        header_timeout: config.header_timeout,
        request_timeout: config.request_timeout,
        tls: tls.clone(),
        tokens: tokens.clone(),
    };
    let slots = Slots::new(
        "http",
        SlotLimits {
            max: config.max_connections,
            max_per_peer: config
                .max_connections_per_peer
                .unwrap_or(config.max_connections),
            ipv6_prefix: config.ipv6_peer_prefix,
        },
        &state.metrics.request.connections,
    );
    let watcher = tls.map(|tls| tls.watch(shutdown.clone()));
    let probe_state = AppState {
        metrics: state.metrics.clone(),
        health: state.health.clone(),
        query: state.query.clone(),
    };
    let probe = probe.map(|p| p.serve(config, probe_state, tokens, shutdown.clone()));
    let app = router(config, state);
    let server = listener::run(listener, app, slots, limits, shutdown);
    let handle = tokio::spawn(async move {
        let probe = async move {
            if let Some(probe) = probe {
                probe.await;
            }
        };
        let watcher = async move {
            if let Some(Err(e)) = OptionFuture::from(watcher).await {
                tracing::error!(error = %e, "http: the tls reloader stopped");
            }
        };
        tokio::join!(server, watcher, probe);
    });
    Ok((local, handle))
}

/// `/health/live` (the process answers) and `/health/ready`: on the port, and alone on
/// `http.probe_listen`.
fn health_routes() -> Router<AppState> {
    Router::new()
        .route("/health/live", get(|| async { "ok\n" }))
        .route("/health/ready", get(ready_handler))
}

/// Answer 503 when a request takes longer than `limit`.
async fn limit_time(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Problem::new(
            ProblemKind::Timeout,
            format!("no answer within http.request_timeout ({limit:?})"),
        )
        .into_response(),
    }
}

/// `GET /v1/status`: the live status (see `status.rs`).
async fn status_handler(State(state): State<AppState>) -> impl IntoResponse {
    status::answer(&state.metrics.status, &state.health)
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// 200 when ready, else 503; the body says why either way.
async fn ready_handler(State(state): State<AppState>) -> impl IntoResponse {
    let code = if state.health.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, state.health.describe())
}

/// `GET /v1/count?counter=flow&app_id=..&device_id=..&ip=..[&at=RFC3339|epoch_ms]`: the key,
/// value and window of one counter (`counter` may be left out when only one is configured).
/// Every parameter other than `counter` and `at` is a dimension.
async fn count_handler(
    State(state): State<AppState>,
    axum::extract::Query(mut params): axum::extract::Query<
        std::collections::BTreeMap<String, String>,
    >,
) -> Response {
    let Some(query) = state.query else {
        return Problem::new(ProblemKind::NotFound, "queries are not enabled").into_response();
    };
    let counter = match query.counter_named(params.remove("counter")) {
        Ok(counter) => counter,
        Err(e) => return Problem::from_query(e).field("counter").into_response(),
    };
    let at = match parse_time(params.remove("at").as_deref()) {
        Ok(at) => at,
        Err(e) => return Problem::from_query(e).into_response(),
    };
    match query.fetch(&counter, &params, at).await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(e) => Problem::from_query(e).into_response(),
    }
}

#[cfg(test)]
mod tests;
