//! Rate limits, decided on Redis server time in one atomic script ([`LIMIT_LUA`]) for any number
//! of policies of one subject (all its keys share a hash tag).
//!
//! Every algorithm counts before it adds: a request is recorded only when every enforcing policy
//! admits it, so a denied request costs nothing and `limit + 1` never passes. (The folklore
//! sorted-set limiter runs ZADD then ZCARD and lets a burst through: each caller sees its own
//! entry counted, or denied requests fill the log.)
//!
//! | algorithm | state per subject | exactness |
//! |---|---|---|
//! | `fixed` | a hash {window, count} | exact per aligned window; up to 2 × limit across a boundary |
//! | `sliding_log` | a sorted set, one entry per admitted unit | exact over every sliding window; memory ∝ limit |
//! | `sliding_counter` | a hash of two window counts | approximate: weights the previous window linearly; never more than `limit` per aligned window, at most 2 × limit in a sliding window when the previous window's traffic was all at its end; exact for uniform traffic |
//! | `gcra` | one timestamp | exact: one unit per `window / limit`, bursts up to `burst` |

use std::collections::HashMap;
use std::sync::LazyLock;

use serde::Serialize;

mod call;
mod protocol;
mod reply;
mod reserve;

pub use reserve::{
    unsupported as unsupported_for_reservations, Phase, Reservation, Settled, MAX_RESERVATION,
};

use super::batch::ScriptPair;
pub use super::policy::{Algorithm, FailureMode, LimitPolicy, PolicyError, MAX_LOG_COST};
use super::{Client, RequestError};
use crate::script::Script;
use call::{read_reply, LimitCall, MergedAsks};
#[cfg(test)]
use reply::{LimitReply, PolicyReply};

/// The limit script; see its header for the contract.
pub const LIMIT_LUA: &str = concat!(
    include_str!("../lua/refund.lua"),
    include_str!("../lua/reserve.lua"),
    include_str!("../lua/limit.lua"),
    include_str!("../lua/single.lua")
);
/// Several callers' limit decisions in one call (group commit: `batch.rs`, `lua/batch.lua`).
pub const LIMIT_BATCH_LUA: &str = concat!(
    include_str!("../lua/refund.lua"),
    include_str!("../lua/reserve.lua"),
    include_str!("../lua/limit.lua"),
    include_str!("../lua/batch.lua")
);
static LIMIT: LazyLock<ScriptPair> = LazyLock::new(|| ScriptPair {
    single: Script::new("limit", LIMIT_LUA),
    batch: Script::new("limit_batch", LIMIT_BATCH_LUA),
});

/// One policy's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyVerdict {
    /// Policy name.
    pub policy: String,
    /// This policy admits the request.
    pub allowed: bool,
    /// Units still available now (after this request, if admitted).
    pub remaining: u64,
    /// Milliseconds until the policy's window resets (or its state drains).
    pub reset_ms: u64,
    /// When denied: milliseconds until a retry of the same cost can pass; `None` if it never can
    /// (cost above the limit) or when allowed.
    pub retry_after_ms: Option<u64>,
    /// The policy is in shadow mode: its denial was not enforced.
    pub shadow: bool,
    /// The policy's limit and window, for `RateLimit-Policy`.
    pub limit: u64,
    /// Window length, ms.
    pub window_ms: u64,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Decision {
    /// The request may proceed.
    pub admitted: bool,
    /// Per policy, in the order asked.
    pub policies: Vec<PolicyVerdict>,
    /// Redis could not be asked: decided by each policy's `on_redis_error`.
    pub without_redis: bool,
    /// Redis server time of the decision, Unix ms (0 without Redis).
    pub now_ms: i64,
}

impl Decision {
    /// When denied: the longest wait any enforcing, denying policy asks for (ms); `None` if one
    /// can never admit this cost, or when admitted.
    pub fn retry_after_ms(&self) -> Option<u64> {
        if self.admitted {
            return None;
        }
        let mut wait = 0;
        for v in self.policies.iter().filter(|v| !v.allowed && !v.shadow) {
            wait = wait.max(v.retry_after_ms?);
        }
        Some(wait)
    }

