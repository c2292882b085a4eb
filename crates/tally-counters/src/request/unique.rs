//! Distinct items in a sliding window, exactly: a sorted set item → last seen (server time),
//! trimmed and given the window as expiry in the same script ([`UNIQUE_LUA`]).

use std::sync::LazyLock;
use std::time::Duration;

use super::{ints, Client, RequestError};
use crate::script::Script;

/// The add/count script; see its header.
pub const UNIQUE_LUA: &str = include_str!("lua/unique.lua");
static UNIQUE: LazyLock<Script> = LazyLock::new(|| Script::new("unique", UNIQUE_LUA));

/// Distinct items per subject over the last `window`.
#[derive(Clone)]
pub struct Unique {
    client: Client,
    name: String,
    window_ms: u64,
}

impl Unique {
    /// A family `name` counting over the last `window` (at least 1 ms).
    pub fn new(client: Client, name: &str, window: Duration) -> Unique {
        Unique {
            client,
            name: name.to_string(),
            window_ms: (window.as_millis() as u64).max(1),
        }
    }

    fn key(&self, subject: &str) -> String {
        super::key(self.client.prefix(), "unique", &self.name, subject, subject)
    }

    async fn call(&self, subject: &str, item: &str) -> Result<u64, RequestError> {
        let mut cmd = UNIQUE.cmd(&[self.key(subject)]);
        cmd.arg(self.window_ms).arg(item);
        let reply: redis::Value = self.client.run(&UNIQUE, &cmd).await?;
        match ints("unique", &reply)?.as_slice() {
            [n, _] => Ok(*n as u64),
            _ => Err(RequestError::Reply {
                script: "unique",
                detail: format!("{reply:?}"),
            }),
        }
    }

    /// Record `item` for `subject` now; the number of distinct items seen in the window.
    pub async fn add(&self, subject: &str, item: &str) -> Result<u64, RequestError> {
        if item.is_empty() {
            return Err(RequestError::Invalid("item must not be empty".into()));
        }
        self.call(subject, item).await
    }

    /// The number of distinct items seen in the window, without recording one.
    pub async fn peek(&self, subject: &str) -> Result<u64, RequestError> {
        self.call(subject, "").await
    }

    /// Forget `subject`'s items.
    pub async fn reset(&self, subject: &str) -> Result<(), RequestError> {
        let _: i64 = self
            .client
            .query(redis::cmd("DEL").arg(self.key(subject)))
            .await?;
        Ok(())
    }
}
