//! `POST /v1/hit`, `/v1/limit`, `/v1/quota`, `/v1/once`, `/v1/unique`, `/v1/pool`, `/v1/locks`:
//! JSON in, JSON out. Errors are problem details (`problem.rs`): bad input a 400 naming the field
//! and the allowed range, Redis unavailable a 503; rate-limit answers carry
//! `RateLimit-Policy`, `RateLimit` and (when denied) `Retry-After`, and are 429 when denied if
//! the request asks for it (`"reject": true`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use tally_counters::request::{Hit, RequestError};
use utoipa::ToSchema;

use super::auth::Scope;
use super::problem::{Body, Problem};
use crate::api::primitives::{Action, Primitives};
use crate::api::query::parse_time;

/// Largest request body, bytes.
pub(super) const MAX_BODY: usize = 64 * 1024;

/// The request-path routes over `requests`.
pub fn routes<S: Clone + Send + Sync + 'static>(requests: Arc<Primitives>) -> Router<S> {
    Router::new()
        .route("/v1/hit", post(hit))
        .route("/v1/limit", post(limit))
        .route("/v1/quota", post(quota))
        .route("/v1/once", post(once))
        .route("/v1/unique", post(unique))
        .route("/v1/pool", post(pool))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(requests)
}

/// `reset`, `release` and `fill` need the admin scope (`http.admin_token`, when it is set).
fn refusal(scope: Scope, action: Action) -> Option<Response> {
    match action {
        Action::Reset => scope.refusal("`reset`"),
        Action::Release => scope.refusal("`release`"),
        Action::Fill => scope.refusal("`fill`"),
        Action::Apply | Action::Peek => None,
    }
}

pub(super) fn error(e: RequestError) -> Response {
    Problem::from_request(e).into_response()
}

/// Most policies one limit call may name (each is a key and a script step).
pub const MAX_POLICIES: usize = 16;
/// Largest cost of one limit call.
pub const MAX_COST: u64 = 1_000_000_000;
/// Longest lease an HTTP acquire or extend may ask for (a day): a crashed holder's lease must
/// run out in reasonable time.
pub const MAX_LOCK_TTL_MS: u64 = 86_400_000;

/// Refuse an empty name.
pub(super) fn named(field: &str, name: &str) -> Result<(), Problem> {
    if name.is_empty() {
        return Err(Problem::invalid(
            field,
            format!("`{field}` must not be empty"),
        ));
    }
    Ok(())
}

pub(super) fn reply<T: serde::Serialize>(result: Result<T, RequestError>) -> Response {
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

/// `POST /v1/hit`: add to one windowed counter.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct HitBody {
    /// A configured counter.
    #[schema(min_length = 1)]
    counter: String,
    /// The counter's dimension values, all of them.
    #[serde(default)]
    dimensions: BTreeMap<String, String>,
    /// What to add; 0 or less (a negative subtracts), or a value or sum past `http.max_value`,
    /// needs the admin scope when `http.admin_token` is set. The sum must stay in the signed
    /// 64-bit range.
    #[serde(default = "one")]
    #[schema(default = 1)]
    value: i64,
    /// The hit's time: RFC 3339 or epoch milliseconds (default: now).
    at: Option<String>,
    /// A hit with a key seen before (within the window) adds nothing and answers `duplicate`.
    idempotency_key: Option<String>,
    /// `apply` (add), `peek` (read), or `reset` (delete the window's value).
    #[serde(default)]
    action: Action,
    /// `error` (default): a hit Redis cannot take is a 503. `defer`: write it to the topic the
    /// stream path counts (202), under `tally run`.
    #[serde(default)]
    on_redis_error: OnRedisError,
    /// Defer: more fields for the event, only ones no counter on the topic reads (e.g. a trace
    /// id); a field a counter reads is refused (400).
    #[serde(default)]
    #[schema(value_type = Object)]
    event: serde_json::Map<String, serde_json::Value>,
}

/// What a hit does when Redis cannot take it.
#[derive(Deserialize, Default, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum OnRedisError {
    #[default]
    Error,
    Defer,
}

