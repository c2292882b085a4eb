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
pub use problem::{Body, Kind, Problem};
pub use request::{MAX_COST, MAX_LOCK_TTL_MS, MAX_POLICIES};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::future::OptionFuture;
use tokio_util::sync::CancellationToken;

use crate::api::edge::slots::{SlotLimits, Slots};
use crate::api::edge::tls::Tls;
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

/// Bind `config.listen` now (so a taken port fails start-up) and serve until `shutdown`.
pub async fn serve(
    config: &HttpConfig,
    metrics: Metrics,
    health: Arc<Health>,
    query: Option<Arc<Query>>,
    requests: Option<Arc<crate::api::primitives::Primitives>>,
    tokens: Tokens,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let addr: SocketAddr = config.listen.parse().context("http.listen")?;
    if tokens.token.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "serving /v1/count beyond loopback without http.token");
    }
    // The certificate files are read before the port is bound: a bad file fails start-up.
    let tls = Tls::load("http", &config.tls, &[b"http/1.1"], &metrics.request)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let probe = probe::bind(config).await?;
    let mut v1 = Router::new()
        .route("/v1/count", get(count_handler))
        .route("/v1/status", get(status_handler));
    if let Some(query) = &query {
        v1 = v1.merge(counters::routes(query.clone()));
    }
    if let Some(requests) = requests {
        v1 = v1
            .merge(locks::routes(requests.clone()))
            .merge(request::routes(requests));
    }
    let tokens = Arc::new(tokens);
    let gate = auth::Gate {
        tokens: Tokens::clone(&tokens),
        max_value: config.max_value,
    };
    v1 = v1.route_layer(middleware::from_fn_with_state(
        Arc::new(gate),
        auth::authorize,
    ));
    let state = AppState {
        metrics,
        health,
        query,
    };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .merge(health_routes())
        .route("/openapi.json", get(openapi::handler))
        .route("/", get(status::page))
        .merge(v1)
        .route_layer(middleware::from_fn(answers::name_route))
        .fallback(|| async { Problem::new(Kind::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                Kind::MethodNotAllowed,
                "this route does not take that method",
            )
        })
        .layer(middleware::from_fn_with_state(
            config.request_timeout,
            limit_time,
        ))
        .layer(middleware::from_fn_with_state(
            state.metrics.request.clone(),
            answers::count,
        ))
        .with_state(state.clone());
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
    let probe = probe.map(|p| p.serve(config, state, tokens, shutdown.clone()));
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
            Kind::Timeout,
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
        return Problem::new(Kind::NotFound, "queries are not enabled").into_response();
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
