//! The requests the `openapi` test sends, each with the route it must be checked against and
//! the status it must get.

use super::ROUTES;

/// One request and the status it must get.
pub struct Case {
    pub method: &'static str,
    /// The route as the description names it.
    pub route: &'static str,
    pub target: String,
    pub body: Option<String>,
    /// Send the bearer token.
    pub token: bool,
    pub status: u16,
}

/// A POST with the token.
pub fn post(route: &'static str, target: &str, body: &str, status: u16) -> Case {
    Case {
        method: "post",
        route,
        target: target.to_string(),
        body: Some(body.to_string()),
        token: true,
        status,
    }
}

/// A GET with the token.
pub fn get(route: &'static str, target: &str, status: u16) -> Case {
    Case {
        method: "get",
        route,
        target: target.to_string(),
        body: None,
        token: true,
        status,
    }
}

/// Answers while Redis is up: a success and a 400 on every route, 429 from a limit, in the
/// order they are sent.
pub fn cases_redis_up() -> Vec<Case> {
    let mut cases = decisions();
    cases.extend(sets_and_pools());
    cases.extend(locks());
    cases.extend(reads());
    cases
}

/// Hits, limits and the quota.
fn decisions() -> Vec<Case> {
    vec![
        post(
            "/v1/hit",
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"value":3}"#,
            200,
        ),
        post(
            "/v1/hit",
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"action":"peek"}"#,
            200,
        ),
        post(
            "/v1/hit",
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"value":1.5}"#,
            400,
        ),
        post(
            "/v1/limit",
            "/v1/limit",
            r#"{"policies":["fixed","tiny"],"subject":"s"}"#,
            200,
        ),
        post(
            "/v1/limit",
            "/v1/limit",
            r#"{"policy":"tiny","subject":"s","cost":5,"reject":true}"#,
            429,
        ),
        post(
            "/v1/limit",
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s","cost":1000000001}"#,
            400,
        ),
        post(
            "/v1/quota",
            "/v1/quota",
            r#"{"quota":"flash","user":"u"}"#,
            200,
        ),
        post(
            "/v1/quota",
            "/v1/quota",
            r#"{"quota":"flash","action":"peek"}"#,
            200,
        ),
        post(
            "/v1/quota",
            "/v1/quota",
            r#"{"quota":"flash","user":"u","action":"release"}"#,
            200,
        ),
        post("/v1/quota", "/v1/quota", r#"{"quota":""}"#, 400),
    ]
}

