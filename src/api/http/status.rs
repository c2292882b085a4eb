//! `GET /v1/status` (the live status as JSON, behind the token like every `/v1` route) and
//! `GET /` (the page that draws it every second: HTML, CSS and script embedded in the binary,
//! nothing fetched from elsewhere; it asks for the token when `/v1/status` answers 401).

use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use crate::ops::health::Health;
use crate::ops::status::Status;

/// The page, as served.
const PAGE: &str = include_str!("status_page.html");

/// `GET /v1/status`: whether the stream path is shown follows the process (`tally run`).
pub(super) fn answer(status: &Status, health: &Health) -> impl IntoResponse {
    let stream = !health.without_kafka;
    Json(status.view(health, stream))
}

/// `GET /`: the status page.
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Everything is inline; nothing may be loaded from elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
