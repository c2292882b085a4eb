//! `GET /openapi.json`: an OpenAPI 3.1 description of every route, assembled from the handlers'
//! own types (utoipa derives their schemas, so a field added to a body or an answer shows here
//! without anyone writing it twice). It is served open, like `/metrics` and the health routes:
//! it holds no secret, and a client needs it to learn that `/v1` wants a bearer token.
//!
//! `paths.rs` declares the routes and their success answers; this file adds what every `/v1`
//! route shares (its problem answers and the bearer token) and the schemas of answers whose
//! types live where utoipa cannot be derived today (`query::range`).

mod paths;

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "tally",
        description = "Exact, time-windowed counters in Redis: the request \
        path (hits, rate limits, quotas, once, distinct sets, pools, locks) and reads. Every \
        error is an RFC 9457 problem (`application/problem+json`)."
    ),
    paths(
        paths::hit,
        paths::limit,
        paths::quota,
        paths::once,
        paths::unique,
        paths::pool,
        paths::lock,
        paths::count,
        paths::counter,
        paths::batch,
        paths::status,
        paths::page,
        paths::metrics,
        paths::live,
        paths::ready,
        paths::openapi
    ),
    components(schemas(super::problem::ProblemBody))
)]
struct ApiDoc;

/// The problems a `/v1` route can answer besides its own, with why; 413 only where a body is
/// read.
const V1_PROBLEMS: &[(&str, &str)] = &[
    (
        "400",
        "Bad input: `field` names it and `detail` the allowed range",
    ),
    (
        "401",
        "`http.token` is set and the request lacks `Authorization: Bearer <token>` (or \
         `http.admin_token` is set, the call needs it, and no token was sent)",
    ),
    (
        "403",
        "`http.admin_token` is set and the call needs it (`reset`, quota `release`, pool \
         `fill`, locks): another token was sent",
    ),
    (
        "404",
        "The route is not enabled (no `[request]` section, or queries are off)",
    ),
    ("413", "The body is larger than the route takes"),
    (
        "502",
        "Redis answered what tally cannot read (the log has it under `request_id`)",
    ),
    (
        "503",
        "Redis is unavailable, or no answer within `http.request_timeout`: retry later",
    ),
];

/// The description, as served (built once).
pub fn document() -> &'static str {
    static JSON: LazyLock<String> =
        LazyLock::new(|| serde_json::to_string(&build()).expect("an OpenAPI document serializes"));
    &JSON
}

/// `GET /openapi.json`.
pub async fn handler() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document())
}

/// The derived document with the shared problem answers and the bearer token added.
fn build() -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
    );
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        let has_body = item.post.is_some();
        // The request routes (not the queries) take the calls that need the admin token.
        let admin = has_body && !path.starts_with("/v1/counters");
        for op in [&mut item.get, &mut item.post].into_iter().flatten() {
            v1_operation(op, has_body, admin);
        }
    }
    doc
}

/// Add the bearer token and the shared problems to one `/v1` operation.
fn v1_operation(op: &mut Operation, has_body: bool, admin: bool) {
    op.security = Some(vec![SecurityRequirement::new(
        "bearer",
        Vec::<String>::new(),
    )]);
    for (status, why) in V1_PROBLEMS {
        if *status == "413" && !has_body {
            continue;
        }
        if *status == "403" && !admin {
            continue;
        }
        let content = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build();
        let response = ResponseBuilder::new()
            .description(*why)
            .content("application/problem+json", content)
            .build();
        op.responses
            .responses
            .insert((*status).to_string(), response.into());
    }
}

#[cfg(test)]
mod tests {
    use super::document;
    use crate::api::http::{MAX_COST, MAX_LOCK_TTL_MS, MAX_LOCK_WAIT_MS, MAX_POLICIES};

    /// utoipa takes limits as literals only: this keeps them equal to the constants.
    #[test]
    fn the_limits_are_the_constants() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let schemas = &doc["components"]["schemas"];
        let limit = &schemas["LimitBody"]["properties"];
        assert_eq!(limit["cost"]["maximum"], MAX_COST, "{limit}");
        assert_eq!(limit["policies"]["maxItems"], MAX_POLICIES, "{limit}");
        let lock = &schemas["LockBody"]["properties"];
        assert_eq!(lock["ttl_ms"]["maximum"], MAX_LOCK_TTL_MS, "{lock}");
        assert_eq!(lock["ttl_ms"]["minimum"], 1, "{lock}");
        assert_eq!(lock["wait_ms"]["maximum"], MAX_LOCK_WAIT_MS, "{lock}");
        let problem = &schemas["Problem"]["properties"];
        assert!(problem["type"].is_object(), "{problem}");
    }

    /// README's route table is the description's routes, methods, body schemas and answers.
    #[test]
    fn the_readme_route_table_is_the_description() {
        let readme = include_str!("../../../../docs/guide/12-http-and-metrics.md");
        let start = readme
            .find("<!-- routes:")
            .expect("README has the route table");
        let end = readme[start..]
            .find("<!-- /routes -->")
            .expect("the table ends")
            + start;
        let mut in_readme: Vec<String> = readme[start..end]
            .lines()
            .filter(|l| l.starts_with("| GET") || l.starts_with("| POST"))
            .map(|l| l.replace('`', ""))
            .collect();
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        let mut described = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                let body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                    .as_str()
                    .map_or("", |r| r.rsplit('/').next().unwrap_or(""));
                let codes: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
                let codes: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
                described.push(format!(
                    "| {} | {path} | {body} | {} |",
                    method.to_uppercase(),
                    codes.join(", ")
                ));
            }
        }
        in_readme.sort();
        described.sort();
        assert_eq!(
            in_readme, described,
            "README's route table differs from /openapi.json"
        );
    }
}
