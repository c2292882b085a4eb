//! `GET /v1/counters/{name}?<dim>=<value>…&window=current|<time>` (or `&last=N`, or
//! `&from=<time>&to=<time>`; leaderboards `&top=N`) and `POST /v1/counters/{name}/batch` with many dimension tuples:
//! per-window values and their combination (see `query::range`). Bad input is a 400 that says
//! why; Redis unavailable a 503.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query as Params, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::problem::{Body, Problem};
use crate::api::query::{parse_time, Query, QueryError, Span};

/// Largest batch body, bytes.
pub(super) const MAX_BODY: usize = 1024 * 1024;

/// The range-query routes over `query`.
pub fn routes<S: Clone + Send + Sync + 'static>(query: Arc<Query>) -> Router<S> {
    Router::new()
        .route("/v1/counters/{name}", get(one))
        .route("/v1/counters/{name}/batch", post(batch))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(query)
}

fn error(e: QueryError) -> Response {
    Problem::from_query(e).into_response()
}

/// The span named by `window`, `last`, or `from` + `to` (at most one of the three).
fn span(
    window: Option<&str>,
    last: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<Span, QueryError> {
    let given = [
        window.is_some(),
        last.is_some(),
        from.is_some() || to.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(QueryError::BadRange {
            field: "last",
            detail: "give one of window, last, or from and to".into(),
        });
    }
    if let Some(n) = last {
        let n = n.parse().map_err(|_| QueryError::BadRange {
            field: "last",
            detail: format!("last `{n}` is not a number"),
        })?;
        return Ok(Span::Last(n));
    }
    if from.is_some() || to.is_some() {
        let (Some(a), Some(b)) = (from, to) else {
            return Err(QueryError::BadRange {
                field: "from",
                detail: "give both from and to".into(),
            });
        };
        return Ok(Span::Between(parse_time(Some(a))?, parse_time(Some(b))?));
    }
    match window {
        None | Some("current") => Ok(Span::At(parse_time(None)?)),
        Some(t) => Ok(Span::At(parse_time(Some(t))?)),
    }
}

async fn one(
    State(q): State<Arc<Query>>,
    Path(name): Path<String>,
    Params(mut params): Params<BTreeMap<String, String>>,
) -> Response {
    let (window, last, from, to, top) = (
        params.remove("window"),
        params.remove("last"),
        params.remove("from"),
        params.remove("to"),
        params.remove("top"),
    );
    let top = match top.map(|t| t.parse::<usize>()) {
        None => 10,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return error(QueryError::BadRange {
                field: "top",
                detail: "top must be a number".into(),
            })
        }
    };
    let span = match span(
        window.as_deref(),
        last.as_deref(),
        from.as_deref(),
        to.as_deref(),
    ) {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let now = chrono::Utc::now().timestamp_millis();
    match q.range_top(&name, &[params], span, now, top).await {
        Ok(mut answers) => Json(answers.remove(0)).into_response(),
        Err(e) => error(e),
    }
}

/// `POST /v1/counters/{name}/batch`: one range over many dimension tuples. Give at most one of
/// `window`, `last`, or `from` and `to` (default: the current window).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchBody {
    /// One answer per tuple, in this order.
    dimensions: Vec<BTreeMap<String, String>>,
    /// The window holding this time (RFC 3339, epoch ms, or `current`).
    window: Option<String>,
    /// The last N windows up to the current one.
    last: Option<usize>,
    /// First window: the one holding this time.
    from: Option<String>,
    /// Last window: the one holding this time.
    to: Option<String>,
    /// Leaderboards: how many members to answer.
    #[serde(default = "ten")]
    #[schema(default = 10)]
    top: usize,
}

/// The answer of a batch: one range answer per tuple asked for.
#[derive(Serialize, ToSchema)]
pub(super) struct BatchAnswer {
    /// In the order of `dimensions`.
    #[schema(value_type = Vec<super::schemas::RangeAnswerSchema>)]
    results: Vec<crate::api::query::RangeAnswer>,
}

fn ten() -> usize {
    10
}

async fn batch(
    State(q): State<Arc<Query>>,
    Path(name): Path<String>,
    Body(b): Body<BatchBody>,
) -> Response {
    let last = b.last.map(|n| n.to_string());
    let span = match span(
        b.window.as_deref(),
        last.as_deref(),
        b.from.as_deref(),
        b.to.as_deref(),
    ) {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let now = chrono::Utc::now().timestamp_millis();
    match q.range_top(&name, &b.dimensions, span, now, b.top).await {
        Ok(results) => Json(BatchAnswer { results }).into_response(),
        Err(e) => error(e),
    }
}
