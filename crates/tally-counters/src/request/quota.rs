//! Quotas: the first N win (flash sales, limited offers), across any number of callers and
//! replicas, because the check and the increment are one script ([`QUOTA_LUA`]). With once per
//! user, the duplicate check happens before the count, in the same step, so a user retrying never
//! takes a second unit. (The folklore `DECR` then "if negative `INCR` back" oversells under
//! concurrency and loses units when the process dies in between.)

use std::sync::LazyLock;

use serde::Serialize;

use super::expiry::Expiry;
use super::{ints, Client, RequestError};
use crate::script::Script;

/// The take script; see its header.
pub const QUOTA_LUA: &str = concat!(
    include_str!("lua/expiry.lua"),
    include_str!("lua/quota.lua")
);
/// The release script; see its header.
pub const QUOTA_RELEASE_LUA: &str = include_str!("lua/quota_release.lua");
static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new("quota", QUOTA_LUA));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new("quota_release", QUOTA_RELEASE_LUA));

/// The answer to a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum QuotaReply {
    /// Admitted: this caller is number `taken`.
    Admitted {
        /// Units taken so far, this one included.
        taken: u64,
    },
    /// All units are taken.
    SoldOut {
        /// Units taken.
        taken: u64,
    },
    /// This user was admitted before (once per user); nothing was taken now.
    AlreadyTaken {
        /// Units taken.
        taken: u64,
    },
}

/// The largest quota size: [`QUOTA_LUA`] compares sizes as Lua numbers (doubles), exact up to
/// 2^53.
pub const MAX_QUOTA_SIZE: u64 = 1 << 53;

/// One quota of `size` units.
#[derive(Clone)]
pub struct Quota {
    client: Client,
    name: String,
    size: u64,
    once_per_user: bool,
    /// When its state is dropped.
    expiry: Expiry,
}

impl Quota {
    /// Units the quota holds.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// A quota `name` of `size` units; `once_per_user`: a user takes at most one;
    /// `expire_at_ms`: when its state is dropped (Unix ms, e.g. the end of the sale): every key
    /// the request path writes expires.
    pub fn new(
        client: Client,
        name: &str,
        size: u64,
        once_per_user: bool,
        expire_at_ms: i64,
    ) -> Quota {
        Quota {
            client,
            name: name.to_string(),
            size,
            once_per_user,
            expiry: Expiry::At(expire_at_ms),
        }
    }

    /// The same quota, whose state now expires at `expire_at_ms` (Unix ms); each call that writes
    /// moves the expiry there.
    pub fn expiring_at(mut self, expire_at_ms: i64) -> Quota {
        self.expiry = Expiry::At(expire_at_ms);
        self
    }

    /// The same quota, whose state now lives `ttl` after each call that writes, by Redis' clock.
    pub fn expiring_in(mut self, ttl: std::time::Duration) -> Quota {
        self.expiry = Expiry::In(ttl);
        self
    }

    fn keys(&self) -> [String; 2] {
        let prefix = self.client.prefix();
        [
            super::key(prefix, "quota", &self.name, "taken", &self.name),
            super::key(prefix, "quota", &self.name, "users", &self.name),
        ]
    }

    fn user<'a>(&self, user: Option<&'a str>) -> Result<&'a str, RequestError> {
        match (self.once_per_user, user) {
            (true, Some(u)) if !u.is_empty() => Ok(u),
            (true, _) => Err(RequestError::Invalid(format!(
                "quota `{}` is once per user: name the user",
                self.name
            ))),
            (false, _) => Ok(""),
        }
    }

    /// Take one unit (for `user` when once per user).
    pub async fn take(&self, user: Option<&str>) -> Result<QuotaReply, RequestError> {
        let user = self.user(user)?;
        if self.size > MAX_QUOTA_SIZE {
            return Err(RequestError::Invalid(format!(
                "quota `{}`: size {} is above the largest size, {MAX_QUOTA_SIZE} (2^53)",
                self.name, self.size
            )));
        }
        let mut cmd = TAKE.cmd(&self.keys());
        cmd.arg(self.size).arg(user);
        self.expiry.push(&mut cmd);
        let reply: redis::Value = self.client.run(&TAKE, &cmd).await?;
        match ints("quota", &reply)?.as_slice() {
            [1, n] => Ok(QuotaReply::Admitted { taken: *n as u64 }),
            [0, n] => Ok(QuotaReply::SoldOut { taken: *n as u64 }),
            [2, n] => Ok(QuotaReply::AlreadyTaken { taken: *n as u64 }),
            _ => Err(RequestError::Reply {
                script: "quota",
                detail: format!("{reply:?}"),
            }),
        }
    }

    /// Give one unit back (`user`'s, when once per user). Returns whether one was returned.
    pub async fn release(&self, user: Option<&str>) -> Result<bool, RequestError> {
        let user = self.user(user)?;
        let mut cmd = RELEASE.cmd(&self.keys());
        cmd.arg(user);
        let reply: redis::Value = self.client.run(&RELEASE, &cmd).await?;
        match ints("quota_release", &reply)?.as_slice() {
            [released, _] => Ok(*released == 1),
            _ => Err(RequestError::Reply {
                script: "quota_release",
                detail: format!("{reply:?}"),
            }),
        }
    }

    /// Units taken so far.
    pub async fn peek(&self) -> Result<u64, RequestError> {
        let taken: Option<u64> = self
            .client
            .query(redis::cmd("GET").arg(&self.keys()[0]))
            .await?;
        Ok(taken.unwrap_or(0))
    }

    /// Forget every take.
    pub async fn reset(&self) -> Result<(), RequestError> {
        let _: i64 = self
            .client
            .write(redis::cmd("DEL").arg(&self.keys()[..]))
            .await?;
        Ok(())
    }
}
