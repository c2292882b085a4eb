//! One stream: one Envoy's reports in, its assignments out. The stream's domain is the first
//! report's; each bucket it reports is matched once to a limit, then every report of it is
//! recorded in the ledger and answered with a new grant (or `AbandonAction` once idle).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures::stream::{BoxStream, StreamExt as _};
use tally_counters::request::{Granted, Ledger};

use super::assign::{self, Demand, Measured};
use super::render::BucketAssignment;
use super::slots::{StreamClient, StreamPermit};
use super::usage::{self, Id, Report};
use super::QuotaRules;
use crate::config::RlqsBucket;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::{Metrics, QuotaAction, QuotaSkip, ReportedOutcome};

/// What the stream knows of one of its buckets.
struct Tracked {
    /// Index of its limit in [`QuotaRules::buckets`].
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
    rules: Arc<QuotaRules>,
    ledger: Ledger,
    metrics: Metrics,
    /// This stream's name in the ledger (random, so replicas never share one).
    holder: String,
    /// From the first report.
    domain: Option<String>,
    buckets: HashMap<Id, Tracked>,
    /// Who opened the stream, for the log of a report beyond its grants.
    client: StreamClient,
    /// Limits those lines, across every stream of the replica.
    log: Arc<LogLimiter>,
}

/// Counts the stream open until dropped, holding its slot.
struct OpenStream {
    metrics: Metrics,
    _permit: StreamPermit,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.metrics.rls.quota.streams.dec();
    }
}

