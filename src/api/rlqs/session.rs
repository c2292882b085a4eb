//! One stream: one Envoy's reports in, its assignments out. The stream's domain is the first
//! report's; each bucket it reports is matched once to a limit, then every report of it is
//! recorded in the ledger and answered with a new grant (or `AbandonAction` once idle).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use futures::stream::{BoxStream, StreamExt as _};
use tally_counters::request::{Ledger, LedgerAsk, Need};

use super::assign::{self, Budget, Demand};
use super::slots::{Client, StreamPermit};
use super::usage::{self, Id};
use super::Rules;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::Metrics;

/// What the stream knows of one of its buckets.
struct Tracked {
    /// Index of its limit in [`Rules::buckets`].
    limit: usize,
    /// When it last reported, to measure its demand.
    last_report: Instant,
    /// When it last reported a request, for `abandon_after`.
    last_active: Instant,
    /// Allowed requests reported while Redis could not take them: added to the next report.
    unrecorded: u64,
    /// What it may admit until its next report: the reservation last stored for it (its grant
    /// and the reserve for the round trip), which bounds what its next report counts.
    granted: u64,
}

/// One Envoy's stream.
pub(super) struct Session {
    rules: Arc<Rules>,
    ledger: Ledger,
    metrics: Metrics,
    /// This stream's name in the ledger (random, so replicas never share one).
    holder: String,
    /// From the first report.
    domain: Option<String>,
    buckets: HashMap<Id, Tracked>,
    /// Who opened the stream, for the log of a report beyond its grants.
    client: Client,
    /// Limits those lines, across every stream of the replica.
    log: Arc<LogLimiter>,
}

/// Counts the stream open until dropped, holding its slot.
struct Open {
    metrics: Metrics,
    _permit: StreamPermit,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.rls.quota.streams.dec();
    }
}

impl Session {
    pub(super) fn new(
        rules: Arc<Rules>,
        ledger: Ledger,
        metrics: Metrics,
        client: Client,
        log: Arc<LogLimiter>,
    ) -> Session {
        Session {
            rules,
            ledger,
            metrics,
            holder: format!("{:032x}", rand::random::<u128>()),
            domain: None,
            buckets: HashMap::new(),
            client,
            log,
        }
    }