/// Once, unique and the pool (filled before it is claimed from).
fn sets_and_pools() -> Vec<Case> {
    vec![
        post(
            "/v1/once",
            "/v1/once",
            r#"{"name":"welcome","subject":"u"}"#,
            200,
        ),
        post(
            "/v1/once",
            "/v1/once",
            r#"{"name":"welcome","subject":"u","at":"never"}"#,
            400,
        ),
        post(
            "/v1/unique",
            "/v1/unique",
            r#"{"name":"visitors","subject":"s","item":"x"}"#,
            200,
        ),
        post(
            "/v1/unique",
            "/v1/unique",
            r#"{"name":"visitors","subject":"s","item":7}"#,
            400,
        ),
        post(
            "/v1/pool",
            "/v1/pool",
            r#"{"pool":"coupons","action":"fill","items":["c1"]}"#,
            200,
        ),
        post(
            "/v1/pool",
            "/v1/pool",
            r#"{"pool":"coupons","user":"u1"}"#,
            200,
        ),
        post(
            "/v1/pool",
            "/v1/pool",
            r#"{"pool":"coupons","user":"u2"}"#,
            200,
        ),
        post("/v1/pool", "/v1/pool", r#"{"pool":"nope","user":"u"}"#, 400),
    ]
}

/// A lock acquired, acquired again, released and extended with a token not its own.
fn locks() -> Vec<Case> {
    let lock = "/v1/locks/{name}/{action}";
    vec![
        post(lock, "/v1/locks/report/acquire", r#"{"ttl_ms":10000}"#, 200),
        post(lock, "/v1/locks/report/acquire", r#"{"ttl_ms":10000}"#, 200),
        post(
            lock,
            "/v1/locks/report/release",
            r#"{"token":"not-mine"}"#,
            200,
        ),
        post(
            lock,
            "/v1/locks/report/extend",
            r#"{"token":"not-mine","ttl_ms":5000}"#,
            200,
        ),
        post(
            lock,
            "/v1/locks/report/acquire",
            r#"{"ttl_ms":86400001}"#,
            400,
        ),
    ]
}

/// Counts and ranges read back, and the operational routes.
fn reads() -> Vec<Case> {
    vec![
        get("/v1/count", "/v1/count?counter=plays&video=a", 200),
        get("/v1/count", "/v1/count?counter=plays&video=a&at=soon", 400),
        get(
            "/v1/counters/{name}",
            "/v1/counters/plays?video=a&last=3",
            200,
        ),
        get(
            "/v1/counters/{name}",
            "/v1/counters/plays?video=a&last=x",
            400,
        ),
        post(
            "/v1/counters/{name}/batch",
            "/v1/counters/plays/batch",
            r#"{"dimensions":[{"video":"a"},{"video":"b"}],"last":2}"#,
            200,
        ),
        post(
            "/v1/counters/{name}/batch",
            "/v1/counters/plays/batch",
            r#"{"dimensions":[],"last":"x"}"#,
            400,
        ),
        get("/metrics", "/metrics", 200),
        get("/health/live", "/health/live", 200),
        get("/health/ready", "/health/ready", 200),
        get("/openapi.json", "/openapi.json", 200),
        get("/v1/status", "/v1/status", 200),
        get("/", "/", 200),
    ]
}

/// Every `/v1` route without the token (401) and, for those with a body, with one too large.
pub fn cases_refused() -> Vec<Case> {
    let mut cases = Vec::new();
    for route in ROUTES.iter().filter(|r| r.starts_with("/v1/")) {
        let target = route
            .replace("{name}", "plays")
            .replace("{action}", "acquire");
        let has_body = !matches!(*route, "/v1/count" | "/v1/counters/{name}" | "/v1/status");
        let mut case = if has_body {
            post(route, &target, "{}", 401)
        } else {
            get(route, &target, 401)
        };
        case.token = false;
        cases.push(case);
        if has_body {
            let size = if route.ends_with("/batch") {
                1 << 20
            } else {
                64 << 10
            };
            let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(size));
            cases.push(post(route, &target, &big, 413));
        }
    }
    cases
}

/// Every `/v1` route with Redis stopped: 503 (the limit's `fixed` policy fails closed).
pub fn cases_redis_down() -> Vec<Case> {
    let lock = "/v1/locks/{name}/{action}";
    vec![
        post(
            "/v1/hit",
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"}}"#,
            503,
        ),
        post(
            "/v1/limit",
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s"}"#,
            200,
        ),
        post(
            "/v1/quota",
            "/v1/quota",
            r#"{"quota":"flash","user":"v"}"#,
            503,
        ),
        post(
            "/v1/once",
            "/v1/once",
            r#"{"name":"welcome","subject":"v"}"#,
            503,
        ),
        post(
            "/v1/unique",
            "/v1/unique",
            r#"{"name":"visitors","subject":"s","item":"y"}"#,
            503,
        ),
        post(
            "/v1/pool",
            "/v1/pool",
            r#"{"pool":"coupons","user":"u3"}"#,
            503,
        ),
        post(lock, "/v1/locks/other/acquire", r#"{"ttl_ms":1000}"#, 503),
        get("/v1/count", "/v1/count?counter=plays&video=a", 503),
        get("/v1/counters/{name}", "/v1/counters/plays?video=a", 503),
        post(
            "/v1/counters/{name}/batch",
            "/v1/counters/plays/batch",
            r#"{"dimensions":[{"video":"a"}]}"#,
            503,
        ),
        get("/health/ready", "/health/ready", 503),
    ]
}
