//! `POST /v1/locks/{name}/acquire|release|extend`: leases with fencing tokens over HTTP. Every
//! call needs the admin scope (`http.admin_token`, when set); names of tally's own jobs
//! (`job:…`) are refused, leases are capped at `MAX_LOCK_TTL_MS` and an acquire waits no longer
//! than the request may take.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use serde::{Deserialize, Serialize};
use tally_counters::lock::Lease;
use tally_counters::request::RequestError;
use utoipa::ToSchema;

use super::auth::Scope;
use super::problem::{Body, Problem};
use super::request::{named, reply, MAX_BODY, MAX_LOCK_TTL_MS};
use crate::api::primitives::Primitives;

/// `POST /v1/locks/{name}/{action}`: the lease's numbers and token.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LockBody {
    /// Lease length, ms (acquire, extend): 1 ms to a day (`MAX_LOCK_TTL_MS`).
    #[serde(default = "ten_seconds")]
    #[schema(default = 10000, minimum = 1, maximum = 86400000)]
    ttl_ms: u64,
    /// How long to wait for the lock, ms (acquire): at most 5 s (`MAX_LOCK_WAIT_MS`), and at
    /// most `http.request_timeout` less `redis.response_timeout`, so the answer (a lease taken
    /// by the last try included) comes within `http.request_timeout`.
    #[serde(default)]
    #[schema(default = 0, maximum = 5000)]
    wait_ms: u64,
    /// The holder's token (release, extend).
    token: Option<String>,
}

fn ten_seconds() -> u64 {
    10_000
}

/// Longest wait an HTTP acquire may ask for: it must answer within `http.request_timeout`.
pub const MAX_LOCK_WAIT_MS: u64 = 5_000;

/// A lock call's name and numbers, checked: a name that is not empty and not one of tally's own
/// jobs' (`job:…`), a lease of 1 ms to `MAX_LOCK_TTL_MS`, a wait of at most `MAX_LOCK_WAIT_MS`.
fn lock_input(name: &str, b: &LockBody) -> Result<(), Problem> {
    named("name", name)?;
    if name.starts_with("job:") {
        return Err(Problem::invalid(
            "name",
            "lock names starting with `job:` are reserved for tally's jobs",
        ));
    }
    if !(1..=MAX_LOCK_TTL_MS).contains(&b.ttl_ms) {
        return Err(Problem::invalid(
            "ttl_ms",
            format!("ttl_ms must be 1 to {MAX_LOCK_TTL_MS} (got {})", b.ttl_ms),
        ));
    }
    if b.wait_ms > MAX_LOCK_WAIT_MS {
        return Err(Problem::invalid(
            "wait_ms",
            format!(
                "wait_ms must be at most {MAX_LOCK_WAIT_MS} (got {})",
                b.wait_ms
            ),
        ));
    }
    Ok(())
}

/// The answer of a lock call.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum LockAnswer {
    /// Acquire: the lock is this caller's.
    Acquired {
        /// Always true.
        acquired: bool,
        /// The lease: its token releases and extends it, its fence guards the resource.
        lease: Lease,
    },
    /// Acquire: another holder has it.
    Busy {
        /// Always false.
        acquired: bool,
        /// How long the holder's lease still runs, ms.
        held_for_ms: i64,
    },
    /// Release: whether this token held the lock (false: it had expired or was another's).
    Released {
        /// The lease was released.
        released: bool,
    },
    /// Extend: whether this token still held the lock.
    Extended {
        /// The lease was extended.
        extended: bool,
    },
}

/// The lock routes over `requests`.
pub fn routes<S: Clone + Send + Sync + 'static>(requests: Arc<Primitives>) -> Router<S> {
    Router::new()
        .route("/v1/locks/{name}/{action}", post(lock))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(requests)
}

/// `POST /v1/locks/{name}/acquire|release|extend`.
pub(super) async fn lock(
    State(r): State<Arc<Primitives>>,
    axum::extract::Path((name, action)): axum::extract::Path<(String, String)>,
    Extension(scope): Extension<Scope>,
    Body(b): Body<LockBody>,
) -> Response {
    use std::time::Duration;
    if let Some(answer) = scope.refusal("a lock call") {
        return answer;
    }
    if let Err(p) = lock_input(&name, &b) {
        return p.into_response();
    }
    let locks = r.locks();
    let ttl = Duration::from_millis(b.ttl_ms);
    let token = || {
        b.token
            .as_deref()
            .ok_or_else(|| RequestError::InvalidField {
                field: "token",
                detail: "give the lease's token".into(),
            })
    };
    let result = match action.as_str() {
        "acquire" => {
            let wait = r.lock_wait(Duration::from_millis(b.wait_ms));
            match locks.acquire(&name, ttl, wait).await {
                Ok(Ok(lease)) => Ok(LockAnswer::Acquired {
                    acquired: true,
                    lease,
                }),
                Ok(Err(busy)) => Ok(LockAnswer::Busy {
                    acquired: false,
                    held_for_ms: busy.held_for_ms,
                }),
                Err(e) => Err(e),
            }
        }
        "release" => match token() {
            Ok(t) => locks
                .release(&Lease::known(locks, &name, t))
                .await
                .map(|released| LockAnswer::Released { released }),
            Err(e) => Err(e),
        },
        "extend" => match token() {
            Ok(t) => locks
                .extend(&Lease::known(locks, &name, t), ttl)
                .await
                .map(|extended| LockAnswer::Extended { extended }),
            Err(e) => Err(e),
        },
        other => Err(RequestError::Invalid(format!(
            "`{other}`: use acquire, release or extend"
        ))),
    };
    reply(result)
}