    /// The answers to `inbound`, one message per report that changed something, until the
    /// Envoy closes its side (or breaks the stream), or sends no report for `assignment_ttl`.
    ///
    /// Why that deadline: Envoy reports every bucket it holds at every interval (5 s in 1.40),
    /// and the TTL is longer than the interval; a stream silent for a whole TTL holds no
    /// assignment that is still in force (nor a reservation: those lapse a second later), so
    /// closing it takes nothing from an Envoy, which opens a new one with its next report. A
    /// stream that never reports would otherwise hold its slot for good.
    pub(super) fn run(
        self,
        inbound: tonic::Streaming<RateLimitQuotaUsageReports>,
        permit: StreamPermit,
    ) -> BoxStream<'static, Result<RateLimitQuotaResponse, tonic::Status>> {
        self.metrics.rls.quota.streams.inc();
        let open = Open {
            metrics: self.metrics.clone(),
            _permit: permit,
        };
        futures::stream::unfold(Some((self, inbound, open)), |state| async move {
            let (mut session, mut inbound, open) = state?;
            let deadline = session.rules.ttl;
            loop {
                let Ok(next) = tokio::time::timeout(deadline, inbound.message()).await else {
                    session.skip("report_timeout");
                    tracing::debug!(client = %session.client, "rlqs stream closed: no report within rlqs.assignment_ttl");
                    let status = tonic::Status::deadline_exceeded(
                        "no report within rlqs.assignment_ttl: the stream is closed",
                    );
                    return Some((Err(status), None));
                };
                match next {
                    Ok(Some(reports)) => match session.on_reports(reports).await {
                        Ok(Some(answer)) => {
                            return Some((Ok(answer), Some((session, inbound, open))))
                        }
                        Ok(None) => continue,
                        Err(status) => return Some((Err(status), None)),
                    },
                    Ok(None) => return None,
                    Err(status) => {
                        tracing::debug!(%status, "rlqs stream ended");
                        return None;
                    }
                }
            }
        })
        .boxed()
    }

    async fn on_reports(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        if self.domain.is_none() {
            if reports.domain.is_empty() {
                self.skip("no_domain");
                return Err(tonic::Status::invalid_argument(
                    "the stream's first report names no domain",
                ));
            }
            self.domain = Some(reports.domain);
        }
        let mut actions = Vec::new();
        for usage in reports.bucket_quota_usages {
            actions.extend(self.on_usage(usage).await);
        }
        Ok((!actions.is_empty()).then_some(RateLimitQuotaResponse {
            bucket_action: actions,
        }))
    }

    fn skip(&self, reason: &str) {
        self.metrics
            .rls
            .quota
            .skipped
            .with_label_values(&[reason])
            .inc();
    }

    /// The allowed requests of `usage` that count: at most what the stream was `granted` since
    /// its previous report (`since_previous` ago; None: the bucket's first) and the slack; the
    /// excess is counted and logged with the client.
    fn counted(
        &self,
        usage: &usage::Usage,
        granted: u64,
        since_previous: Option<Duration>,
        labels: [&str; 2],
    ) -> u64 {
        let rules = &self.rules;
        let slack = usage::slack_earned(rules.slack, since_previous, rules.report_interval);
        let usage::Counted { counted, excess } = usage::count(usage.allowed, granted, slack);
        if excess > 0 {
            self.metrics
                .rls
                .quota
                .excess
                .with_label_values(&labels)
                .inc_by(excess);
            if let Some(suppressed) = self.log.allow() {
                tracing::warn!(
                    client = %self.client,
                    peer = %self.client.peer,
                    domain = labels[0],
                    limit = labels[1],
                    bucket = ?usage.id,
                    reported = usage.allowed,
                    counted,
                    excess,
                    suppressed,
                    "rlqs report beyond its grants: the excess is not counted"
                );
            }
        }
        counted
    }

    /// One bucket's report: bounded by its grants, recorded, then answered with a grant
    /// (none: skipped, counted).
    async fn on_usage(&mut self, usage: BucketQuotaUsage) -> Vec<BucketAction> {
        let usage = match usage::read(usage) {
            Ok(u) => u,
            Err(e) => {
                self.skip(e.reason());
                return Vec::new();
            }
        };
        let (bucket_id, id) = (usage.bucket_id.clone(), usage.id.clone());
        let rules = self.rules.clone();
        let domain = self.domain.clone().unwrap_or_default();
        let now = Instant::now();
        let limit = match self.buckets.get(&id) {
            Some(t) => t.limit,
            None if self.buckets.len() >= rules.max_buckets => {
                self.skip("too_many_buckets");
                return Vec::new();
            }
            None => match rules.find(&domain, &id) {
                Some(i) => i,
                None => {
                    self.skip("no_limit");
                    return Vec::new();
                }
            },
        };
        let rule = &rules.buckets[limit];
        let labels = [domain.as_str(), rule.name.as_str()];
        let m = &self.metrics.rls.quota;
        let denied = usage.denied;
        m.reported
            .with_label_values(&[labels[0], labels[1], "allowed"])
            .inc_by(usage.allowed);
        m.reported
            .with_label_values(&[labels[0], labels[1], "denied"])
            .inc_by(denied);
        let (first, granted, since_previous) = match self.buckets.get(&id) {
            Some(t) => (false, t.granted, Some(now.duration_since(t.last_report))),
            None => (true, 0, None),
        };
        let allowed = self.counted(&usage, granted, since_previous, labels);
        let tracked = self.buckets.entry(id.clone()).or_insert(Tracked {
            limit,
            last_report: now.checked_sub(rules.report_interval).unwrap_or(now),
            last_active: now,
            unrecorded: 0,
            granted: 0,
        });
        // Demand from what counts: a report cannot claim the budget with requests it was
        // never granted.
        let offered = allowed.saturating_add(denied);
        if offered > 0 {
            tracked.last_active = now;
        } else if now.duration_since(tracked.last_active) >= rules.abandon_after {
            let (keys, _) = window_keys(&self.ledger, &domain, &id, rule.window);
            if self.ledger.release(&keys, &self.holder).await.is_err() {
                // The reservation lapses at its expiry anyway.
                self.skip("redis");
            }
            self.buckets.remove(&id);
            m.actions
                .with_label_values(&[labels[0], labels[1], "abandon"])
                .inc();
            return vec![BucketAction {
                bucket_id: Some(bucket_id),
                bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
            }];
        }
        // Measured here, or as Envoy says (whole seconds) when longer: a report delayed on its
        // way must not look like a burst.
        let elapsed = now.duration_since(tracked.last_report).max(usage.said);
        let period = elapsed.max(rules.report_interval).min(rules.ttl);
        let mut me = Demand {
            rate: offered as f64 / elapsed.as_secs_f64().max(0.001),
            period,
        };
        tracked.last_report = now;
        let recorded = allowed.saturating_add(tracked.unrecorded);
        let (keys, now_ms) = window_keys(&self.ledger, &domain, &id, rule.window);
        let standing = match self
            .ledger
            .report(&keys, &self.holder, recorded, now_ms)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "rlqs report not recorded");
                tracked.unrecorded = recorded;
                self.skip("redis");
                return Vec::new();
            }
        };
        tracked.unrecorded = 0;
        let others: Vec<Demand> = standing
            .others
            .iter()
            .map(|n| Demand {
                rate: n.rate_milli as f64 / 1000.0,
                period: Duration::from_millis(n.period_ms),
            })
            .collect();
        if first {
            me.rate = assign::first_rate(me.rate, &others, rule.limit, rule.window);
        }
        let budget = Budget {
            limit: rule.limit,
            used: standing.used,
        };
        let ask = LedgerAsk {
            desired: assign::desired(budget, me, &others, rules.tuning),
            gap: me.gap(),
            limit: rule.limit,
            // Envoy applies it a round trip from now and keeps it `ttl`: reserved a second more.
            expires_at_ms: now_ms + rules.ttl.as_millis() as i64 + 1000,
            need: Need {
                rate_milli: (me.rate * 1000.0).min(1e15) as u64,
                period_ms: period.as_millis() as u64,
            },
        };
        let desired = ask.desired;
        let granted = match self.ledger.grant(&keys, &self.holder, ask, now_ms).await {
            Ok(g) => g,
            Err(e) => {
                // Its allowed requests are in the window; the Envoy keeps its assignment.
                tracing::debug!(error = %e, "rlqs grant not stored");
                self.skip("redis");
                return Vec::new();
            }
        };
        tracked.granted = granted.reserved;
        tracing::debug!(
            domain,
            limit = %rule.name,
            allowed,
            denied,
            used = granted.used,
            desired,
            grant = granted.grant,
            "rlqs grant"
        );
        let action = if granted.grant == 0 {
            "deny_all"
        } else {
            "grant"
        };
        m.actions
            .with_label_values(&[labels[0], labels[1], action])
            .inc();
        m.granted.with_label_values(&labels).inc_by(granted.grant);
        m.used
            .with_label_values(&labels)
            .set(granted.used.min(i64::MAX as u64) as i64);
        assignment(bucket_id, granted.grant, rules.ttl)
    }
}

