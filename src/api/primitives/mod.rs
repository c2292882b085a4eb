//! The request path of the service: the library's primitives (`tally_counters::request`) built
//! from the configuration, with metrics around every call. HTTP (`/v1/hit`, `/v1/limit`, …) and
//! the CLI (`tally hit`, `tally limit`, …) call these.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Instant;

use serde::Serialize;
use tally_counters::model::check_at;
use tally_counters::request::{
    Claim, Client, Counters, Decision, Durability, Hit, HitReply, Once, Pool, Quota, QuotaReply,
    RateLimiter, RequestError, Unique,
};

mod claims;
mod defer;

pub use defer::{Deferral, HitOutcome};

use crate::config::{Model, RequestConfig};
use crate::ops::metrics::{Metrics, Outcome, Primitive};

/// What to do with a primitive's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Decide and record (the default).
    #[default]
    Apply,
    /// Decide without recording.
    Peek,
    /// Clear the state.
    Reset,
    /// Give back (quotas).
    Release,
    /// Add items (pools).
    Fill,
}

/// The answer of a quota, once, unique or pool call.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum RequestAnswer {
    /// A quota's take.
    Quota(QuotaReply),
    /// A quota's state (peek): units taken, its size, units left.
    QuotaState {
        /// Units taken so far.
        taken: u64,
        /// Units the quota holds.
        size: u64,
        /// Units left to take.
        left: u64,
    },
    /// A pool's claim.
    Claim(Claim),
    /// A flag (once: first; quota release: released).
    Flag {
        /// The answer.
        ok: bool,
    },
    /// A number (units taken, items left, distinct items, items added).
    Count {
        /// The number.
        count: u64,
    },
}

/// Why the request path's primitives cannot be built from a configuration.
#[derive(Debug, thiserror::Error)]
pub enum PrimitivesError {
    /// A `[[request.once]]` whose window or time zone cannot be used.
    #[error("request.once `{name}`: {reason}")]
    Once {
        name: String,
        reason: crate::config::OnceWindowError,
    },
    /// The rate limiter refused the `[[request.limits]]` policies.
    #[error("request.limits: {0}")]
    Limits(RequestError),
}

/// Series for every configured policy, so dashboards show zeroes rather than no data.
fn register_limit_series(metrics: &Metrics, r: &RequestConfig) {
    let m = &metrics.request;
    for p in &r.limits {
        for outcome in [Outcome::Allowed, Outcome::Denied] {
            m.decisions
                .with_label_values(&[Primitive::Limit.label(), &p.name, outcome.label()]);
        }
        for decision in ["allowed", "denied"] {
            m.without_redis.with_label_values(&[&p.name, decision]);
        }
        m.near_limit.with_label_values(&[&p.name]);
    }
}

/// Every configured request-path primitive over one shared connection.
pub struct Primitives {
    counters: Counters,
    limiter: RateLimiter,
    quotas: HashMap<String, (Quota, std::time::Duration)>,
    once: HashMap<String, Once>,
    unique: HashMap<String, Unique>,
    pools: HashMap<String, (Pool, std::time::Duration)>,
    client: Client,
    locks: tally_counters::lock::Locks,
    metrics: Metrics,
    /// Where hits go when Redis is unreachable and the caller asks to defer (`tally run`).
    deferral: Option<Deferral>,
    /// `decode.max_future`, ms: a hit's time may not lie further ahead (as for events).
    max_future_ms: i64,
    /// Longest a lock acquire may wait: `http.request_timeout` less `redis.response_timeout`
    /// (and a margin), so that its last try is answered before the request times out (a lease
    /// taken by a try whose answer came too late would be held with nobody knowing its token).
    max_lock_wait: std::time::Duration,
}