fn one() -> i64 {
    1
}

async fn hit(
    State(r): State<Arc<Primitives>>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<HitBody>,
) -> Response {
    if let Err(p) = named("counter", &b.counter) {
        return p.into_response();
    }
    if let Some(answer) = refusal(scope, b.action) {
        return answer;
    }
    // Taking counts away is destructive (a `-1000` zeroes a count the stream path built); a
    // plain caller adds.
    if b.action == Action::Apply && b.value <= 0 {
        if let Some(answer) = scope.refusal("a hit with `value` <= 0") {
            return answer;
        }
    }
    // ... and so is one that brings a counter within reach of overflow (every later stream
    // increment of it would be dropped): past `http.max_value`, by itself or summed in Redis.
    let max_value = scope.max_value();
    if let Some(max) = max_value.filter(|m| b.action == Action::Apply && b.value > *m) {
        let what = format!("a hit with `value` above http.max_value ({max})");
        if let Some(answer) = scope.refusal(&what) {
            return answer;
        }
    }
    let at_ms = match time(b.at.as_deref()) {
        Ok(at) => at,
        Err(e) => return error(e),
    };
    let hit = Hit {
        delta: b.value,
        at_ms,
        idempotency_key: b.idempotency_key,
        max_value,
    };
    if b.on_redis_error == OnRedisError::Defer && b.action == Action::Apply {
        return match r
            .hit_or_defer(&b.counter, &b.dimensions, &hit, &b.event)
            .await
        {
            Ok(o @ crate::api::primitives::HitOutcome::Deferred { .. }) => {
                (StatusCode::ACCEPTED, Json(o)).into_response()
            }
            other => reply(other),
        };
    }
    match r.hit(&b.counter, &b.dimensions, &hit, b.action).await {
        Err(RequestError::AboveMax { counter, max }) => {
            let what = format!("a hit that takes counter `{counter}` past http.max_value ({max})");
            scope
                .refusal(&what)
                .unwrap_or_else(|| error(RequestError::AboveMax { counter, max }))
        }
        other => reply(other),
    }
}

/// `POST /v1/limit`: ask configured rate-limit policies (all must admit).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitBody {
    /// Configured policies, each at most once; with `policy`, 1 to 16 (`MAX_POLICIES`) in all.
    #[serde(default)]
    #[schema(max_items = 16, inline)]
    policies: Vec<PolicyName>,
    /// One more policy (shorthand for a single one).
    #[schema(min_length = 1)]
    policy: Option<String>,
    /// Whom the limit counts (a user, an IP, an API key).
    subject: String,
    /// Units this call takes.
    #[serde(default = "one_unit")]
    #[schema(default = 1, maximum = 1000000000)]
    cost: u64,
    /// `apply` (decide and record), `peek` (decide only), or `reset`.
    #[serde(default)]
    action: Action,
    /// Answer 429 when denied (default: 200 with `"admitted": false`).
    #[serde(default)]
    reject: bool,
}

/// A policy's name in a limit call: not empty (the pattern matches any one character).
#[derive(Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(pattern = "[\\s\\S]")]
pub(super) struct PolicyName(String);

fn one_unit() -> u64 {
    1
}

