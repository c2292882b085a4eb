//! Quotas, once, unique-in-window and pools behind the configuration, with their metrics.

use tally_counters::request::{Claim, QuotaReply, RequestError};

use super::{Action, Primitives, RequestAnswer};
use crate::ops::metrics::{Outcome, Primitive};

impl Primitives {
    /// Take from, give back to, read or clear quota `name`.
    pub async fn quota(
        &self,
        name: &str,
        user: Option<&str>,
        action: Action,
    ) -> Result<RequestAnswer, RequestError> {
        let call = async {
            let (quota, ttl) = self
                .quotas
                .get(name)
                .ok_or_else(|| RequestError::Invalid(format!("unknown quota `{name}`")))?;
            let quota = quota.clone().expiring_in(*ttl);
            Ok(match action {
                Action::Apply => RequestAnswer::Quota(quota.take(user).await?),
                Action::Release => RequestAnswer::Flag {
                    ok: quota.release(user).await?,
                },
                Action::Peek => {
                    let taken = quota.peek().await?;
                    RequestAnswer::QuotaState {
                        taken,
                        size: quota.size(),
                        left: quota.size().saturating_sub(taken),
                    }
                }
                Action::Reset => {
                    quota.reset().await?;
                    RequestAnswer::Count { count: 0 }
                }
                Action::Fill => {
                    return Err(RequestError::Invalid(
                        "quotas take apply, release, peek or reset".into(),
                    ))
                }
            })
        };
        self.instrument(Primitive::Quota, name, call, |a| match a {
            RequestAnswer::Quota(QuotaReply::Admitted { .. }) => Outcome::Allowed,
            RequestAnswer::Quota(QuotaReply::SoldOut { .. }) => Outcome::Denied,
            RequestAnswer::Quota(QuotaReply::AlreadyTaken { .. }) => Outcome::Duplicate,
            _ if action == Action::Peek => Outcome::Peek,
            _ if action == Action::Reset => Outcome::Reset,
            _ => Outcome::Allowed,
        })
        .await
    }

    /// Once family `name`: is this `subject`'s first call in the window holding `at_ms`?
    pub async fn once(
        &self,
        name: &str,
        subject: &str,
        at_ms: Option<i64>,
        action: Action,
    ) -> Result<RequestAnswer, RequestError> {
        let call = async {
            let once = self
                .once
                .get(name)
                .ok_or_else(|| RequestError::Invalid(format!("unknown once `{name}`")))?;
            // As for hits: a marker cannot be written for a time far ahead (it would live on).
            if let Some(at) = at_ms {
                let now = chrono::Utc::now().timestamp_millis();
                tally_counters::model::check_at(at, now, self.max_future_ms)?;
            }
            let ok = match action {
                Action::Apply => once.first(subject, at_ms).await?,
                Action::Peek => once.peek(subject, at_ms).await?,
                Action::Reset => {
                    once.reset(subject, at_ms).await?;
                    true
                }
                _ => {
                    return Err(RequestError::Invalid(
                        "once takes apply, peek or reset".into(),
                    ))
                }
            };
            Ok(RequestAnswer::Flag { ok })
        };
        self.instrument(Primitive::Once, name, call, |a| match (action, a) {
            (Action::Peek, _) => Outcome::Peek,
            (Action::Reset, _) => Outcome::Reset,
            (_, RequestAnswer::Flag { ok: true }) => Outcome::Allowed,
            _ => Outcome::Denied,
        })
        .await
    }

    /// Unique family `name`: record `item` (if given) and count `subject`'s distinct items.
    pub async fn unique(
        &self,
        name: &str,
        subject: &str,
        item: Option<&str>,
        action: Action,
    ) -> Result<RequestAnswer, RequestError> {
        let call = async {
            let unique = self
                .unique
                .get(name)
                .ok_or_else(|| RequestError::Invalid(format!("unknown unique `{name}`")))?;
            let count = match (action, item) {
                (Action::Apply, Some(item)) => unique.add(subject, item).await?,
                (Action::Apply, None) => {
                    return Err(RequestError::Invalid("name the item to add".into()))
                }
                (Action::Peek, _) => unique.peek(subject).await?,
                (Action::Reset, _) => {
                    unique.reset(subject).await?;
                    0
                }
                _ => {
                    return Err(RequestError::Invalid(
                        "unique takes apply, peek or reset".into(),
                    ))
                }
            };
            Ok(RequestAnswer::Count { count })
        };
        self.instrument(Primitive::Unique, name, call, |_| match action {
            Action::Peek => Outcome::Peek,
            Action::Reset => Outcome::Reset,
            _ => Outcome::Allowed,
        })
        .await
    }

    /// Pool `name`: claim an item for `user`, fill it with `items`, read or clear it.
    pub async fn pool(
        &self,
        name: &str,
        user: Option<&str>,
        items: &[String],
        action: Action,
    ) -> Result<RequestAnswer, RequestError> {
        let call = async {
            let (pool, ttl) = self
                .pools
                .get(name)
                .ok_or_else(|| RequestError::Invalid(format!("unknown pool `{name}`")))?;
            let pool = pool.clone().expiring_in(*ttl);
            Ok(match action {
                Action::Apply => {
                    let user = user
                        .filter(|u| !u.is_empty())
                        .ok_or_else(|| RequestError::Invalid("name the user".into()))?;
                    RequestAnswer::Claim(pool.claim(user).await?)
                }
                Action::Fill => {
                    let items: Vec<&str> = items.iter().map(String::as_str).collect();
                    RequestAnswer::Count {
                        count: pool.fill(&items).await?,
                    }
                }
                Action::Peek => RequestAnswer::Count {
                    count: pool.peek().await?,
                },
                Action::Reset => {
                    pool.reset().await?;
                    RequestAnswer::Count { count: 0 }
                }
                Action::Release => {
                    return Err(RequestError::Invalid(
                        "pools take apply, fill, peek or reset".into(),
                    ))
                }
            })
        };
        self.instrument(Primitive::Pool, name, call, |a| match a {
            RequestAnswer::Claim(Claim::Given { .. }) => Outcome::Allowed,
            RequestAnswer::Claim(Claim::AlreadyGiven { .. }) => Outcome::Duplicate,
            RequestAnswer::Claim(Claim::Empty) => Outcome::Denied,
            _ if action == Action::Peek => Outcome::Peek,
            _ if action == Action::Reset => Outcome::Reset,
            _ => Outcome::Allowed,
        })
        .await
    }
}