impl Primitives {
    /// Build from a validated configuration over the process's request-side `client` (made
    /// with `request.batch`'s batching); connects on first use.
    pub fn new(
        model: &Model,
        client: Client,
        metrics: Metrics,
    ) -> Result<Primitives, PrimitivesError> {
        let config = &model.config;
        let r = &config.request;
        // Each primitive's own durability, else `request.durability`.
        let durable = |own: Option<Durability>| client.durable(own.unwrap_or(r.durability));
        let once = r
            .once
            .iter()
            .map(|o| {
                let w = r.once_window(o).map_err(|reason| PrimitivesError::Once {
                    name: o.name.clone(),
                    reason,
                })?;
                Ok((o.name.clone(), Once::new(durable(o.durability), &o.name, w)))
            })
            .collect::<Result<_, PrimitivesError>>()?;
        let quotas = r.quotas.iter().map(|q| {
            let quota = Quota::new(durable(q.durability), &q.name, q.size, q.once_per_user, 0);
            (q.name.clone(), (quota, q.ttl))
        });
        let unique = r.unique.iter().map(|u| {
            let unique = Unique::new(durable(u.durability), &u.name, u.window);
            (u.name.clone(), unique.with_max_items(u.max_items))
        });
        let pools = r.pools.iter().map(|p| {
            let pool = Pool::new(durable(p.durability), &p.name, 0);
            (p.name.clone(), (pool, p.ttl))
        });
        register_limit_series(&metrics, r);
        Ok(Primitives {
            counters: Counters::new(durable(None), model.counters.clone(), model.layout.clone()),
            limiter: RateLimiter::new(durable(None), r.limits.clone())
                .map_err(PrimitivesError::Limits)?,
            quotas: quotas.collect(),
            once,
            unique: unique.collect(),
            pools: pools.collect(),
            locks: tally_counters::lock::Locks::new(durable(r.locks.durability)),
            client,
            metrics,
            deferral: None,
            max_future_ms: i64::try_from(config.decode.max_future.as_millis()).unwrap_or(i64::MAX),
            max_lock_wait: config.http.request_timeout.saturating_sub(
                config.redis.response_timeout + std::time::Duration::from_millis(250),
            ),
        })
    }

    /// The shared client (for callers that build their own primitives).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Defer hits to Kafka when Redis is unreachable (callers opt in per hit).
    pub fn with_deferral(mut self, deferral: Deferral) -> Primitives {
        self.deferral = Some(deferral);
        self
    }

    /// How long a lock acquire asked to wait `asked` may wait (see `max_lock_wait`).
    pub fn lock_wait(&self, asked: std::time::Duration) -> std::time::Duration {
        asked.min(self.max_lock_wait)
    }

    /// The locks over the shared connection.
    pub fn locks(&self) -> &tally_counters::lock::Locks {
        &self.locks
    }

    /// Run one primitive call, counting its duration, Redis errors and outcome (the outcome of
    /// an answer by `outcome`; an error is `Outcome::Error`).
    async fn instrument<T>(
        &self,
        primitive: Primitive,
        name: &str,
        call: impl Future<Output = Result<T, RequestError>>,
        outcome: impl FnOnce(&T) -> Outcome,
    ) -> Result<T, RequestError> {
        let started = Instant::now();
        let result = call.await;
        let m = &self.metrics.request;
        m.duration
            .with_label_values(&[primitive.label()])
            .observe(started.elapsed().as_secs_f64());
        let o = match &result {
            Ok(v) => outcome(v),
            Err(e) => {
                if e.is_unavailable() {
                    m.redis_errors.with_label_values(&[primitive.label()]).inc();
                }
                Outcome::Error
            }
        };
        m.decided(primitive, self.label(primitive, name), o);
        result
    }

