//! `POST /v1/hit`, `/v1/limit`, `/v1/quota`, `/v1/once`, `/v1/unique`, `/v1/pool`: JSON in,
//! JSON out. Bad input is 400 with a message, Redis unavailable 503; rate-limit answers carry
//! `RateLimit-Policy`, `RateLimit` and (when denied) `Retry-After`, and are 429 when denied if
//! the request asks for it (`"reject": true`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use tally_counters::request::{Hit, RequestError};

use crate::query::parse_time;
use crate::request::{Action, Requests};

/// Largest request body, bytes.
const MAX_BODY: usize = 64 * 1024;

/// The request-path routes over `requests`.
pub fn routes<S: Clone + Send + Sync + 'static>(requests: Arc<Requests>) -> Router<S> {
    Router::new()
        .route("/v1/hit", post(hit))
        .route("/v1/limit", post(limit))
        .route("/v1/quota", post(quota))
        .route("/v1/once", post(once))
        .route("/v1/unique", post(unique))
        .route("/v1/pool", post(pool))
        .route("/v1/locks/{name}/{action}", post(lock))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(requests)
}

fn error(e: RequestError) -> Response {
    let code = match &e {
        RequestError::Invalid(_) | RequestError::Lookup(_) | RequestError::Overflow { .. } => {
            StatusCode::BAD_REQUEST
        }
        RequestError::Redis(_) => StatusCode::SERVICE_UNAVAILABLE,
        RequestError::Reply { .. } => StatusCode::BAD_GATEWAY,
    };
    (code, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

fn reply<T: serde::Serialize>(result: Result<T, RequestError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(e),
    }
}

fn time(at: Option<&str>) -> Result<Option<i64>, RequestError> {
    match at {
        None => Ok(None),
        Some(_) => parse_time(at)
            .map(Some)
            .map_err(|e| RequestError::Invalid(e.to_string())),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HitBody {
    counter: String,
    #[serde(default)]
    dimensions: BTreeMap<String, String>,
    #[serde(default = "one")]
    value: i64,
    at: Option<String>,
    idempotency_key: Option<String>,
    #[serde(default)]
    action: Action,
    /// `error` (default): a hit Redis cannot take is a 503. `defer`: write it to the topic the
    /// stream path counts (202), under `tally run`.
    #[serde(default)]
    on_redis_error: OnRedisError,
    /// Defer: more fields for the event (those the topic's other counters need).
    #[serde(default)]
    event: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum OnRedisError {
    #[default]
    Error,
    Defer,
}

fn one() -> i64 {
    1
}

async fn hit(State(r): State<Arc<Requests>>, Json(b): Json<HitBody>) -> Response {
    let at_ms = match time(b.at.as_deref()) {
        Ok(at) => at,
        Err(e) => return error(e),
    };
    let hit = Hit {
        delta: b.value,
        at_ms,
        idempotency_key: b.idempotency_key,
    };
    if b.on_redis_error == OnRedisError::Defer && b.action == Action::Apply {
        return match r
            .hit_or_defer(&b.counter, &b.dimensions, &hit, &b.event)
            .await
        {
            Ok(o @ crate::request::HitOutcome::Deferred { .. }) => {
                (StatusCode::ACCEPTED, Json(o)).into_response()
            }
            other => reply(other),
        };
    }
    reply(r.hit(&b.counter, &b.dimensions, &hit, b.action).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitBody {
    #[serde(default)]
    policies: Vec<String>,
    policy: Option<String>,
    subject: String,
    #[serde(default = "one_unit")]
    cost: u64,
    #[serde(default)]
    action: Action,
    /// Answer 429 when denied (default: 200 with `"admitted": false`).
    #[serde(default)]
    reject: bool,
}

fn one_unit() -> u64 {
    1
}

async fn limit(State(r): State<Arc<Requests>>, Json(b): Json<LimitBody>) -> Response {
    let mut names: Vec<&str> = b.policies.iter().map(String::as_str).collect();
    names.extend(b.policy.as_deref());
    let d = match r.limit(&names, &b.subject, b.cost, b.action).await {
        Ok(d) => d,
        Err(e) => return error(e),
    };
    let (policy, state) = d.headers();
    let mut headers = vec![
        (HeaderName::from_static("ratelimit-policy"), policy),
        (HeaderName::from_static("ratelimit"), state),
    ];
    if let Some(ms) = d.retry_after_ms() {
        headers.push((
            HeaderName::from_static("retry-after"),
            ms.div_ceil(1000).to_string(),
        ));
    }
    let code = if b.reject && !d.admitted {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    let mut response = (code, Json(&d)).into_response();
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, v);
        }
    }
    response
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaBody {
    quota: String,
    user: Option<String>,
    #[serde(default)]
    action: Action,
}

async fn quota(State(r): State<Arc<Requests>>, Json(b): Json<QuotaBody>) -> Response {
    reply(r.quota(&b.quota, b.user.as_deref(), b.action).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OnceBody {
    name: String,
    subject: String,
    at: Option<String>,
    #[serde(default)]
    action: Action,
}

async fn once(State(r): State<Arc<Requests>>, Json(b): Json<OnceBody>) -> Response {
    let at_ms = match time(b.at.as_deref()) {
        Ok(at) => at,
        Err(e) => return error(e),
    };
    reply(r.once(&b.name, &b.subject, at_ms, b.action).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UniqueBody {
    name: String,
    subject: String,
    item: Option<String>,
    #[serde(default)]
    action: Action,
}

async fn unique(State(r): State<Arc<Requests>>, Json(b): Json<UniqueBody>) -> Response {
    reply(
        r.unique(&b.name, &b.subject, b.item.as_deref(), b.action)
            .await,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolBody {
    pool: String,
    user: Option<String>,
    #[serde(default)]
    items: Vec<String>,
    #[serde(default)]
    action: Action,
}

async fn pool(State(r): State<Arc<Requests>>, Json(b): Json<PoolBody>) -> Response {
    reply(r.pool(&b.pool, b.user.as_deref(), &b.items, b.action).await)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LockBody {
    /// Lease length, ms (acquire, extend).
    #[serde(default = "ten_seconds")]
    ttl_ms: u64,
    /// How long to wait for the lock, ms (acquire).
    #[serde(default)]
    wait_ms: u64,
    /// The holder's token (release, extend).
    token: Option<String>,
}

fn ten_seconds() -> u64 {
    10_000
}

/// Longest wait an HTTP acquire may ask for: it must answer within `http.request_timeout`.
const MAX_LOCK_WAIT_MS: u64 = 5_000;

/// `POST /v1/locks/{name}/acquire|release|extend`.
async fn lock(
    State(r): State<Arc<Requests>>,
    axum::extract::Path((name, action)): axum::extract::Path<(String, String)>,
    Json(b): Json<LockBody>,
) -> Response {
    use std::time::Duration;
    use tally_counters::lock::Lease;
    let locks = r.locks();
    let ttl = Duration::from_millis(b.ttl_ms);
    let token = || {
        b.token
            .as_deref()
            .ok_or_else(|| RequestError::Invalid("give the lease's token".into()))
    };
    let result = match action.as_str() {
        "acquire" => {
            let wait = Duration::from_millis(b.wait_ms.min(MAX_LOCK_WAIT_MS));
            match locks.acquire(&name, ttl, wait).await {
                Ok(Ok(lease)) => Ok(serde_json::json!({ "acquired": true, "lease": lease })),
                Ok(Err(busy)) => {
                    Ok(serde_json::json!({ "acquired": false, "held_for_ms": busy.held_for_ms }))
                }
                Err(e) => Err(e),
            }
        }
        "release" => match token() {
            Ok(t) => locks
                .release(&Lease::known(locks, &name, t))
                .await
                .map(|ok| serde_json::json!({ "released": ok })),
            Err(e) => Err(e),
        },
        "extend" => match token() {
            Ok(t) => locks
                .extend(&Lease::known(locks, &name, t), ttl)
                .await
                .map(|ok| serde_json::json!({ "extended": ok })),
            Err(e) => Err(e),
        },
        other => Err(RequestError::Invalid(format!(
            "`{other}`: use acquire, release or extend"
        ))),
    };
    reply(result)
}
