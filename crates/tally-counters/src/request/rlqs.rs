//! The ledger of Envoy's rate limit quota service (RLQS): per bucket, the requests every Envoy
//! reported allowed in the current window, and what each Envoy holds reserved (the grant it
//! was sent, plus the reserve for its gap). Two scripts, both over the bucket's two keys (one
//! hash tag: one slot in a cluster):
//!
//! * `rlqs_report.lua` ([`Ledger::report`]): add a report's allowed requests; answer the
//!   window's total and the other Envoys' demands;
//! * `rlqs_grant.lua` ([`Ledger::grant`]): store the Envoy's new reservation, capped so that
//!   `used + Σ reservations ≤ limit` (the server's `assign::cap`).
//!
//! Every value travels as ARGV; the bucket id is escaped into the key.

use std::sync::LazyLock;

use crate::script::Script;

use super::{ints, Client, RequestError};

const REPORT_LUA: &str = include_str!("lua/rlqs_report.lua");
const GRANT_LUA: &str = include_str!("lua/rlqs_grant.lua");
static REPORT: LazyLock<Script> = LazyLock::new(|| Script::new("rlqs_report", REPORT_LUA));
static GRANT: LazyLock<Script> = LazyLock::new(|| Script::new("rlqs_grant", GRANT_LUA));

/// One bucket of one domain, in one window: where its ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKeys {
    /// Requests reported allowed in the window.
    used: String,
    /// The Envoys' reservations.
    reservations: String,
    /// When the window's counter may go (Unix ms).
    used_expire_at_ms: i64,
}

impl BucketKeys {
    /// The keys of bucket `id` (its `(key, value)` pairs, any order) of `domain`, in the window
    /// `[start_ms, end_ms)`.
    pub fn new(
        client: &Client,
        domain: &str,
        id: &[(&str, &str)],
        start_ms: i64,
        end_ms: i64,
    ) -> Self {
        let subject = canonical(id);
        let tag = format!("{domain}\n{subject}");
        let reservations = super::key(client.prefix(), "rlqs", domain, &subject, &tag);
        let windowed = format!("{subject}@{start_ms}");
        let used = super::key(client.prefix(), "rlqs", domain, &windowed, &tag);
        BucketKeys {
            used,
            reservations,
            // Kept one window past its end: a report read just after the end still finds it.
            used_expire_at_ms: end_ms + (end_ms - start_ms),
        }
    }

    fn both(&self) -> [&str; 2] {
        [&self.used, &self.reservations]
    }
}

/// A bucket id as one string, the same for every order of its pairs and different for every
/// other id: pairs sorted, key and value each escaped (':' among the escaped bytes), joined by
/// ':'.
fn canonical(id: &[(&str, &str)]) -> String {
    let mut pairs = id.to_vec();
    pairs.sort_unstable();
    let mut buf = Vec::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            buf.push(b':');
        }
        crate::key::escape_into(&mut buf, k);
        buf.push(b':');
        crate::key::escape_into(&mut buf, v);
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// An Envoy's demand as the ledger keeps it (integers: the scripts never see a float).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Requests per 1,000 seconds.
    pub rate_milli: u64,
    /// Time between its reports, ms.
    pub period_ms: u64,
}

/// The window's state as a report finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// Requests reported allowed in the window, this report's included.
    pub used: u64,
    /// The demands of the other Envoys holding a live reservation.
    pub others: Vec<Need>,
}

/// What the grant script stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Requests the Envoy may admit from its new assignment.
    pub grant: u64,
    /// Held for it in the ledger (the grant and the gap's reserve).
    pub reserved: u64,
    /// Requests reported allowed in the window when it was granted.
    pub used: u64,
}

/// What a grant asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerAsk {
    /// The share the caller computed.
    pub desired: u64,
    /// The reserve for the gap, taken first.
    pub gap: u64,
    /// Requests per window across every Envoy.
    pub limit: u64,
    /// The reservation lasts until then (Unix ms): the assignment's time to live, and more.
    pub expires_at_ms: i64,
    /// The Envoy's demand, for the others' shares.
    pub need: Need,
}

