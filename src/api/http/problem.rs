//! One error format for every 4xx and 5xx answer: RFC 9457 problem details
//! (`application/problem+json`): `type`, `title`, `status`, `detail`, the offending `field` where
//! there is one, and a `request_id`. Details of bad input quote the caller's own input; internal
//! text (Redis messages, script hashes, Rust type names) never reaches an answer: it goes to the
//! log under the same request id.
//!
//! [`Body`] is the JSON body extractor of every `/v1` route: it takes JSON whatever the content
//! type says (`curl -d` sends a form type), and its errors are problems naming the field.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tally_counters::request::RequestError;
use utoipa::ToSchema;

use crate::api::query::QueryError;

/// What went wrong, as a problem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The request cannot be used as sent (400).
    InvalidInput,
    /// `/v1` needs the bearer token (401).
    Unauthorized,
    /// The call needs the admin token, and another one was sent (403).
    Forbidden,
    /// No such route, or the route is not enabled (404).
    NotFound,
    /// The route does not take this method (405).
    MethodNotAllowed,
    /// The body is larger than the route takes (413).
    PayloadTooLarge,
    /// The request contradicts one made before (409).
    Conflict,
    /// Redis could not be reached or answered with an error (503).
    RedisUnavailable,
    /// Redis answered something its script's contract does not allow (502).
    BadReply,
    /// A hit was sent to Redis but no answer came: it may have been counted (503).
    OutcomeUnknown,
    /// The request took longer than `http.request_timeout` (503).
    Timeout,
    /// The write did not reach the replicas the durability level asks for in time: not an
    /// admission, a failover could undo it (503).
    NotReplicated,
}

impl ProblemKind {
    fn describe(self) -> (StatusCode, &'static str, &'static str) {
        use StatusCode as S;
        match self {
            ProblemKind::InvalidInput => (S::BAD_REQUEST, "invalid-input", "Invalid input"),
            ProblemKind::Unauthorized => (S::UNAUTHORIZED, "unauthorized", "Bearer token required"),
            ProblemKind::Forbidden => (S::FORBIDDEN, "forbidden", "Admin token required"),
            ProblemKind::NotFound => (S::NOT_FOUND, "not-found", "Not found"),
            ProblemKind::MethodNotAllowed => (
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ProblemKind::PayloadTooLarge => {
                (S::PAYLOAD_TOO_LARGE, "payload-too-large", "Body too large")
            }
            ProblemKind::Conflict => (S::CONFLICT, "conflict", "Conflict"),
            ProblemKind::RedisUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "redis-unavailable",
                "Redis is unavailable",
            ),
            ProblemKind::BadReply => (S::BAD_GATEWAY, "bad-reply", "Unexpected reply from Redis"),
            ProblemKind::OutcomeUnknown => {
                (S::SERVICE_UNAVAILABLE, "outcome-unknown", "Outcome unknown")
            }
            ProblemKind::Timeout => (S::SERVICE_UNAVAILABLE, "timeout", "Request timed out"),
            ProblemKind::NotReplicated => {
                (S::SERVICE_UNAVAILABLE, "not-replicated", "Not replicated")
            }
        }
    }
}

/// One problem answer.
#[derive(Debug)]
pub struct Problem {
    kind: ProblemKind,
    /// For the caller: what to change (quotes only the caller's input).
    detail: String,
    /// The body field (JSON path) or parameter the problem is about.
    field: Option<String>,
    /// For the log only: what happened inside.
    internal: Option<String>,
}

/// Request ids: unique within a process, and unlikely to repeat across restarts.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn request_id() -> String {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let start = *START;
    format!("{start:08x}-{n:x}")
}

static START: std::sync::LazyLock<u32> =
    std::sync::LazyLock::new(|| tally_counters::clock::unix_secs() as u32);