/// The policies a limit call names, checked: 1 to `MAX_POLICIES`, none empty, none twice, and
/// a cost of at most `MAX_COST`.
fn policies(b: &LimitBody) -> Result<Vec<&str>, Problem> {
    let mut names: Vec<&str> = b.policies.iter().map(|p| p.0.as_str()).collect();
    names.extend(b.policy.as_deref());
    if names.is_empty() || names.len() > MAX_POLICIES {
        return Err(Problem::invalid(
            "policies",
            format!("name 1 to {MAX_POLICIES} policies (got {})", names.len()),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        named("policies", name)?;
        if names[..i].contains(name) {
            return Err(Problem::invalid(
                "policies",
                format!("policy `{name}` is named twice"),
            ));
        }
    }
    if b.cost > MAX_COST {
        return Err(Problem::invalid(
            "cost",
            format!("cost must be at most {MAX_COST} (got {})", b.cost),
        ));
    }
    Ok(names)
}

async fn limit(
    State(r): State<Arc<Primitives>>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<LimitBody>,
) -> Response {
    let names = match policies(&b) {
        Ok(names) => names,
        Err(p) => return p.into_response(),
    };
    if let Some(answer) = refusal(scope, b.action) {
        return answer;
    }
    let d = match r.limit(&names, &b.subject, b.cost, b.action).await {
        Ok(d) => d,
        Err(e) => return error(e),
    };
    let (policy, state) = d.headers();
    let mut headers = vec![(HeaderName::from_static("ratelimit-policy"), policy)];
    // Without Redis nothing was counted (`without_redis: true` in the body): there is no
    // remaining to tell, and `r=0;t=0` would say the opposite of the admission.
    if !d.without_redis {
        headers.push((HeaderName::from_static("ratelimit"), state));
    }
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

/// `POST /v1/quota`: take one unit of a fixed-size quota.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct QuotaBody {
    /// A configured quota.
    #[schema(min_length = 1)]
    quota: String,
    /// The user taking (needed by quotas that admit each user once).
    user: Option<String>,
    /// `apply` (take), `peek` (count taken), `release` (give back), or `reset`.
    #[serde(default)]
    action: Action,
}

async fn quota(
    State(r): State<Arc<Primitives>>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<QuotaBody>,
) -> Response {
    if let Err(p) = named("quota", &b.quota) {
        return p.into_response();
    }
    if let Some(answer) = refusal(scope, b.action) {
        return answer;
    }
    reply(r.quota(&b.quota, b.user.as_deref(), b.action).await)
}

/// `POST /v1/once`: is this the subject's first time in the window?
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OnceBody {
    /// A configured once-per-window flag.
    #[schema(min_length = 1)]
    name: String,
    /// Who or what happens once.
    subject: String,
    /// The time: RFC 3339 or epoch milliseconds (default: now).
    at: Option<String>,
    /// `apply` (mark), `peek`, or `reset`.
    #[serde(default)]
    action: Action,
}

async fn once(
    State(r): State<Arc<Primitives>>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<OnceBody>,
) -> Response {
    if let Err(p) = named("name", &b.name) {
        return p.into_response();
    }
    if let Some(answer) = refusal(scope, b.action) {
        return answer;
    }
    let at_ms = match time(b.at.as_deref()) {
        Ok(at) => at,
        Err(e) => return error(e),
    };
    reply(r.once(&b.name, &b.subject, at_ms, b.action).await)
}

/// `POST /v1/unique`: count the distinct items a subject has shown.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UniqueBody {
    /// A configured distinct set.
    #[schema(min_length = 1)]
    name: String,
    /// Whose items.
    subject: String,
    /// The item to add (`apply`).
    item: Option<String>,
    /// `apply` (add the item), `peek` (count), or `reset`.
    #[serde(default)]
    action: Action,
}

async fn unique(
    State(r): State<Arc<Primitives>>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<UniqueBody>,
) -> Response {
    if let Err(p) = named("name", &b.name) {
        return p.into_response();
    }
    if let Some(answer) = refusal(scope, b.action) {
        return answer;
    }
    reply(
        r.unique(&b.name, &b.subject, b.item.as_deref(), b.action)
            .await,
    )
}

/// `POST /v1/pool`: give a user one item of a pool, once.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolBody {
    /// A configured pool.
    #[schema(min_length = 1)]
    pool: String,
    /// The user claiming (`apply`).
    user: Option<String>,
    /// Items to add (`fill`).
    #[serde(default)]
    items: Vec<String>,
    /// `apply` (claim), `fill`, `peek` (items left), or `reset`.
    #[serde(default)]
    action: Action,
}

async fn pool(
    State(r): State<Arc<Primitives>>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<PoolBody>,
) -> Response {
    if let Err(p) = named("pool", &b.pool) {
        return p.into_response();
    }
    if let Some(answer) = refusal(scope, b.action) {
        return answer;
    }
    reply(r.pool(&b.pool, b.user.as_deref(), &b.items, b.action).await)
}
