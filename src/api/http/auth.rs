//! Who may call `/v1`: the bearer token (`http.token`) for every route, and the admin token
//! (`http.admin_token`), when it is set, for what destroys or hands out state: `reset` on any
//! primitive, a hit of `value` <= 0 or one that takes a counter past `http.max_value`, quota
//! `release`, pool `fill`, and every `/v1/locks` call. The check itself is the
//! edge's ([`crate::api::edge::auth`]), shared with the RLS port.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::{Problem, ProblemKind};
use crate::api::edge::auth::{self, Access};
use crate::config::Tokens;

/// What the caller may do, found by [`authorize`] and read by the handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Count, decide, peek, acquire nothing destructive.
    Caller {
        /// Whether an `Authorization` header was sent (decides 401 or 403).
        sent_credentials: bool,
        /// The magnitude a hit may bring a counter to (`http.max_value`).
        max_value: i64,
    },
    /// Also reset, release, fill and locks.
    Admin,
}

impl Scope {
    /// The bound of a hit of this scope ([`tally_counters::request::Hit::max_value`]): None
    /// for the admin.
    pub fn max_value(self) -> Option<i64> {
        match self {
            Scope::Caller { max_value, .. } => Some(max_value),
            Scope::Admin => None,
        }
    }

    /// `None` when this scope may do `what`; else the answer to give instead (401 without
    /// credentials, 403 with the wrong ones).
    pub fn refusal(self, what: &str) -> Option<Response> {
        let Scope::Caller {
            sent_credentials, ..
        } = self
        else {
            return None;
        };
        let detail = format!("{what} needs the admin token (http.admin_token)");
        Some(if sent_credentials {
            Problem::new(ProblemKind::Forbidden, detail).into_response()
        } else {
            unauthorized(Problem::new(ProblemKind::Unauthorized, detail))
        })
    }
}

/// What [`authorize`] checks callers against.
pub struct Gate {
    pub tokens: Tokens,
    /// `http.max_value`, the bound of callers without the admin scope.
    pub max_value: i64,
}

/// Check the bearer token (401 when it is needed and wrong) and record the caller's [`Scope`]
/// for the handler.
pub async fn authorize(
    State(gate): State<Arc<Gate>>,
    mut request: Request,
    next: Next,
) -> Response {
    let scope = match auth::check(&gate.tokens, request.headers()) {
        Access::Denied => {
            return unauthorized(Problem::new(
                ProblemKind::Unauthorized,
                "missing or wrong bearer token",
            ))
        }
        Access::Caller { sent_credentials } => Scope::Caller {
            sent_credentials,
            max_value: gate.max_value,
        },
        Access::Admin => Scope::Admin,
    };
    request.extensions_mut().insert(scope);
    next.run(request).await
}

/// A 401 with `WWW-Authenticate: Bearer`.
pub fn unauthorized(problem: Problem) -> Response {
    let mut response = problem.into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}