impl Problem {
    /// A problem of `kind` with `detail` for the caller.
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            detail: detail.into(),
            field: None,
            internal: None,
        }
    }

    /// Bad input in `field`.
    pub fn invalid(field: &str, detail: impl Into<String>) -> Problem {
        Problem::new(ProblemKind::InvalidInput, detail).field(field)
    }

    /// Name the field the problem is about.
    pub fn field(mut self, field: impl Into<String>) -> Problem {
        self.field = Some(field.into());
        self
    }

    fn internal(mut self, text: String) -> Problem {
        self.internal = Some(text);
        self
    }

    /// Where a request-path error leads.
    pub fn from_request(e: RequestError) -> Problem {
        use tally_counters::model::LookupError;
        match e {
            RequestError::Invalid(detail) => Problem::new(ProblemKind::InvalidInput, detail),
            RequestError::InvalidField { field, detail } => Problem::invalid(field, detail),
            RequestError::Conflict(detail) => {
                Problem::new(ProblemKind::Conflict, detail).field("idempotency_key")
            }
            RequestError::Overflow { counter, delta } => Problem::invalid(
                "value",
                format!(
                    "adding {delta} to counter `{counter}` would leave the signed 64-bit range \
                     ({}..={}); nothing was added",
                    i64::MIN,
                    i64::MAX
                ),
            ),
            e @ RequestError::NotReplicated { .. } => {
                Problem::new(ProblemKind::NotReplicated, e.to_string())
            }
            e @ RequestError::AboveMax { .. } => {
                Problem::new(ProblemKind::Forbidden, e.to_string()).field("value")
            }
            RequestError::Lookup(l) => {
                let field = match &l {
                    LookupError::UnknownCounter(_) => "counter",
                    LookupError::MissingDimension(_) | LookupError::UnknownDimension { .. } => {
                        "dimensions"
                    }
                    LookupError::TimeOutOfRange { .. } => "at",
                };
                Problem::invalid(field, l.to_string())
            }
            RequestError::Redis(r) | RequestError::Unreachable(r) => Problem::redis(r.to_string()),
            RequestError::OutcomeUnknown(r) => {
                let cause = if r.is_timeout() {
                    "Redis did not answer within redis.response_timeout"
                } else {
                    "the connection to Redis was lost before it answered"
                };
                Problem::new(
                    ProblemKind::OutcomeUnknown,
                    format!(
                        "{cause}: the request may or may not have taken effect (a hit counted, a \
                         unit taken, an item given, a lease acquired); a hit retried with the same \
                         idempotency_key counts once, other retries may take effect twice"
                    ),
                )
                .internal(r.to_string())
            }
            RequestError::Reply { script, detail } => Problem::new(
                ProblemKind::BadReply,
                "Redis answered what tally cannot read; see the log",
            )
            .internal(format!("{script}: {detail}")),
        }
    }

    /// Where a query error leads.
    pub fn from_query(e: QueryError) -> Problem {
        match e {
            QueryError::Redis(r) => Problem::redis(r.to_string()),
            QueryError::BadTime(_) => Problem::invalid("at", e.to_string()),
            QueryError::BadRange { field, detail } => Problem::invalid(field, detail),
            QueryError::Lookup(_) => Problem::new(ProblemKind::InvalidInput, e.to_string()),
        }
    }

    fn redis(internal: String) -> Problem {
        Problem::new(
            ProblemKind::RedisUnavailable,
            "Redis is unavailable; retry later",
        )
        .internal(internal)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.kind.describe();
        let id = request_id();
        if let Some(internal) = &self.internal {
            tracing::warn!(request_id = %id, status = status.as_u16(), error = %internal, "request failed");
        }
        let body = ProblemBody {
            r#type: format!("https://tally.dev/problems/{slug}"),
            title,
            status: status.as_u16(),
            detail: self.detail,
            field: self.field,
            request_id: id,
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

/// The body of every error answer (RFC 9457), as `/openapi.json` describes it.
#[derive(Serialize, ToSchema)]
#[schema(as = Problem)]
pub struct ProblemBody {
    /// What went wrong, a URI per kind (`…/problems/invalid-input`, `…/redis-unavailable`).
    r#type: String,
    /// The kind in words, the same for every problem of one type.
    title: &'static str,
    /// The HTTP status, repeated.
    status: u16,
    /// For the caller: what to change (it quotes only the caller's input).
    detail: String,
    /// The body field (a JSON path such as `policies[1]`) or parameter the problem is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    /// Names this answer in tally's log, where what happened inside is written.
    request_id: String,
}

/// A JSON body of type `T`, read whatever the content type; errors are problems naming the
/// field (a JSON path such as `policies[2]`).
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Problem::new(
                    ProblemKind::PayloadTooLarge,
                    "the body is larger than this route takes",
                )
            } else {
                Problem::new(ProblemKind::InvalidInput, "the body could not be read")
            }
        })?;
        // serde reads a struct from an array too, by position: `["flash","u1"]` would take a
        // quota unit. Every body of this API is an object, and the schema says so.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(Problem::new(
                ProblemKind::InvalidInput,
                "body: must be a JSON object, not an array",
            ));
        }
        parse(&bytes).map(Body)
    }
}

/// `bytes` as a `T`, or a problem naming where it is wrong.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let detail = plain(&e.into_inner().to_string());
        let problem = Problem::new(ProblemKind::InvalidInput, format!("body: {detail}"));
        if path == "." || path == "?" {
            problem
        } else {
            problem.field(path)
        }
    })?;
    de.end()
        .map_err(|_| Problem::new(ProblemKind::InvalidInput, "body: text after the JSON value"))?;
    Ok(value)
}

/// serde's message in the caller's words: JSON types instead of Rust ones.
fn plain(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for word in message.split_inclusive([' ', ',']) {
        let (core, tail) = word.split_at(word.trim_end_matches([' ', ',']).len());
        let core = match core {
            "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer",
            "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer",
            "f32" | "f64" => "a number",
            other => other,
        };
        out.push_str(core);
        out.push_str(tail);
    }
    // `expected struct HitBody` and the like.
    match out.find("struct ") {
        Some(at) => {
            let end = out[at + 7..]
                .find(|c: char| !c.is_alphanumeric() && c != '_')
                .map_or(out.len(), |e| at + 7 + e);
            out.replace_range(at..end, "a JSON object");
            out
        }
        None => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        cost: u64,
        #[serde(default)]
        policies: Vec<String>,
    }

    #[test]
    fn errors_name_the_field_in_json_terms() {
        let p = parse::<Sample>(br#"{"cost": "x"}"#).unwrap_err();
        assert_eq!(p.field.as_deref(), Some("cost"));
        assert!(p.detail.contains("a non-negative integer"), "{}", p.detail);
        assert!(!p.detail.contains("u64"), "{}", p.detail);
        let p = parse::<Sample>(br#"{"cost": 1, "policies": ["a", 5]}"#).unwrap_err();
        assert_eq!(p.field.as_deref(), Some("policies[1]"));
        let p = parse::<Sample>(br#""text""#).unwrap_err();
        assert!(p.detail.contains("a JSON object"), "{}", p.detail);
        assert!(!p.detail.contains("Sample"), "{}", p.detail);
        assert!(parse::<Sample>(br#"{"cost": 1} x"#).is_err());
        assert!(parse::<Sample>(br#"{"cost": -1}"#).is_err());
        assert!(parse::<Sample>(br#"{"cost": 1.5}"#).is_err());
        assert_eq!(parse::<Sample>(br#"{"cost": 7}"#).unwrap().cost, 7);
    }

    #[test]
    fn deep_nesting_is_bad_input_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parse::<Sample>(deep.as_bytes()).is_err());
    }
}
