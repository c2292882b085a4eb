//! Hits: count now and read the total, on the stream path's keys.
//!
//! The folklore `INCR` then `EXPIRE` leaves a key without expiry when the process dies between
//! the two, and `SET NX EX` then `INCR` races; a retried `INCR` after a timeout counts twice.
//! [`HIT_LUA`] adds, sets the window's absolute expiry when the key has none (new, or made or
//! PERSISTed elsewhere) and records the idempotency key in one atomic step.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde::Serialize;

use super::{ints, now_ms, Client, RequestError};
use crate::model::layout::Layout;
use crate::model::CounterSpec;
use crate::script::Script;

/// The hit script; see its header for the reply contract.
pub const HIT_LUA: &str = include_str!("lua/hit.lua");
static HIT: LazyLock<Script> = LazyLock::new(|| Script::new("hit", HIT_LUA));

/// One hit.
#[derive(Debug, Clone, Default)]
pub struct Hit {
    /// Amount to add (default 1 when 0 is given through [`Hit::one`]).
    pub delta: i64,
    /// Time of the hit (Unix ms): picks the window. Default: now on this machine's clock.
    pub at_ms: Option<i64>,
    /// A retried hit with the same key (within the window) is counted once.
    pub idempotency_key: Option<String>,
    /// A bound on the counter's magnitude for this hit: one that would take it past
    /// `±max_value` adds nothing ([`RequestError::AboveMax`]). None: only the signed 64-bit
    /// range. A service gives callers without the admin scope a bound, so that none can bring a
    /// counter within reach of overflow (every later stream increment of it would be dropped).
    pub max_value: Option<i64>,
}

impl Hit {
    /// A hit of 1, now.
    pub fn one() -> Hit {
        Hit {
            delta: 1,
            ..Hit::default()
        }
    }
}

/// What a hit did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HitReply {
    /// The counter's value after the hit.
    pub value: i64,
    /// `true` when the idempotency key had been seen: nothing was added.
    pub duplicate: bool,
    /// The key as stored in Redis.
    pub key: String,
    /// Window start, Unix ms.
    pub window_start_ms: i64,
    /// Window end, Unix ms.
    pub window_end_ms: i64,
    /// When the window stops taking hits: window end + retention, Unix ms. The key itself is
    /// stored with an expiry up to the counter's `expiry_spread` later.
    pub expire_at_ms: i64,
}

/// Windowed counters on the request path, sharing keys with the stream path's counters.
#[derive(Clone)]
pub struct Counters {
    client: Client,
    specs: HashMap<String, CounterSpec>,
    layout: Layout,
}

impl Counters {
    /// Counters `specs` on `layout` (the same as the stream path's, so both write one key).
    pub fn new(client: Client, specs: Vec<CounterSpec>, layout: Layout) -> Counters {
        let specs = specs.into_iter().map(|s| (s.name.clone(), s)).collect();
        Counters {
            client,
            specs,
            layout,
        }
    }

    /// The counter named `name`.
    pub fn spec(&self, name: &str) -> Result<&CounterSpec, RequestError> {
        self.specs
            .get(name)
            .ok_or_else(|| crate::model::LookupError::UnknownCounter(name.to_string()).into())
    }

    /// Add `hit.delta` to counter `name` for `values` (in dimension order) and return the total.
    pub async fn hit(
        &self,
        name: &str,
        values: &[&str],
        hit: &Hit,
    ) -> Result<HitReply, RequestError> {
        let Located {
            key,
            window,
            expire_at,
            stored_expire_at,
        } = self.locate(name, values, hit.at_ms)?;
        let mut keys = vec![key.clone()];
        if let Some(id) = &hit.idempotency_key {
            keys.push(self.idempotency_key(name, id, &key));
        }
        let mut cmd = HIT.cmd(&keys);
        cmd.arg(hit.delta).arg(expire_at).arg(stored_expire_at);
        if let Some(max) = hit.max_value {
            cmd.arg(max);
        }
        let reply: redis::Value = self.client.run(&HIT, &cmd).await?;
        let r = ints("hit", &reply)?;
        let value = match r.as_slice() {
            [1, v] | [0, v] => *v,
            [-1] => {
                return Err(RequestError::Invalid(format!(
                    "the window of this hit ended at {} and its key has expired",
                    window.end_ms
                )))
            }
            [-2] => {
                return Err(RequestError::Invalid(
                    "the counter's key holds a value that is not an integer".into(),
                ))
            }
            [-3] => {
                return Err(RequestError::Overflow {
                    counter: name.to_string(),
                    delta: hit.delta,
                })
            }
            [-5] => {
                return Err(RequestError::AboveMax {
                    counter: name.to_string(),
                    max: hit.max_value.unwrap_or(i64::MAX),
                })
            }
            [-4] => {
                return Err(RequestError::Conflict(format!(
                    "idempotency key `{}` was used for another key of counter `{name}` (other \
                     dimension values or another window); nothing was added",
                    hit.idempotency_key.as_deref().unwrap_or_default()
                )))
            }
            _ => {
                return Err(RequestError::Reply {
                    script: "hit",
                    detail: format!("{reply:?}"),
                })
            }
        };
        Ok(HitReply {
            value,
            duplicate: r[0] == 0,
            key: String::from_utf8_lossy(&key).into_owned(),
            window_start_ms: window.start_ms,
            window_end_ms: window.end_ms,
            expire_at_ms: expire_at,
        })
    }

