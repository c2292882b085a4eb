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
use crate::api::primitives::{Answer, HitOutcome};
use tally_counters::request::Decision;

/// Tag of the request-path routes.
const REQUEST: &str = "request path";
/// Tag of the read routes.
const QUERY: &str = "queries";
/// Tag of the routes for operators (open, without the token).
const OPS: &str = "operations";

#[utoipa::path(post, path = "/v1/hit", tag = REQUEST, request_body = HitBody,
    responses(
        (status = 200, description = "Counted (or peeked, or reset)", body = HitOutcome),
        (status = 202, description = "Redis was unreachable and `on_redis_error` is `defer`: \
            the hit is an event on the topic, counted when Redis is back", body = HitOutcome),
        (status = 409, description = "The `idempotency_key` was used for another key of the \
            counter (other dimension values or another window); nothing was added",
            body = ProblemBody, content_type = "application/problem+json"),
    ))]
fn hit() {}

#[utoipa::path(post, path = "/v1/limit", tag = REQUEST, request_body = LimitBody,
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

#[utoipa::path(post, path = "/v1/quota", tag = REQUEST, request_body = QuotaBody,
    responses((status = 200, description = "The take (`outcome`), a release (`ok`) or a peek \
        (`count`)", body = Answer)))]
fn quota() {}

#[utoipa::path(post, path = "/v1/once", tag = REQUEST, request_body = OnceBody,
    responses((status = 200, description = "`ok`: true the first time in the window", body = Answer)))]
fn once() {}

#[utoipa::path(post, path = "/v1/unique", tag = REQUEST, request_body = UniqueBody,
    responses((status = 200, description = "`count`: the distinct items so far", body = Answer)))]
fn unique() {}

#[utoipa::path(post, path = "/v1/pool", tag = REQUEST, request_body = PoolBody,
    responses((status = 200, description = "A claim (`outcome`), or a count (`fill`: items \
        added, `peek`: items left)", body = Answer)))]
fn pool() {}

#[utoipa::path(post, path = "/v1/locks/{name}/{action}", tag = REQUEST, request_body = LockBody,
    params(
        ("name" = String, Path, description = "The lock; not empty, not starting with `job:`"),
        ("action" = String, Path, description = "`acquire`, `release` or `extend`",
            pattern = "^(acquire|release|extend)$"),
    ),
    responses((status = 200, description = "Acquired or busy; released; extended", body = LockAnswer)))]
fn lock() {}

#[utoipa::path(get, path = "/v1/count", tag = QUERY,
    params(
        ("counter" = Option<String>, Query, description = "The counter (may be left out when \
            only one is configured). Every parameter other than `counter` and `at` is a dimension."),
        ("at" = Option<String>, Query, description = "RFC 3339 or epoch ms (default: now)"),
    ),
    responses((status = 200, description = "The window holding `at`", body = crate::api::query::Answer)))]
fn count() {}

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

#[utoipa::path(post, path = "/v1/counters/{name}/batch", tag = QUERY, request_body = BatchBody,
    params(("name" = String, Path, description = "The counter")),
    responses((status = 200, description = "One answer per tuple", body = BatchAnswer)))]
fn batch() {}

#[utoipa::path(get, path = "/v1/status", tag = OPS,
    responses((status = 200, description = "The live status: partitions with lag and halts \
        (with the repair command), rates with one-minute sparklines, flush latency, hot keys, \
        health, rate-limit decisions per policy, jobs", body = crate::ops::status::view::StatusAnswer)))]
fn status() {}

#[utoipa::path(get, path = "/", tag = OPS,
    responses((status = 200, description = "The status page (self-contained HTML, drawing \
        `/v1/status` every second)", body = String, content_type = "text/html; charset=utf-8")))]
fn page() {}

#[utoipa::path(get, path = "/metrics", tag = OPS,
    responses((status = 200, description = "Prometheus text format", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8")))]
fn metrics() {}

#[utoipa::path(get, path = "/health/live", tag = OPS,
    responses((status = 200, description = "The process runs", body = String,
        content_type = "text/plain")))]
fn live() {}

#[utoipa::path(get, path = "/health/ready", tag = OPS,
    responses(
        (status = 200, description = "Ready; the body says so", body = String,
            content_type = "text/plain"),
        (status = 503, description = "Not ready; the body says why", body = String,
            content_type = "text/plain"),
    ))]
fn ready() {}

#[utoipa::path(get, path = "/openapi.json", tag = OPS,
    responses((status = 200, description = "This description (OpenAPI 3.1)",
        content_type = "application/json")))]
fn openapi() {}
