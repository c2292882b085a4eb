//! Once per subject and window ("has this user already claimed today's coupon?"): `SET NX` with
//! the window's absolute expiry in one command, so the marker can never be left without expiry.

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

    fn key(&self, subject: &str, at_ms: i64) -> (String, i64) {
        let w = self.window.window_of(at_ms);
        let scoped = format!("{}@{}", subject, w.start_ms);
        let key = super::key(self.client.prefix(), "once", &self.name, &scoped, &scoped);
        (key, w.end_ms)
    }

    /// `true` the first time `subject` calls in the window holding `at_ms` (default now).
    pub async fn first(&self, subject: &str, at_ms: Option<i64>) -> Result<bool, RequestError> {
        let (key, end) = self.key(subject, at_ms.unwrap_or_else(now_ms));
        let set: Option<String> = self
            .client
            .query(
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
        let _: i64 = self.client.query(redis::cmd("DEL").arg(&key)).await?;
        Ok(())
    }
}