/// The RLQS ledger over one Redis connection.
#[derive(Clone)]
pub struct Ledger {
    client: Client,
}

impl Ledger {
    /// A ledger in `client`'s Redis, under its prefix.
    pub fn new(client: Client) -> Ledger {
        Ledger { client }
    }

    /// The keys of a bucket (see [`BucketKeys::new`]).
    pub fn keys(
        &self,
        domain: &str,
        id: &[(&str, &str)],
        start_ms: i64,
        end_ms: i64,
    ) -> BucketKeys {
        BucketKeys::new(&self.client, domain, id, start_ms, end_ms)
    }

    /// Add `allowed` requests of `holder` to the window; the window's total and the others'
    /// demands.
    pub async fn report(
        &self,
        keys: &BucketKeys,
        holder: &str,
        allowed: u64,
        now_ms: i64,
    ) -> Result<Standing, RequestError> {
        let mut cmd = REPORT.cmd(&keys.both());
        cmd.arg(holder)
            .arg(allowed)
            .arg(now_ms)
            .arg(keys.used_expire_at_ms);
        let value: redis::Value = self.client.run(&REPORT, &cmd).await?;
        let v = ints(REPORT.name(), &value)?;
        let bad = |detail: String| RequestError::Reply {
            script: REPORT.name(),
            detail,
        };
        let (used, rest) = v.split_first().ok_or_else(|| bad("empty reply".into()))?;
        if rest.len() % 2 != 0 || rest.iter().any(|n| *n < 0) || *used < 0 {
            return Err(bad(format!("{v:?}")));
        }
        Ok(Standing {
            used: *used as u64,
            others: rest
                .chunks_exact(2)
                .map(|p| Need {
                    rate_milli: p[0] as u64,
                    period_ms: p[1] as u64,
                })
                .collect(),
        })
    }

    /// Store `holder`'s new reservation, capped within the limit.
    pub async fn grant(
        &self,
        keys: &BucketKeys,
        holder: &str,
        ask: LedgerAsk,
        now_ms: i64,
    ) -> Result<Granted, RequestError> {
        let mut cmd = GRANT.cmd(&keys.both());
        cmd.arg(holder)
            .arg(ask.desired)
            .arg(ask.gap)
            .arg(ask.limit)
            .arg(now_ms)
            .arg(ask.expires_at_ms)
            .arg(ask.need.rate_milli)
            .arg(ask.need.period_ms);
        let value: redis::Value = self.client.run(&GRANT, &cmd).await?;
        match ints(GRANT.name(), &value)?.as_slice() {
            &[grant, reserved, used] if grant >= 0 && reserved >= grant && used >= 0 => {
                Ok(Granted {
                    grant: grant as u64,
                    reserved: reserved as u64,
                    used: used as u64,
                })
            }
            other => Err(RequestError::Reply {
                script: GRANT.name(),
                detail: format!("{other:?}"),
            }),
        }
    }

    /// Drop `holder`'s reservation (its bucket was abandoned: it admits nothing more from it).
    pub async fn release(&self, keys: &BucketKeys, holder: &str) -> Result<(), RequestError> {
        let _: i64 = self
            .client
            .write(redis::cmd("HDEL").arg(&keys.reservations).arg(holder))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn a_bucket_id_is_one_string_whatever_the_order_and_never_another_ids() {
        assert_eq!(
            canonical(&[("a", "1"), ("b", "2")]),
            canonical(&[("b", "2"), ("a", "1")])
        );
        assert_ne!(
            canonical(&[("a", "1:b:2")]),
            canonical(&[("a", "1"), ("b", "2")])
        );
        assert_ne!(canonical(&[("a:1", "")]), canonical(&[("a", "1:")]));
    }
}
