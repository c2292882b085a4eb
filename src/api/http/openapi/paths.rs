//! One stub per route, carrying its `#[utoipa::path]`: method, path, parameters, body and the
//! success answers, all named by the handlers' own types. The problems every `/v1` route can
//! answer (400, 401, 404, 413, 502, 503) are added by `super::document`, so they are written
//! once. The integration test `openapi` checks that the router and this list name the same
//! routes, and that real answers match these schemas.
#![allow(dead_code)]

use crate::api::http::counters::{BatchAnswer, BatchBody};
use crate::api::http::locks::{LockAnswer, LockBody};
use crate::api::http::problem::ProblemBody;
use crate::api::http::request::{HitBody, LimitBody, OnceBody, PoolBody};
use crate::api::http::request::{QuotaBody, UniqueBody};
use crate::api::primitives::{HitOutcome, RequestAnswer};
use tally_counters::request::Decision;

/// Tag of the request-path routes.
const REQUEST: &str = "request path";
/// Tag of the read routes.
const QUERY: &str = "queries";
/// Tag of the routes for operators (open, without the token).
const OPS: &str = "operations";

/// Add to a counter now, exactly once per idempotency key.
///
/// The hit lands in the window of `at` (default now) with the counter's key and expiry, as the
/// stream would write it; with `idempotency_key` a retry adds nothing and answers `duplicate`.
/// `action` `peek` reads, `reset` (admin token) clears.
#[utoipa::path(post, path = "/v1/hit", tag = REQUEST, request_body(content = HitBody, example = json!({"counter": "plays", "dimensions": {"video": "a"}, "value": 1, "idempotency_key": "req-81"})),
    responses(
        (status = 200, description = "Counted (or peeked, or reset)", body = HitOutcome),
        (status = 202, description = "Redis was unreachable and `on_redis_error` is `defer`: \
            the hit is an event on the topic, counted when Redis is back", body = HitOutcome),
        (status = 409, description = "The `idempotency_key` was used for another key of the \
            counter (other dimension values or another window); nothing was added",
            body = ProblemBody, content_type = "application/problem+json"),
    ))]
fn hit() {}

/// Decide a request against one or several rate-limit policies.
///
/// All named policies are decided in one atomic script: admitted only if every policy admits, and
/// a denial charges none. The answer carries the IETF RateLimit headers; `reject` turns a denial
/// into a 429.
#[utoipa::path(post, path = "/v1/limit", tag = REQUEST, request_body(content = LimitBody, example = json!({"policies": ["fixed"], "subject": "ip:1.2.3.4", "cost": 1})),
    responses(
        (status = 200, description = "The decision (`admitted` false when denied, unless \
            `reject`)", body = Decision, headers(
            ("RateLimit-Policy" = String, description = "Per policy: `\"name\";q=limit;w=seconds`"),
            ("RateLimit" = String, description = "Per policy: `\"name\";r=remaining;t=seconds`; \
                absent when the decision was taken without Redis (`without_redis`)"),
            ("Retry-After" = u64, description = "When denied: seconds until a retry can pass"),
        )),
        (status = 429, description = "Denied and the request asked for `\"reject\": true`",
            body = Decision, headers(
            ("RateLimit-Policy" = String), ("RateLimit" = String),
            ("Retry-After" = u64, description = "Seconds until a retry of the same cost can pass"),
        )),
    ))]
fn limit() {}

/// Take one unit of a quota, release it, or peek.
///
/// The first `size` takes win across every caller and process; with `once_per_user` a user takes
/// at most one (a retry answers `already_taken` with the same unit).
#[utoipa::path(post, path = "/v1/quota", tag = REQUEST, request_body(content = QuotaBody, example = json!({"quota": "flash", "user": "u42"})),
    responses((status = 200, description = "The take (`outcome`), a release (`ok`) or a peek \
        (`count`)", body = RequestAnswer)))]
fn quota() {}

/// Is this the subject's first call in the window?
///
/// `ok` is true the first time a subject calls in the window (aligned in the policy's time zone),
/// false after; the marker expires with the window.
#[utoipa::path(post, path = "/v1/once", tag = REQUEST, request_body(content = OnceBody, example = json!({"name": "welcome", "subject": "u42"})),
    responses((status = 200, description = "`ok`: true the first time in the window", body = RequestAnswer)))]
fn once() {}

/// Count the distinct items of a subject in a sliding window.
///
/// Adds `item` to the subject's set for the window and answers how many distinct items it holds,
/// exactly (up to `max_items`).
#[utoipa::path(post, path = "/v1/unique", tag = REQUEST, request_body(content = UniqueBody, example = json!({"name": "visitors", "subject": "page:home", "item": "device-7"})),
    responses((status = 200, description = "`count`: the distinct items so far", body = RequestAnswer)))]
fn unique() {}

/// Claim an item of a pool, fill it, or peek.
///
/// Each item is handed out once (the same one again to the same user); `fill` (admin token) adds
/// items, `peek` counts what is left.
#[utoipa::path(post, path = "/v1/pool", tag = REQUEST, request_body(content = PoolBody, example = json!({"pool": "coupons", "user": "u42"})),
    responses((status = 200, description = "A claim (`outcome`), or a count (`fill`: items \
        added, `peek`: items left)", body = RequestAnswer)))]
