//! Once per subject and window ("has this user already claimed today's coupon?"): `SET NX` with
//! the window's absolute expiry in one command, so the marker can never be left without expiry.
//! The expiry is spread past the window's end by a hash of the key (see `Once::key`).

use crate::model::{default_spread_ms, stored_expire_at};
use crate::window::WindowSpec;

use super::{now_ms, Client, RequestError};

/// A once-per-window marker family.
#[derive(Clone)]
pub struct Once {
    client: Client,
    name: String,
    window: WindowSpec,
}

impl Once {
    /// Markers `name` per `window` (aligned in its time zone).
    pub fn new(client: Client, name: &str, window: WindowSpec) -> Once {
        Once {
            client,
            name: name.to_string(),
            window,
        }
    }

    /// The marker's key and its stored expiry: the window's end, spread by the key's hash
    /// ([`stored_expire_at`]) so the markers of a window do not all expire at once. A marker
    /// that outlives its window is never read for the next one: the key names its window.
    fn key(&self, subject: &str, at_ms: i64) -> (String, i64) {
        let w = self.window.window_of(at_ms);
        let scoped = format!("{}@{}", subject, w.start_ms);
        let key = super::key(self.client.prefix(), "once", &self.name, &scoped, &scoped);
        let spread = default_spread_ms(w.end_ms - w.start_ms);
        let at = stored_expire_at(key.as_bytes(), w.end_ms, spread);
        (key, at)
    }

    /// `true` the first time `subject` calls in the window holding `at_ms` (default now).
    pub async fn first(&self, subject: &str, at_ms: Option<i64>) -> Result<bool, RequestError> {
        let (key, end) = self.key(subject, at_ms.unwrap_or_else(now_ms));
        // Confirmed even when it was not first: the marker found may be a write not yet
        // replicated, and WAIT covers it (it was made on this connection).
        let set: Option<String> = self
            .client
            .write(
                redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("NX")
                    .arg("PXAT")
                    .arg(end),
            )
            .await?;
        Ok(set.is_some())
    }

    /// Whether `subject` has called in the window holding `at_ms`, without marking it.
    pub async fn peek(&self, subject: &str, at_ms: Option<i64>) -> Result<bool, RequestError> {
        let (key, _) = self.key(subject, at_ms.unwrap_or_else(now_ms));
        let n: i64 = self.client.query(redis::cmd("EXISTS").arg(&key)).await?;
        Ok(n == 1)
    }

    /// Forget `subject`'s call in the window holding `at_ms`.
    pub async fn reset(&self, subject: &str, at_ms: Option<i64>) -> Result<(), RequestError> {
        let (key, _) = self.key(subject, at_ms.unwrap_or_else(now_ms));
        let _: i64 = self.client.write(redis::cmd("DEL").arg(&key)).await?;
        Ok(())
    }
}
