//! The limit script's reply, parsed into types beside the script that returns it
//! (`lua/limit.lua`).

use super::{LimitPolicy, PolicyVerdict};
use crate::request::RequestError;

/// What `limit.lua` answers: `{admitted, now, then per policy: allowed, remaining, reset,
/// retry}` (see `decide` in the script).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct LimitReply {
    /// 1 when every policy (but shadow ones) allowed the call, which was then charged.
    pub(super) admitted: bool,
    /// Redis' clock (ms) at the decision.
    pub(super) now_ms: i64,
    /// One per distinct policy, in call order.
    pub(super) policies: Vec<PolicyReply>,
}

/// One policy's part of a [`LimitReply`].
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PolicyReply {
    pub(super) allowed: bool,
    /// Calls (or cost) left in the window; negative values mean none.
    pub(super) remaining: i64,
    /// Until the window (or the bucket) resets, ms.
    pub(super) reset_ms: i64,
    /// When denied: how long until a retry can succeed, ms; negative: never within the window.
    pub(super) retry_ms: i64,
}

impl LimitReply {
    /// Parse a reply for `policies` distinct policies; any other shape is an error.
    pub(super) fn parse(reply: &redis::Value, policies: usize) -> Result<LimitReply, RequestError> {
        let bad = || RequestError::Reply {
            script: "limit",
            detail: format!("{reply:?}"),
        };
        // Read in place (one allocation, the verdicts: this is on every decision's path).
        let redis::Value::Array(items) = reply else {
            return Err(bad());
        };
        if items.len() != 2 + 4 * policies {
            return Err(bad());
        }
        let int = |i: usize| crate::script::int(&items[i]).map_err(|_| bad());
        let mut verdicts = Vec::with_capacity(policies);
        for p in 0..policies {
            let at = 2 + 4 * p;
            verdicts.push(PolicyReply {
                allowed: int(at)? == 1,
                remaining: int(at + 1)?,
                reset_ms: int(at + 2)?,
                retry_ms: int(at + 3)?,
            });
        }
        Ok(LimitReply {
            admitted: int(0)? == 1,
            now_ms: int(1)?,
            policies: verdicts,
        })
    }
}

impl PolicyReply {
    /// The verdict of policy `p`.
    pub(super) fn verdict(&self, p: &LimitPolicy) -> PolicyVerdict {
        PolicyVerdict {
            policy: p.name.clone(),
            allowed: self.allowed,
            remaining: self.remaining.max(0) as u64,
            reset_ms: self.reset_ms.max(0) as u64,
            retry_after_ms: (!self.allowed && self.retry_ms >= 0).then_some(self.retry_ms as u64),
            shadow: p.shadow,
            limit: p.limit,
            window_ms: p.window_ms(),
        }
    }
}