fn pool() {}

/// Acquire, release or extend a lock with a fencing token.
///
/// `acquire` answers a fence that grows with every holder, so a resource can refuse a stale
/// holder; `release` and `extend` need the holder's token. Every lock call needs the admin token
/// when one is set.
#[utoipa::path(post, path = "/v1/locks/{name}/{action}", tag = REQUEST, request_body(content = LockBody, example = json!({"ttl_ms": 10000})),
    params(
        ("name" = String, Path, description = "The lock; not empty, not starting with `job:`"),
        ("action" = String, Path, description = "`acquire`, `release` or `extend`",
            pattern = "^(acquire|release|extend)$"),
    ),
    responses((status = 200, description = "Acquired or busy; released; extended", body = LockAnswer)))]
fn lock() {}

/// Read one window of a counter.
///
/// The window holding `at` (default now), by the counter's dimensions given as query parameters.
#[utoipa::path(get, path = "/v1/count", tag = QUERY,
    params(
        ("counter" = Option<String>, Query, description = "The counter (may be left out when \
            only one is configured). Every parameter other than `counter` and `at` is a dimension."),
        ("at" = Option<String>, Query, description = "RFC 3339 or epoch ms (default: now)"),
    ),
    responses((status = 200, description = "The window holding `at`", body = crate::api::query::Answer)))]
fn count() {}

/// Read a range of windows of a counter.
///
/// One window, the last N, or those between `from` and `to`, each with its value and the range
/// combined (summed, or merged for distinct and leaderboard kinds).
#[utoipa::path(get, path = "/v1/counters/{name}", tag = QUERY,
    params(
        ("name" = String, Path, description = "The counter. Every parameter other than those \
            below is a dimension."),
        ("window" = Option<String>, Query, description = "The window holding this time \
            (RFC 3339, epoch ms, or `current`, the default)"),
        ("last" = Option<u32>, Query, description = "The last N windows"),
        ("from" = Option<String>, Query, description = "With `to`: the windows between"),
        ("to" = Option<String>, Query, description = "With `from`"),
        ("top" = Option<u32>, Query, description = "Leaderboards: members to answer (10)"),
    ),
    responses((status = 200, description = "Per window and combined",
        body = crate::api::http::schemas::RangeAnswerSchema)))]
fn counter() {}

/// Read many dimension tuples of a counter at once.
///
/// One answer per tuple of `dimensions`, over the same windows, in one round trip to Redis.
#[utoipa::path(post, path = "/v1/counters/{name}/batch", tag = QUERY, request_body(content = BatchBody, example = json!({"dimensions": [{"video": "a"}, {"video": "b"}], "last": 2})),
    params(("name" = String, Path, description = "The counter")),
    responses((status = 200, description = "One answer per tuple", body = BatchAnswer)))]
fn batch() {}

/// The live status of this process.
///
/// What the status page and `tally top` draw: identity, health in words, partitions with offsets
/// and lag, rates, flush latency, hot keys, decisions per policy, jobs.
#[utoipa::path(get, path = "/v1/status", tag = OPS,
    responses((status = 200, description = "The live status: partitions with lag and halts \
        (with the repair command), rates with one-minute sparklines, flush latency, hot keys, \
        health, rate-limit decisions per policy, jobs", body = crate::ops::status::view::StatusAnswer)))]
fn status() {}

/// The status page.
///
/// A self-contained HTML page that draws `/v1/status` every second; it asks for the token when
/// one is set.
#[utoipa::path(get, path = "/", tag = OPS,
    responses((status = 200, description = "The status page (self-contained HTML, drawing \
        `/v1/status` every second)", body = String, content_type = "text/html; charset=utf-8")))]
fn page() {}

/// Prometheus metrics.
///
/// Every metric family in the text exposition format; open (no token).
#[utoipa::path(get, path = "/metrics", tag = OPS,
    responses((status = 200, description = "Prometheus text format", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8")))]
fn metrics() {}

/// Liveness.
///
/// 200 while the process answers; open (no token).
#[utoipa::path(get, path = "/health/live", tag = OPS,
    responses((status = 200, description = "The process runs", body = String,
        content_type = "text/plain")))]
fn live() {}

/// Readiness.
///
/// 200 when ready; 503 with the reason (Kafka not joined, Redis unreachable, a partition halted);
/// open (no token).
#[utoipa::path(get, path = "/health/ready", tag = OPS,
    responses(
        (status = 200, description = "Ready; the body says so", body = String,
            content_type = "text/plain"),
        (status = 503, description = "Not ready; the body says why", body = String,
            content_type = "text/plain"),
    ))]
fn ready() {}

/// This description.
///
/// The OpenAPI 3.1 document of every route, generated from the handlers' own types.
#[utoipa::path(get, path = "/openapi.json", tag = OPS,
    responses((status = 200, description = "This description (OpenAPI 3.1)",
        content_type = "application/json")))]
fn openapi() {}
