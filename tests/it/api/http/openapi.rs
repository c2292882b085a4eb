//! The OpenAPI description as a contract: `GET /openapi.json` is OpenAPI 3.1, names every route
//! the server has, and the real answers of every route (a success and errors: 400, 401, 413,
//! 429, 503, and a deferred hit's 202) match the schema the description gives for that route,
//! status and content type. One `tally serve` with a bearer token on a real redis-server, stopped
//! for the 503s; the 202 from `tally run` on a mock broker.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tally_testkit::http::{self, Answer, Client};
use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::request::{PLAYS, PRIMITIVES};
use crate::common::wait_for;

const TOKEN: &str = "s3cret-openapi";

/// Every route of the server, as the description must name it.
const ROUTES: &[&str] = &[
    "/v1/hit",
    "/v1/limit",
    "/v1/quota",
    "/v1/once",
    "/v1/unique",
    "/v1/pool",
    "/v1/locks/{name}/{action}",
    "/v1/count",
    "/v1/counters/{name}",
    "/v1/counters/{name}/batch",
    "/v1/status",
    "/",
    "/metrics",
    "/health/live",
    "/health/ready",
    "/openapi.json",
];

mod cases;

use cases::{cases_redis_down, cases_redis_up, cases_refused, post, Case};
/// `tally serve` with `http.token` (the shared harness writes its own `[http]` section).
struct Serve {
    child: Child,
    port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(redis: &LocalRedis) -> Serve {
    let port = free_port().unwrap();
    let path =
        std::env::temp_dir().join(format!("tally-openapi-{}-{port}.toml", std::process::id()));
    let config = format!(
        r#"
[redis]
url = "{url}"

[http]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"

{PLAYS}

[[request.limits]]
name = "fixed"
algorithm = "fixed"
limit = 30
window = "1s"
on_redis_error = "closed"

[[request.limits]]
name = "tiny"
algorithm = "fixed"
limit = 1
window = "1h"

{PRIMITIVES}
"#,
        url = redis.url()
    );
    std::fs::write(&path, config).unwrap();
    let log = std::fs::File::create(path.with_extension("log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn tally");
    Serve { child, port }
}

/// The description, and the schemas of its answers with `$ref`s resolvable.
struct Spec {
    doc: Value,
}

impl Spec {
    /// The schema of `route`'s `method` answer `status` in `media` (a media type without
    /// parameters), with the document's components beside it so `#/components/...` resolves.
    fn answer_schema(&self, case: &Case, media: &str) -> Result<Option<Value>, String> {
        let answer =
            &self.doc["paths"][case.route][case.method]["responses"][case.status.to_string()];
        let Some(content) = answer.get("content").and_then(Value::as_object) else {
            return Err(format!(
                "{} {}: answer {} not described",
                case.method, case.route, case.status
            ));
        };
        let Some((_, described)) = content
            .iter()
            .find(|(m, _)| m.split(';').next().map(str::trim) == Some(media))
        else {
            return Err(format!(
                "{} {} {}: content type {media} not described ({:?})",
                case.method,
                case.route,
                case.status,
                content.keys().collect::<Vec<_>>()
            ));
        };
        Ok(described.get("schema").map(|s| self.resolvable(s)))
    }

    /// The schema of `route`'s request body.
    fn body_schema(&self, case: &Case) -> Option<Value> {
        let body = &self.doc["paths"][case.route][case.method]["requestBody"];
        body["content"]["application/json"]
            .get("schema")
            .map(|s| self.resolvable(s))
    }

    fn resolvable(&self, schema: &Value) -> Value {
        let mut schema = schema.clone();
        if let Value::Object(map) = &mut schema {
            map.insert("components".into(), self.doc["components"].clone());
        } else {
            schema = serde_json::json!({ "allOf": [schema], "components": self.doc["components"] });
        }
        schema
    }

    /// What is wrong with `answer` to `case`, if anything.
    fn check(&self, case: &Case, answer: &Answer) -> Result<(), String> {
        let what = format!(
            "{} {} -> {} {}",
            case.method,
            case.target,
            answer.status,
            cut(&answer.body)
        );
        if answer.status != case.status {
            return Err(format!("{what}: wanted {}", case.status));
        }
        self.headers(case, answer)
            .map_err(|e| format!("{what}: {e}"))?;
        let media = answer
            .header("content-type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        let Some(schema) = self
            .answer_schema(case, media)
            .map_err(|e| format!("{what}: {e}"))?
        else {
            return Ok(());
        };
        let instance: Value = if media.ends_with("json") {
            serde_json::from_str(&answer.body).map_err(|e| format!("{what}: not JSON: {e}"))?
        } else {
            Value::String(answer.body.clone())
        };
        validate(&schema, &instance).map_err(|e| format!("{what}: {e}"))
    }
}

impl Spec {
    /// The headers the description gives the answer are there (`Retry-After` only when a
    /// retry can pass, and `RateLimit` not for a decision taken without Redis, so they may be
    /// missing).
    fn headers(&self, case: &Case, answer: &Answer) -> Result<(), String> {
        let described = &self.doc["paths"][case.route][case.method]["responses"]
            [case.status.to_string()]["headers"];
        let Some(described) = described.as_object() else {
            return Ok(());
        };
        match described.keys().find(|n| {
            let optional = *n == "Retry-After"
                || (*n == "RateLimit" && answer.body.contains("\"without_redis\":true"));
            !optional && answer.header(n).is_none()
        }) {
            Some(name) => Err(format!("header {name} missing")),
            None => Ok(()),
        }
    }
}

/// `instance` against `schema` (JSON Schema 2020-12, as OpenAPI 3.1 uses).
fn validate(schema: &Value, instance: &Value) -> Result<(), String> {
    let validator = jsonschema::draft202012::new(schema).map_err(|e| format!("bad schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn cut(text: &str) -> String {
    text.chars().take(300).collect()
}

/// Send every case; the wrong answers, described.
fn run(spec: &Spec, port: u16, cases: &[Case]) -> Vec<String> {
    let client = Client::new(Duration::from_secs(10));
    let auth = format!("Bearer {TOKEN}");
    let mut wrong = Vec::new();
    for case in cases {
        let mut headers = vec![("content-type", "application/json")];
        if case.token {
            headers.push(("authorization", auth.as_str()));
        }
        let answer = match &case.body {
            None => client.get(port, &case.target, &headers[1..]),
            Some(body) => client.post_with(port, &case.target, &headers, body),
        };
        match answer {
            Ok(answer) => {
                if let Err(e) = spec.check(case, &answer) {
                    wrong.push(e);
                }
            }
            Err(e) => wrong.push(format!("{} {}: no answer: {e}", case.method, case.target)),
        }
    }
    wrong
}

async fn ready(port: u16) {
    wait_for("tally serve ready", Duration::from_secs(20), || {
        http::get(port, "/health/ready").is_some_and(|(code, _)| code == 200)
    })
    .await;
}

fn fetch_spec(port: u16) -> Spec {
    let (code, body) = http::get(port, "/openapi.json").expect("GET /openapi.json");
    assert_eq!(code, 200, "{body}");
    Spec {
        doc: serde_json::from_str(&body).expect("the description is JSON"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_description_names_every_route_and_real_answers_match_it() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let tally = serve(&redis);
    ready(tally.port).await;
    let spec = fetch_spec(tally.port);
    let version = spec.doc["openapi"].as_str().unwrap_or_default();
    assert!(version.starts_with("3.1."), "openapi {version}");
    let described: BTreeSet<&str> = spec.doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        described,
        ROUTES.iter().copied().collect(),
        "routes described"
    );

    let up = cases_redis_up();
    let refused = cases_refused();
    let down = cases_redis_down();
    // Each route: a success and an error at least.
    for route in ROUTES {
        let statuses: BTreeSet<u16> = [&up, &refused, &down]
            .into_iter()
            .flatten()
            .filter(|c| c.route == *route)
            .map(|c| c.status)
            .collect();
        assert!(statuses.contains(&200), "{route}: no success tried");
        if route.starts_with("/v1/") || *route == "/health/ready" {
            assert!(
                statuses.iter().any(|s| *s >= 400),
                "{route}: no error tried"
            );
        }
    }
    // The bodies sent for successes are valid by the description too.
    for case in up.iter().filter(|c| c.status == 200) {
        if let (Some(schema), Some(body)) = (spec.body_schema(case), &case.body) {
            let body: Value = serde_json::from_str(body).unwrap();
            if let Err(e) = validate(&schema, &body) {
                panic!(
                    "{} body {body} is not valid by the description: {e}",
                    case.target
                );
            }
        }
    }
    // Every operation says what it does, and every request body has an example that works: each
    // is sent as written (path parameters filled) and must answer 200 by its schema.
    let mut examples = Vec::new();
    for (path, ops) in spec.doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            for field in ["summary", "description"] {
                assert!(
                    op[field].as_str().is_some_and(|t| !t.is_empty()),
                    "{method} {path}: no {field}"
                );
            }
            let Some(content) = op["requestBody"]["content"].as_object() else {
                continue;
            };
            for (media, body) in content {
                let example = &body["example"];
                assert!(!example.is_null(), "{method} {path} ({media}): no example");
                let target = path
                    .replace(
                        "{name}",
                        if path.contains("locks") {
                            "report"
                        } else {
                            "plays"
                        },
                    )
                    .replace("{action}", "acquire");
                let route = ROUTES.iter().find(|r| *r == path).expect("a route");
                examples.push(cases::post(route, &target, &example.to_string(), 200));
            }
        }
    }
    assert!(
        examples.len() >= 8,
        "request bodies with examples: {}",
        examples.len()
    );
    let mut wrong = run(&spec, tally.port, &examples);
    wrong.extend(run(&spec, tally.port, &up));
    wrong.extend(run(&spec, tally.port, &refused));
    // The answer of a route that does not exist is a problem too.
    let auth = format!("Bearer {TOKEN}");
    let client = Client::new(Duration::from_secs(10));
    let answer = client
        .get(tally.port, "/v1/nothing", &[("authorization", &auth)])
        .unwrap();
    assert_eq!(answer.status, 404);
    let problem = spec.resolvable(&serde_json::json!({ "$ref": "#/components/schemas/Problem" }));
    validate(&problem, &serde_json::from_str(&answer.body).unwrap()).unwrap();
    redis.stop();
    wait_for("not ready without redis", Duration::from_secs(30), || {
        http::get(tally.port, "/health/ready").is_some_and(|(code, _)| code == 503)
    })
    .await;
    wrong.extend(run(&spec, tally.port, &down));
    assert!(
        wrong.is_empty(),
        "{} answers do not match:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The description's limits refuse what the server refuses: a body past a `maximum` or
/// `maxItems` is invalid by the schema as well as answered 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_in_the_description_are_the_servers() {
    let redis = LocalRedis::start(&[]).unwrap();
    let tally = serve(&redis);
    ready(tally.port).await;
    let spec = fetch_spec(tally.port);
    let lock = "/v1/locks/{name}/{action}";
    let policies: Vec<String> = (0..17).map(|i| format!("\"p{i}\"")).collect();
    let policies = format!(r#"{{"policies":[{}],"subject":"s"}}"#, policies.join(","));
    let cases = [
        post(
            "/v1/limit",
            "/v1/limit",
            r#"{"policy":"fixed","subject":"s","cost":1000000001}"#,
            400,
        ),
        post("/v1/limit", "/v1/limit", &policies, 400),
        post(
            "/v1/limit",
            "/v1/limit",
            r#"{"policies":[""],"subject":"s"}"#,
            400,
        ),
        post(lock, "/v1/locks/a/acquire", r#"{"ttl_ms":86400001}"#, 400),
        post(lock, "/v1/locks/a/acquire", r#"{"ttl_ms":0}"#, 400),
        post(lock, "/v1/locks/a/acquire", r#"{"wait_ms":5001}"#, 400),
        post(
            "/v1/hit",
            "/v1/hit",
            r#"{"counter":"","dimensions":{}}"#,
            400,
        ),
        post(
            "/v1/hit",
            "/v1/hit",
            r#"{"counter":"plays","dimensions":{"video":"a"},"surprise":1}"#,
            400,
        ),
    ];
    for case in &cases {
        let schema = spec.body_schema(case).expect("a body schema");
        let body: Value = serde_json::from_str(case.body.as_deref().unwrap()).unwrap();
        assert!(
            validate(&schema, &body).is_err(),
            "{} {body}: valid by the description",
            case.target
        );
    }
    let wrong = run(&spec, tally.port, &cases);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A deferred hit (202) matches the description too: `tally run` on a mock broker, Redis
/// stopped, the hit asks to be deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_hit_matches_the_description() {
    let mut h = crate::common::Harness::with_redis("openapi-defer", 1, &[]);
    let port = free_port().unwrap();
    let mut config = h.config("g-openapi-defer", crate::common::hourly("oad"));
    config.http.listen = format!("127.0.0.1:{port}");
    let running = h.start(config);
    ready(port).await;
    let spec = fetch_spec(port);
    h.redis.stop();
    let hit = r#"{"counter":"flow","dimensions":{"app_id":"a1","device_id":"d1"},"on_redis_error":"defer"}"#;
    let wrong = run(&spec, port, &[post("/v1/hit", "/v1/hit", hit, 202)]);
    running.stop().await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