    /// The counter's value for `values` at `at_ms` (default now), without changing it.
    pub async fn peek(
        &self,
        name: &str,
        values: &[&str],
        at_ms: Option<i64>,
    ) -> Result<i64, RequestError> {
        let key = self.locate(name, values, at_ms)?.key;
        let v: Option<i64> = self.client.query(redis::cmd("GET").arg(&key)).await?;
        Ok(v.unwrap_or(0))
    }

    /// Delete the counter's key for `values` at `at_ms` (default now).
    pub async fn reset(
        &self,
        name: &str,
        values: &[&str],
        at_ms: Option<i64>,
    ) -> Result<(), RequestError> {
        let key = self.locate(name, values, at_ms)?.key;
        let _: i64 = self.client.write(redis::cmd("DEL").arg(&key)).await?;
        Ok(())
    }

    /// Where a hit of counter `name` for `values` at `at_ms` (default now) lands, as a reply
    /// with value 0.
    pub fn locate_reply(
        &self,
        name: &str,
        values: &[&str],
        at_ms: Option<i64>,
    ) -> Result<HitReply, RequestError> {
        let l = self.locate(name, values, at_ms)?;
        Ok(HitReply {
            value: 0,
            duplicate: false,
            key: String::from_utf8_lossy(&l.key).into_owned(),
            window_start_ms: l.window.start_ms,
            window_end_ms: l.window.end_ms,
            expire_at_ms: l.expire_at,
        })
    }

    /// Key, window and expiry of a hit.
    fn locate(
        &self,
        name: &str,
        values: &[&str],
        at_ms: Option<i64>,
    ) -> Result<Located, RequestError> {
        let spec = self.spec(name)?;
        if !matches!(spec.kind, crate::model::Kind::Count) {
            return Err(RequestError::Invalid(format!(
                "counter `{name}` is not a count kept in string keys: hits add to those only"
            )));
        }
        if values.len() != spec.dimensions.len() {
            return Err(RequestError::Invalid(format!(
                "counter `{name}` has dimensions {:?}; got {} values",
                spec.dimensions,
                values.len()
            )));
        }
        let at = at_ms.unwrap_or_else(now_ms);
        let (key, window) = spec.key_at(values, at, &self.layout);
        Ok(Located {
            expire_at: spec.expire_at(window.end_ms),
            stored_expire_at: spec.stored_expire_at(&key, window.end_ms),
            key,
            window,
        })
    }

    /// `<prefix>idem:<counter>:<id>` in the slot of the counter's key.
    fn idempotency_key(&self, name: &str, id: &str, counter_key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(64 + id.len());
        k.extend_from_slice(self.client.prefix().as_bytes());
        k.extend_from_slice(b"idem:");
        crate::key::escape_into(&mut k, name);
        k.push(b':');
        crate::key::escape_into(&mut k, id);
        k.extend_from_slice(tag_suffix(counter_key));
        k
    }
}

/// Where a hit lands.
struct Located {
    key: Vec<u8>,
    window: crate::window::Window,
    /// Window end + retention: after it the window takes no more hits.
    expire_at: i64,
    /// The expiry stored on the key, the stream's (`CounterSpec::stored_expire_at`).
    stored_expire_at: i64,
}

/// The `:{tag}` a cluster layout appended to a stored key (empty without one).
fn tag_suffix(stored: &[u8]) -> &[u8] {
    if stored.last() != Some(&b'}') {
        return &[];
    }
    match stored.iter().rposition(|&b| b == b'{') {
        Some(open) if open > 0 && stored[open - 1] == b':' => &stored[open - 1..],
        _ => &[],
    }
}
