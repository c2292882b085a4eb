//! The request-path primitives over HTTP, as a client of one `tally serve` sees them: each call
//! answers what it decided, or `None`/`false` when tally could not decide (a 503).

use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::http::Client;

/// `tally serve`'s HTTP port at `port`.
pub struct Api {
    pub client: Client,
    pub port: u16,
}

impl Api {
    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        match self.client.post_json(self.port, path, body) {
            Ok(a) => (
                a.status,
                serde_json::from_str(&a.body).unwrap_or(Value::Null),
            ),
            // Not listening yet.
            Err(_) => (0, Value::Null),
        }
    }

    /// The answer's body when its status is one of `ok`; None when it is 503 `not-replicated`
    /// (fewer replicas than asked had the write in time); panics on any other answer.
    pub fn answered(&self, path: &str, body: &str, ok: &[u16]) -> Option<Value> {
        let (status, body) = self.post(path, body);
        match status {
            s if ok.contains(&s) => Some(body),
            503 => {
                let kind = body["type"].as_str().unwrap_or("");
                assert!(kind.ends_with("/not-replicated"), "{body}");
                None
            }
            _ => panic!("{status} {body}"),
        }
    }

    /// Whether a take of `quota` by `user` was admitted (200 `admitted`).
    pub fn take(&self, quota: &str, user: &str) -> bool {
        let body = format!(r#"{{"quota":"{quota}","user":"{user}"}}"#);
        self.answered("/v1/quota", &body, &[200])
            .is_some_and(|b| b["outcome"] == "admitted")
    }

    /// Whether a decision of limit `policy` was admitted (200 `admitted: true`).
    pub fn admitted(&self, policy: &str) -> bool {
        let body = format!(r#"{{"policy":"{policy}","subject":"s"}}"#);
        self.answered("/v1/limit", &body, &[200, 429])
            .is_some_and(|b| b["admitted"] == true)
    }

    /// Whether `once` answered first (200 `ok: true`).
    pub fn first(&self, name: &str, subject: &str) -> bool {
        let (status, body) = self.post(
            "/v1/once",
            &format!(r#"{{"name":"{name}","subject":"{subject}"}}"#),
        );
        status == 200 && body["ok"] == true
    }

    /// The item pool `pool` gave `user` (200 `given`); None when refused or empty.
    pub fn claim(&self, pool: &str, user: &str) -> Option<String> {
        let body = format!(r#"{{"pool":"{pool}","user":"{user}"}}"#);
        let answer = self.answered("/v1/pool", &body, &[200])?;
        (answer["outcome"] == "given").then(|| answer["item"].as_str().unwrap().to_string())
    }

    /// Acquire lock `name` for two minutes: Some(acquired), None when not replicated.
    pub fn acquire(&self, name: &str) -> Option<bool> {
        let path = format!("/v1/locks/{name}/acquire");
        self.answered(&path, r#"{"ttl_ms":120000}"#, &[200])
            .map(|b| b["acquired"] == true)
    }

    pub fn fence(&self) -> Option<u64> {
        let (status, body) = self.post("/v1/locks/nightly/acquire", r#"{"ttl_ms":120000}"#);
        assert_eq!(status, 200, "{body}");
        body["lease"]["fence"].as_u64()
    }

    /// Until tally answers from the new primary (a take of a throwaway quota user).
    pub fn wait_redis(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .post("/v1/once", r#"{"name":"free","subject":"probe"}"#)
            .0
            != 200
        {
            assert!(
                Instant::now() < deadline,
                "tally never reached the new primary"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