    /// The metric label of a call on `name`: the name when it is configured, else `unknown`, so
    /// what a client sends cannot grow `/metrics` (a limit's label is its policies, sorted).
    fn label<'a>(&self, primitive: Primitive, name: &'a str) -> &'a str {
        let known = match primitive {
            Primitive::Hit => self.counters.spec(name).is_ok(),
            Primitive::Limit => name.split('+').all(|p| self.limiter.policy(p).is_ok()),
            Primitive::Quota => self.quotas.contains_key(name),
            Primitive::Once => self.once.contains_key(name),
            Primitive::Unique => self.unique.contains_key(name),
            Primitive::Pool => self.pools.contains_key(name),
        };
        if known {
            name
        } else {
            "unknown"
        }
    }

    /// Add to counter `name` for dimension `values` (name → value) and return the total.
    pub async fn hit(
        &self,
        name: &str,
        values: &BTreeMap<String, String>,
        hit: &Hit,
        action: Action,
    ) -> Result<HitReply, RequestError> {
        let call = async {
            let spec = self.counters.spec(name)?;
            let ordered = spec.values_in_order(values)?;
            if let Some(at) = hit.at_ms {
                let now = chrono::Utc::now().timestamp_millis();
                check_at(at, now, self.max_future_ms)?;
            }
            match action {
                Action::Apply => self.counters.hit(name, &ordered, hit).await,
                Action::Peek | Action::Reset => {
                    let located = self.counters.locate_reply(name, &ordered, hit.at_ms)?;
                    let value = if action == Action::Peek {
                        self.counters.peek(name, &ordered, hit.at_ms).await?
                    } else {
                        self.counters.reset(name, &ordered, hit.at_ms).await?;
                        0
                    };
                    Ok(HitReply { value, ..located })
                }
                _ => Err(RequestError::Invalid(
                    "hits take apply, peek or reset".into(),
                )),
            }
        };
        self.instrument(Primitive::Hit, name, call, |r| match action {
            Action::Peek => Outcome::Peek,
            Action::Reset => Outcome::Reset,
            _ if r.duplicate => Outcome::Duplicate,
            _ => Outcome::Allowed,
        })
        .await
    }

    /// Decide a request of `cost` by `subject` against `policies`.
    pub async fn limit(
        &self,
        policies: &[&str],
        subject: &str,
        cost: u64,
        action: Action,
    ) -> Result<Decision, RequestError> {
        let call = async {
            match action {
                Action::Apply => self.limiter.check(policies, subject, cost).await,
                Action::Peek => self.limiter.peek(policies, subject, cost).await,
                Action::Reset => {
                    self.limiter.reset(policies, subject).await?;
                    self.limiter.peek(policies, subject, cost).await
                }
                _ => Err(RequestError::Invalid(
                    "limits take apply, peek or reset".into(),
                )),
            }
        };
        // Sorted: the order a caller names policies in does not make a new series.
        let mut sorted = policies.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let label = sorted.join("+");
        let result = self
            .instrument(Primitive::Limit, &label, call, |d| match action {
                Action::Peek => Outcome::Peek,
                Action::Reset => Outcome::Reset,
                _ if !d.admitted => Outcome::Denied,
                _ if d.policies.iter().any(|v| !v.allowed) => Outcome::ShadowDenied,
                _ => Outcome::Allowed,
            })
            .await;
        let m = &self.metrics.request;
        if let Ok(d) = &result {
            for v in &d.policies {
                if action == Action::Apply {
                    self.metrics
                        .status
                        .decided(&v.policy, v.allowed, d.without_redis);
                }
                if d.without_redis {
                    let decision = if v.allowed { "allowed" } else { "denied" };
                    m.without_redis
                        .with_label_values(&[&v.policy, decision])
                        .inc();
                } else if action == Action::Apply && d.admitted && v.remaining * 10 < v.limit {
                    m.near_limit.with_label_values(&[&v.policy]).inc();
                }
            }
        }
        result
    }

    /// Hit counter `name`; when Redis is unreachable and deferral is set up, write the hit to
    /// the topic instead (see [`defer`]'s guarantee).
    pub async fn hit_or_defer(
        &self,
        name: &str,
        values: &BTreeMap<String, String>,
        hit: &Hit,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<HitOutcome, RequestError> {
        let err = match self.hit(name, values, hit, Action::Apply).await {
            Ok(reply) => return Ok(HitOutcome::Counted(reply)),
            // Only when Redis surely did not run the hit: after a timeout it may have counted it.
            Err(e) if e.did_not_run() => e,
            Err(e) => return Err(e),
        };
        let Some(deferral) = &self.deferral else {
            return Err(err);
        };
        let spec = self.counters.spec(name)?;
        let at = hit
            .at_ms
            .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
        match deferral.write(spec, values, extra, hit.delta, at).await? {
            Some((partition, offset)) => {
                self.metrics.request.deferred.inc();
                Ok(HitOutcome::Deferred {
                    deferred: true,
                    partition,
                    offset,
                })
            }
            None => Err(err),
        }
    }
}
