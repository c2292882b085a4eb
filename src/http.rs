//! HTTP: `/metrics` (Prometheus text), `/health/live`, `/health/ready`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::query::{parse_time, Query, QueryError};
use crate::sink::Health;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Arc<Health>,
    query: Option<Arc<Query>>,
}

/// Bind `addr` now (so a taken port fails start-up) and serve until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: Arc<Health>,
    query: Option<Arc<Query>>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/health/live", get(|| async { "ok\n" }))
        .route("/health/ready", get(ready_handler))
        .route("/v1/count", get(count_handler))
        .with_state(AppState {
            metrics,
            health,
            query,
        });
    let handle = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "http server failed");
        }
    });
    Ok((local, handle))
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

async fn ready_handler(State(state): State<AppState>) -> impl IntoResponse {
    let kafka = state
        .health
        .kafka
        .load(std::sync::atomic::Ordering::Relaxed);
    let redis = state
        .health
        .redis
        .load(std::sync::atomic::Ordering::Relaxed);
    let code = if kafka && redis {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("kafka={kafka} redis={redis}\n"))
}

/// `GET /v1/count?counter=flow&app_id=..&device_id=..&ip=..[&at=RFC3339|epoch_ms]`: the key,
/// value and window of one counter. Every parameter other than `counter` and `at` is a dimension.
async fn count_handler(
    State(state): State<AppState>,
    axum::extract::Query(mut params): axum::extract::Query<
        std::collections::BTreeMap<String, String>,
    >,
) -> axum::response::Response {
    let Some(query) = state.query else {
        return (StatusCode::NOT_FOUND, "queries are not enabled\n").into_response();
    };
    let counter = params
        .remove("counter")
        .unwrap_or_else(|| "flow".to_string());
    let at = match parse_time(params.remove("at").as_deref()) {
        Ok(at) => at,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    match query.fetch(&counter, &params, at).await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(e @ QueryError::Redis(_)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}