/// The bucket's ledger keys in the window (of length `window`) holding now, and now (Unix ms).
fn window_keys(
    ledger: &Ledger,
    domain: &str,
    id: &Id,
    window: Duration,
) -> (tally_counters::request::BucketKeys, i64) {
    let now_ms = tally_counters::clock::unix_ms();
    let len = window.as_millis().max(1) as i64;
    let start = now_ms - now_ms.rem_euclid(len);
    let pairs: Vec<(&str, &str)> = id.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    (ledger.keys(domain, &pairs, start, start + len), now_ms)
}

/// The assignment of `grant` requests: a token bucket that admits at most them within
/// `ttl` ([`assign::Shape`]); `DENY_ALL` for none.
///
/// A grant goes after a `DENY_ALL` of the same bucket in the same answer. Envoy applies an
/// answer's actions in order and publishes the result once, so no request sees the `DENY_ALL`;
/// but Envoy starts a token bucket that replaces another with the other's remaining share
/// (1.40), which would turn a fresh grant after a spent one into an empty bucket. After a
/// blanket rule, it starts full.
fn assignment(bucket_id: BucketId, grant: u64, ttl: Duration) -> Vec<BucketAction> {
    let action = |strategy: Strategy| BucketAction {
        bucket_id: Some(bucket_id.clone()),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: Some(PbDuration {
                    seconds: ttl.as_secs() as i64,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    };
    let deny = action(Strategy::BlanketRule(BlanketRule::DenyAll as i32));
    match assign::Shape::of(grant, ttl) {
        None => vec![deny],
        Some(shape) => vec![
            deny,
            action(Strategy::TokenBucket(TokenBucket {
                max_tokens: shape.max_tokens,
                tokens_per_fill: Some(UInt32Value {
                    value: shape.tokens_per_fill,
                }),
                fill_interval: Some(PbDuration {
                    seconds: shape.fill_interval_s as i64,
                    nanos: 0,
                }),
            })),
        ],
    }
}
