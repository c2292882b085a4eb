//! `tally_http_answers_total{route, method, code}` and `tally_http_request_duration_seconds{route}`:
//! every answer of the HTTP port, by the route's template (`/v1/counters/{name}`, never the
//! path a caller sent, so the labels stay bounded), timeouts and unknown routes included.
//!
//! Two layers: [`count`], outermost, times the request and counts its answer; [`name_route`], on
//! the routes, writes the matched template into a slot `count` put in the request (a route that
//! did not match leaves it empty: `unmatched`). The slot outlives a handler cut by
//! `http.request_timeout`, so a timeout is counted under its route.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::ops::metrics::RequestMetrics;

/// Where [`name_route`] leaves the matched route's template for [`count`].
#[derive(Clone, Default)]
struct RouteSlot(Arc<OnceLock<MatchedPath>>);

/// Time the request, then count its answer by route, method and status code.
pub(super) async fn count(
    State(metrics): State<RequestMetrics>,
    mut request: Request,
    next: Next,
) -> Response {
    let slot = RouteSlot::default();
    request.extensions_mut().insert(slot.clone());
    let method = request.method().clone();
    let started = Instant::now();
    let response = next.run(request).await;
    let route = slot.0.get().map_or("unmatched", MatchedPath::as_str);
    let method = match method.as_str() {
        m @ ("GET" | "POST" | "PUT" | "DELETE" | "HEAD" | "PATCH" | "OPTIONS") => m,
        _ => "other",
    };
    metrics
        .http_answers
        .with_label_values(&[route, method, response.status().as_str()])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[route])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Note the matched route's template in the request's slot.
pub(super) async fn name_route(request: Request, next: Next) -> Response {
    if let (Some(slot), Some(path)) = (
        request.extensions().get::<RouteSlot>(),
        request.extensions().get::<MatchedPath>(),
    ) {
        // A clone of the router's shared template: no copy of the text per request.
        let _ = slot.0.set(path.clone());
    }
    next.run(request).await
}
