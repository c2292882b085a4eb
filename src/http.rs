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
use crate::sink::Health;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Arc<Health>,
}

/// Bind `addr` now (so a taken port fails start-up) and serve until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/health/live", get(|| async { "ok\n" }))
        .route("/health/ready", get(ready_handler))
        .with_state(AppState { metrics, health });
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