impl Session {
    pub(super) fn new(
        rules: Arc<QuotaRules>,
        ledger: Ledger,
        metrics: Metrics,
        client: StreamClient,
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
        let open = OpenStream {
            metrics: self.metrics.clone(),
            _permit: permit,
        };
        futures::stream::unfold(Some((self, inbound, open)), |state| async move {
            let (mut session, mut inbound, open) = state?;
            let deadline = session.rules.ttl;
            loop {
                let Ok(next) = tokio::time::timeout(deadline, inbound.message()).await else {
                    session.skip(QuotaSkip::ReportTimeout);
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
                self.skip(QuotaSkip::NoDomain);
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

    fn skip(&self, reason: QuotaSkip) {
        self.metrics.rls.quota.skip(reason);
    }

    /// The allowed requests of `usage` that count: at most what the stream was `granted` since
    /// its previous report (`since_previous` ago; None: the bucket's first) and the slack; the
    /// excess is counted and logged with the client.
    fn counted(
        &self,
        usage: &Report,
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

    /// One bucket's report, in steps: parsed ([`Report::from_pb`]), matched to its limit, measured
    /// (its allowed requests bounded by its grants, its demand), recorded in the ledger with
    /// the grant [`assign::next_grant`] decides, answered ([`BucketAssignment`]). A report that
    /// cannot be answered is skipped and counted.
    async fn on_usage(&mut self, usage: BucketQuotaUsage) -> Vec<BucketAction> {
        let report = match Report::from_pb(usage) {
            Ok(u) => u,
            Err(e) => {
                self.skip(e.reason());
                return Vec::new();
            }
        };
        let Some(limit) = self.limit_of(&report.id) else {
            return Vec::new();
        };
        let rules = self.rules.clone();
        let bucket = &rules.buckets[limit];
        let domain = self.domain.clone().unwrap_or_default();
        let labels = [domain.as_str(), bucket.name.as_str()];
        let m = &self.metrics.rls.quota;
        m.report(labels, ReportedOutcome::Allowed, report.allowed);
        m.report(labels, ReportedOutcome::Denied, report.denied);
        let Some(round) = self.measure(&report, limit, labels, Instant::now()) else {
            self.abandon(&report.id, bucket, &domain).await;
            self.metrics.rls.quota.act(labels, QuotaAction::Abandon);
            return BucketAssignment::Abandon.to_pb(report.bucket_id);
        };
        let Some((granted, desired)) = self.grant(&report.id, bucket, &domain, round).await else {
            return Vec::new();
        };
        tracing::debug!(
            domain,
            limit = %bucket.name,
            allowed = round.allowed,
            denied = report.denied,
            used = granted.used,
            desired,
            grant = granted.grant,
            "rlqs grant"
        );
        let m = &self.metrics.rls.quota;
        let action = if granted.grant == 0 {
            QuotaAction::DenyAll
        } else {
            QuotaAction::Grant
        };
        m.act(labels, action);
        m.granted.with_label_values(&labels).inc_by(granted.grant);
        m.used
            .with_label_values(&labels)
            .set(granted.used.min(i64::MAX as u64) as i64);
        let assignment = BucketAssignment::Grant {
            grant: granted.grant,
            ttl: rules.ttl,
        };
        assignment.to_pb(report.bucket_id)
    }

    /// The index of the limit of bucket `id`: its own once seen, else the first that matches
    /// (`None`, counted: no limit, or the stream holds `max_buckets` already).
    fn limit_of(&self, id: &Id) -> Option<usize> {
        if let Some(t) = self.buckets.get(id) {
            return Some(t.limit);
        }
        if self.buckets.len() >= self.rules.max_buckets {
            self.skip(QuotaSkip::TooManyBuckets);
            return None;
        }
        let domain = self.domain.as_deref().unwrap_or_default();
        let found = self.rules.find(domain, id);
        if found.is_none() {
            self.skip(QuotaSkip::NoLimit);
        }
        found
    }

    /// The report's round: its allowed requests bounded by its grants, what goes to the ledger,
    /// its demand. `None` when the bucket has been idle for `abandon_after` (no request in this
    /// report nor since).
    fn measure(
        &mut self,
        report: &Report,
        limit: usize,
        labels: [&str; 2],
        now: Instant,
    ) -> Option<Round> {
        let rules = self.rules.clone();
        let (first, granted, since_previous) = match self.buckets.get(&report.id) {
            Some(t) => (false, t.granted, Some(now.duration_since(t.last_report))),
            None => (true, 0, None),
        };
        let allowed = self.counted(report, granted, since_previous, labels);
        let tracked = self.buckets.entry(report.id.clone()).or_insert(Tracked {
            limit,
            last_report: now.checked_sub(rules.report_interval).unwrap_or(now),
            last_active: now,
            unrecorded: 0,
            granted: 0,
        });
        // Demand from what counts: a report cannot claim the budget with requests it was
        // never granted.
        let offered = allowed.saturating_add(report.denied);
        if offered > 0 {
            tracked.last_active = now;
        } else if now.duration_since(tracked.last_active) >= rules.abandon_after {
            return None;
        }
        // Measured here, or as Envoy says (whole seconds) when longer: a report delayed on its
        // way must not look like a burst.
        let elapsed = now.duration_since(tracked.last_report).max(report.said);
        tracked.last_report = now;
        let demand = Demand {
            rate: offered as f64 / elapsed.as_secs_f64().max(0.001),
            period: elapsed.max(rules.report_interval).min(rules.ttl),
        };
        Some(Round {
            allowed,
            recorded: allowed.saturating_add(tracked.unrecorded),
            measured: Measured { demand, first },
        })
    }

    /// Forget an idle bucket and release its reservation.
    async fn abandon(&mut self, id: &Id, bucket: &RlqsBucket, domain: &str) {
        let (keys, _) = window_keys(&self.ledger, domain, id, bucket.window);
        if self.ledger.release(&keys, &self.holder).await.is_err() {
            // The reservation lapses at its expiry anyway.
            self.skip(QuotaSkip::Redis);
        }
        self.buckets.remove(id);
    }

    /// The ledger's two calls: the round recorded, then the grant [`assign::next_grant`] asks
    /// for stored; the grant and what was asked for. `None` (counted) when Redis takes either
    /// not: the Envoy keeps its assignment, and a report not recorded is added to the next.
    async fn grant(
        &mut self,
        id: &Id,
        bucket: &RlqsBucket,
        domain: &str,
        round: Round,
    ) -> Option<(Granted, u64)> {
        let (keys, now_ms) = window_keys(&self.ledger, domain, id, bucket.window);
        let report = self
            .ledger
            .report(&keys, &self.holder, round.recorded, now_ms)
            .await;
        let standing = match report {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "rlqs report not recorded");
                self.track(id, |t| t.unrecorded = round.recorded);
                self.skip(QuotaSkip::Redis);
                return None;
            }
        };
        self.track(id, |t| t.unrecorded = 0);
        let rules = &self.rules;
        // Envoy applies it a round trip from now and keeps it `ttl`: reserved a second more.
        let expires_at_ms = now_ms + rules.ttl.as_millis() as i64 + 1000;
        let ask = assign::next_grant(
            bucket,
            round.measured,
            &standing,
            rules.tuning,
            expires_at_ms,
        );
        let granted = match self.ledger.grant(&keys, &self.holder, ask, now_ms).await {
            Ok(g) => g,
            Err(e) => {
                // Its allowed requests are in the window; the Envoy keeps its assignment.
                tracing::debug!(error = %e, "rlqs grant not stored");
                self.skip(QuotaSkip::Redis);
                return None;
            }
        };
        self.track(id, |t| t.granted = granted.reserved);
        Some((granted, ask.desired))
    }

    /// Change what the stream knows of bucket `id`.
    fn track(&mut self, id: &Id, change: impl FnOnce(&mut Tracked)) {
        if let Some(t) = self.buckets.get_mut(id) {
            change(t);
        }
    }
}

/// One report of a bucket, measured.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// Its allowed requests that count (bounded by its grants).
    allowed: u64,
    /// What the ledger is sent: `allowed` and what Redis did not take before.
    recorded: u64,
    /// Its demand.
    measured: Measured,
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
