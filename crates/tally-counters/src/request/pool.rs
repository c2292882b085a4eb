//! Pools: distinct items from a prepared list (coupon codes, prizes), at most one per user, none
//! twice, until empty ([`POOL_LUA`]: the pop and the user's record are one step).

use std::sync::LazyLock;

use serde::Serialize;

use super::expiry::Expiry;
use super::{Client, RequestError};
use crate::script::Script;

/// The claim script; see its header.
pub const POOL_LUA: &str = concat!(include_str!("lua/expiry.lua"), include_str!("lua/pool.lua"));
/// The fill script; see its header.
pub const POOL_FILL_LUA: &str = concat!(
    include_str!("lua/expiry.lua"),
    include_str!("lua/pool_fill.lua")
);
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new("pool", POOL_LUA));
static FILL: LazyLock<Script> = LazyLock::new(|| Script::new("pool_fill", POOL_FILL_LUA));

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Claim {
    /// This item is the user's, given now.
    Given {
        /// The item.
        item: String,
    },
    /// The user was given this item before.
    AlreadyGiven {
        /// The item.
        item: String,
    },
    /// No item is left.
    Empty,
}

/// One pool of items.
#[derive(Clone)]
pub struct Pool {
    client: Client,
    name: String,
    /// When its state is dropped.
    expiry: Expiry,
}

impl Pool {
    /// Pool `name`; `expire_at_ms`: when its state is dropped (Unix ms): every key the request
    /// path writes expires.
    pub fn new(client: Client, name: &str, expire_at_ms: i64) -> Pool {
        Pool {
            client,
            name: name.to_string(),
            expiry: Expiry::At(expire_at_ms),
        }
    }

    /// The same pool, whose state now expires at `expire_at_ms` (Unix ms); each call that writes
    /// moves the expiry there.
    pub fn expiring_at(mut self, expire_at_ms: i64) -> Pool {
        self.expiry = Expiry::At(expire_at_ms);
        self
    }

    /// The same pool, whose state now lives `ttl` after each call that writes, by Redis' clock.
    pub fn expiring_in(mut self, ttl: std::time::Duration) -> Pool {
        self.expiry = Expiry::In(ttl);
        self
    }

    fn keys(&self) -> [String; 2] {
        let prefix = self.client.prefix();
        [
            super::key(prefix, "pool", &self.name, "items", &self.name),
            super::key(prefix, "pool", &self.name, "given", &self.name),
        ]
    }

    /// Add `items` (those already given are skipped); how many were added.
    pub async fn fill(&self, items: &[&str]) -> Result<u64, RequestError> {
        let mut cmd = FILL.cmd(&self.keys());
        self.expiry.push(&mut cmd);
        for item in items {
            cmd.arg(*item);
        }
        self.client.run(&FILL, &cmd).await
    }

    /// Give `user` an item (the same one again if they had one).
    pub async fn claim(&self, user: &str) -> Result<Claim, RequestError> {
        let mut cmd = CLAIM.cmd(&self.keys());
        cmd.arg(user);
        self.expiry.push(&mut cmd);
        let reply: redis::Value = self.client.run(&CLAIM, &cmd).await?;
        let bad = || RequestError::Reply {
            script: "pool",
            detail: format!("{reply:?}"),
        };
        let redis::Value::Array(items) = &reply else {
            return Err(bad());
        };
        let Some(redis::Value::Int(code)) = items.first() else {
            return Err(bad());
        };
        let item = || match items.get(1) {
            Some(redis::Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            _ => Err(bad()),
        };
        match code {
            1 => Ok(Claim::Given { item: item()? }),
            2 => Ok(Claim::AlreadyGiven { item: item()? }),
            0 => Ok(Claim::Empty),
            _ => Err(bad()),
        }
    }

    /// Items left.
    pub async fn peek(&self) -> Result<u64, RequestError> {
        self.client
            .query(redis::cmd("SCARD").arg(&self.keys()[0]))
            .await
    }

    /// Drop the pool and who got what.
    pub async fn reset(&self) -> Result<(), RequestError> {
        let _: i64 = self
            .client
            .write(redis::cmd("DEL").arg(&self.keys()[..]))
            .await?;
        Ok(())
    }
}