    /// IETF `RateLimit-Policy` and `RateLimit` field values (draft-ietf-httpapi-ratelimit-headers):
    /// `"name";q=limit;w=seconds` and `"name";r=remaining;t=seconds`, one item per policy.
    pub fn headers(&self) -> (String, String) {
        use std::fmt::Write as _;
        let secs = |ms: u64| ms.div_ceil(1000);
        // One buffer per field (not a string per policy joined after: this is on every
        // decision's path).
        let mut policy = String::with_capacity(32 * self.policies.len());
        let mut state = String::with_capacity(32 * self.policies.len());
        for (i, v) in self.policies.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(
                policy,
                "{sep}\"{}\";q={};w={}",
                v.policy,
                v.limit,
                secs(v.window_ms)
            );
            let _ = write!(
                state,
                "{sep}\"{}\";r={};t={}",
                v.policy,
                v.remaining,
                secs(v.reset_ms)
            );
        }
        (policy, state)
    }
}

/// Named policies over one connection.
#[derive(Clone)]
pub struct RateLimiter {
    client: Client,
    policies: HashMap<String, LimitPolicy>,
}

impl RateLimiter {
    /// A limiter with `policies` (validated here).
    pub fn new(client: Client, policies: Vec<LimitPolicy>) -> Result<RateLimiter, RequestError> {
        let mut map = HashMap::new();
        for p in policies {
            p.validate()
                .map_err(|e| RequestError::Invalid(format!("limit `{}`: {e}", p.name)))?;
            if map.insert(p.name.clone(), p).is_some() {
                return Err(RequestError::Invalid("two limits share a name".into()));
            }
        }
        Ok(RateLimiter {
            client,
            policies: map,
        })
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Result<&LimitPolicy, RequestError> {
        self.policies
            .get(name)
            .ok_or_else(|| RequestError::Invalid(format!("unknown limit `{name}`")))
    }

    /// Decide a request of `cost` units by `subject` against `policies`, all at once; record it
    /// if admitted. Without Redis, each policy answers by its `on_redis_error`.
    pub async fn check(
        &self,
        policies: &[&str],
        subject: &str,
        cost: u64,
    ) -> Result<Decision, RequestError> {
        self.call(policies, subject, cost, "apply").await
    }

    /// What [`RateLimiter::check`] would decide, without recording anything.
    pub async fn peek(
        &self,
        policies: &[&str],
        subject: &str,
        cost: u64,
    ) -> Result<Decision, RequestError> {
        self.call(policies, subject, cost, "peek").await
    }

    /// Forget `subject`'s state under `policies`.
    pub async fn reset(&self, policies: &[&str], subject: &str) -> Result<(), RequestError> {
        let chosen = self.chosen(policies)?;
        let mut del = redis::cmd("DEL");
        for p in &chosen {
            del.arg(self.key(p, subject));
        }
        let _: i64 = self.client.write(&del).await?;
        Ok(())
    }

    fn chosen(&self, policies: &[&str]) -> Result<Vec<&LimitPolicy>, RequestError> {
        if policies.is_empty() {
            return Err(RequestError::Invalid("name at least one limit".into()));
        }
        policies.iter().map(|n| self.policy(n)).collect()
    }

    fn key(&self, policy: &LimitPolicy, subject: &str) -> String {
        super::key(
            self.client.prefix(),
            policy.algorithm.key_kind(),
            &policy.name,
            subject,
            subject,
        )
    }

    async fn call(
        &self,
        policies: &[&str],
        subject: &str,
        cost: u64,
        mode: &str,
    ) -> Result<Decision, RequestError> {
        let chosen = self.chosen(policies)?;
        if cost == 0 {
            return Err(RequestError::Invalid("cost 0 is out of range".into()));
        }
        let asks: Vec<Ask> = chosen
            .iter()
            .map(|&policy| Ask {
                policy,
                subject,
                cost,
                usage: false,
                quota: false,
                reservation: None,
                refund: false,
            })
            .collect();
        decide(&self.client, &asks, subject, mode == "peek").await
    }
}

/// One policy's part in a [`decide`] call.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The policy.
    pub policy: &'a LimitPolicy,
    /// Whose state: the policy's key is made of its name and this.
    pub subject: &'a str,
    /// Units to charge; 0 checks that one unit is left and records nothing.
    pub cost: u64,
    /// Usage-priced: a cost above 0 is a charge for what was already used, recorded whatever
    /// is left and never denied (check-then-charge); a cost of 0 is decided as usual.
    pub usage: bool,
    /// A quota (envoyproxy/ratelimit's `quota_mode`): out of room, it does not deny the call by
    /// itself; the call is denied when every quota ask of it is out of room. An admitted call
    /// charges only the quotas that had room, so a quota is never counted past its limit.
    pub quota: bool,
    /// Reserve → settle (fixed windows only): see [`Reservation`]. Not a quota.
    pub reservation: Option<Reservation<'a>>,
    /// A refund (Envoy's `is_negative_hits`): `cost` units given back to the policy's current
    /// state (never below empty), never denied, applied whatever the other asks decide
    /// (`lua/refund.lua`). Not with a reservation (a settle refunds there).
    pub refund: bool,
}

