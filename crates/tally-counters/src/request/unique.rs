//! Distinct items in a sliding window, exactly: a sorted set item → last seen (server time),
//! trimmed and given the window as expiry in the same script ([`UNIQUE_LUA`]). Bounded: at most
//! `max_items` per subject (beyond, the least recently seen are forgotten, so the count stops at
//! `max_items`) and items of at most [`MAX_ITEM_BYTES`].

use std::sync::LazyLock;
use std::time::Duration;

use super::{ints, Client, RequestError};
use crate::script::Script;

/// The add/count script; see its header.
pub const UNIQUE_LUA: &str = include_str!("lua/unique.lua");
static UNIQUE: LazyLock<Script> = LazyLock::new(|| Script::new("unique", UNIQUE_LUA));

/// Longest item, bytes.
pub const MAX_ITEM_BYTES: usize = 1024;

/// Default most items kept per subject.
pub const DEFAULT_MAX_ITEMS: u64 = 100_000;

/// Distinct items per subject over the last `window`.
#[derive(Clone)]
pub struct Unique {
    client: Client,
    name: String,
    window_ms: u64,
    /// Most items kept per subject (memory per subject is bounded by it).
    max_items: u64,
}

impl Unique {
    /// A family `name` counting over the last `window` (at least 1 ms).
    pub fn new(client: Client, name: &str, window: Duration) -> Unique {
        Unique {
            client,
            name: name.to_string(),
            window_ms: (window.as_millis() as u64).max(1),
            max_items: DEFAULT_MAX_ITEMS,
        }
    }

    /// Keep at most `max_items` (at least 1) per subject: beyond, the least recently seen items
    /// are forgotten and the count stays at `max_items`.
    pub fn with_max_items(mut self, max_items: u64) -> Unique {
        self.max_items = max_items.max(1);
        self
    }

    fn key(&self, subject: &str) -> String {
        super::key(self.client.prefix(), "unique", &self.name, subject, subject)
    }

    async fn call(&self, subject: &str, item: &str) -> Result<u64, RequestError> {
        let mut cmd = UNIQUE.cmd(&[self.key(subject)]);
        cmd.arg(self.window_ms).arg(item).arg(self.max_items);
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
            return Err(RequestError::InvalidField {
                field: "item",
                detail: "item must not be empty".into(),
            });
        }
        if item.len() > MAX_ITEM_BYTES {
            return Err(RequestError::InvalidField {
                field: "item",
                detail: format!("item: at most {MAX_ITEM_BYTES} bytes"),
            });
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
            .write(redis::cmd("DEL").arg(self.key(subject)))
            .await?;
        Ok(())
    }
}