/// Decide `asks` in one atomic script call: admitted only if every enforcing policy admits its
/// cost (and, when some asks are quotas, at least one quota does), and recorded only then. Every key is tagged by `tag` (in a cluster, one slot holds
/// every key a call can touch). Two asks on one key (one policy, one subject) are decided as
/// one, with their costs summed, so a key is never counted twice against one reading. Without
/// Redis, each policy answers by its `on_redis_error`.
pub async fn decide(
    client: &Client,
    asks: &[Ask<'_>],
    tag: &str,
    peek: bool,
) -> Result<Decision, RequestError> {
    decide_settling(client, asks, tag, peek)
        .await
        .map(|(d, _)| d)
}

/// [`decide`], with what each ask's settle did (`None` for an ask that is not a settle, and
/// for every ask when Redis could not be asked or on a peek).
pub async fn decide_settling(
    client: &Client,
    asks: &[Ask<'_>],
    tag: &str,
    peek: bool,
) -> Result<(Decision, Vec<Option<Settled>>), RequestError> {
    if asks.is_empty() {
        return Err(RequestError::Invalid("name at least one limit".into()));
    }
    let mut merged = MergedAsks::of(client, asks, tag)?;
    let keys = std::mem::take(&mut merged.keys);
    let call = LimitCall::new(client, &merged.asks, keys, tag, peek);
    let client = merged.durable(client);
    let entries = call.keys.len();
    let reply: redis::Value = match client.run_batched(&LIMIT, call.keys, call.cmd).await {
        Ok(v) => v,
        Err(e) if e.is_unavailable() => return Ok((without_redis(asks), vec![None; asks.len()])),
        Err(e) => return Err(e),
    };
    read_reply(&reply, entries, &call.at, asks, &merged, peek)
}

fn without_redis(asks: &[Ask]) -> Decision {
    let policies: Vec<PolicyVerdict> = asks
        .iter()
        .map(|a| {
            let p = a.policy;
            let allowed = p.on_redis_error == FailureMode::Open;
            PolicyVerdict {
                policy: p.name.clone(),
                allowed,
                remaining: 0,
                reset_ms: 0,
                retry_after_ms: (!allowed).then_some(1000),
                shadow: p.shadow,
                limit: p.limit,
                window_ms: p.window_ms(),
            }
        })
        .collect();
    // As the script decides: quotas deny only all together.
    let passes = |(_, v): (&Ask, &PolicyVerdict)| v.allowed || v.shadow;
    let both = || asks.iter().zip(&policies);
    let quota_open = both().filter(|(a, _)| a.quota).any(passes) || !asks.iter().any(|a| a.quota);
    Decision {
        admitted: quota_open && both().filter(|(a, _)| !a.quota).all(passes),
        policies,
        without_redis: true,
        // The host's time: Redis', which every other answer carries, is not to be had.
        now_ms: crate::clock::unix_ms(),
    }
}

/// A unique id for a request's sliding-log entries (128 random bits).
fn request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests;
