//! One bucket's usage as a report states it, read and bounded. Pure: the session calls it
//! before anything reaches Redis, and the `rlqs_report` fuzz target drives it from raw bytes.
//!
//! # Reported usage is bounded by what was granted
//!
//! A report's allowed requests are added to the window that every Envoy shares, so a report
//! beyond what its Envoy could have admitted would deny the bucket to every other Envoy until
//! the window ends. What one stream may report for a bucket is what it was sent since its
//! previous report — its last grant and the reserve for the round trip, the reservation the
//! ledger holds for it — plus `rlqs.report_slack`; the rest is the *excess*: not counted,
//! counted in a metric and logged. The slack covers what an honest Envoy admits outside its
//! grants (before a bucket's first assignment, from an old assignment after a reconnect) and
//! is earned back over one report interval, so that reporting faster earns none.

use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

use super::{MAX_BUCKET_BYTES, MAX_BUCKET_KEYS};
use crate::ops::metrics::QuotaSkip;

/// A bucket id as a sorted list of its pairs.
pub type Id = Vec<(String, String)>;

/// One bucket's report, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The id as sent (answers carry it back).
    pub bucket_id: BucketId,
    /// Its pairs, sorted: the stream's key for it.
    pub id: Id,
    /// Requests Envoy says it admitted since its previous report (not yet bounded).
    pub allowed: u64,
    /// Requests Envoy says it denied.
    pub denied: u64,
    /// The time Envoy says the report covers (whole seconds; zero when absent or negative).
    pub said: Duration,
}

/// Why a bucket's usage cannot be read (`tally_rlqs_skipped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// No bucket id, an empty one, or one past the caps on pairs and bytes.
    #[error("a bucket id that is missing, empty, or past the caps on pairs and bytes")]
    InvalidBucket,
}

impl Unreadable {
    pub fn reason(self) -> QuotaSkip {
        match self {
            Unreadable::InvalidBucket => QuotaSkip::InvalidBucket,
        }
    }
}

/// `usage`, its id checked against the caps ([`Report::from_pb`]).
pub fn read(usage: BucketQuotaUsage) -> Result<Report, Unreadable> {
    Report::from_pb(usage)
}

impl Report {
    /// The parse step of a bucket's report: its id checked against the caps and sorted, the
    /// time it covers in whole seconds.
    pub fn from_pb(usage: BucketQuotaUsage) -> Result<Report, Unreadable> {
        let (bucket_id, id) = usage
            .bucket_id
            .and_then(checked)
            .ok_or(Unreadable::InvalidBucket)?;
        let said = usage.time_elapsed.map_or(Duration::ZERO, |d| {
            Duration::from_secs(d.seconds.max(0) as u64)
        });
        Ok(Report {
            bucket_id,
            id,
            allowed: usage.num_requests_allowed,
            denied: usage.num_requests_denied,
            said,
        })
    }
}

/// The bucket id, and its pairs sorted, if within the caps and not empty.
fn checked(id: BucketId) -> Option<(BucketId, Id)> {
    let n = id.bucket.len();
    let fits = |s: &String| s.len() <= MAX_BUCKET_BYTES;
    if n == 0 || n > MAX_BUCKET_KEYS || !id.bucket.iter().all(|(k, v)| fits(k) && fits(v)) {
        return None;
    }
    let mut pairs: Id = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    pairs.sort_unstable();
    Some((id, pairs))
}

/// What of a report's allowed requests counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// Added to the window.
    pub counted: u64,
    /// Reported beyond what the stream was granted and its slack: dropped.
    pub excess: u64,
}

/// The slack a bucket's report may use: all of `slack` at the bucket's first report on the
/// stream (`since_previous` = None), else earned back in proportion to the time since its
/// previous report, in full after `interval`.
pub fn slack_earned(slack: u64, since_previous: Option<Duration>, interval: Duration) -> u64 {
    let Some(since) = since_previous else {
        return slack;
    };
    let interval_ms = interval.as_millis().max(1);
    let earned = u128::from(slack) * since.as_millis().min(interval_ms) / interval_ms;
    earned as u64
}

/// `reported` allowed requests bounded by what was `granted` since the previous report plus
/// the `slack` earned.
pub fn count(reported: u64, granted: u64, slack: u64) -> Counted {
    let counted = reported.min(granted.saturating_add(slack));
    Counted {
        counted,
        excess: reported - counted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_up_to_its_grant_and_slack() {
        assert_eq!(
            count(100, 168, 10),
            Counted {
                counted: 100,
                excess: 0
            }
        );
        assert_eq!(
            count(1_000_000_000_000_000, 168, 10),
            Counted {
                counted: 178,
                excess: 1_000_000_000_000_000 - 178
            }
        );
        assert_eq!(count(u64::MAX, u64::MAX, u64::MAX).excess, 0);
    }

    #[test]
    fn slack_is_earned_back_over_one_interval() {
        let interval = Duration::from_secs(5);
        assert_eq!(slack_earned(10, None, interval), 10);
        assert_eq!(slack_earned(10, Some(Duration::ZERO), interval), 0);
        assert_eq!(
            slack_earned(10, Some(Duration::from_millis(2500)), interval),
            5
        );
        assert_eq!(
            slack_earned(10, Some(Duration::from_secs(60)), interval),
            10
        );
        assert_eq!(
            slack_earned(u64::MAX, Some(Duration::MAX), interval),
            u64::MAX
        );
    }

    #[test]
    fn bucket_ids_past_the_caps_are_unreadable() {
        let usage = |pairs: Vec<(String, String)>| BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: pairs.into_iter().collect(),
            }),
            ..BucketQuotaUsage::default()
        };
        let long = "x".repeat(MAX_BUCKET_BYTES + 1);
        for bad in [
            vec![],
            vec![("k".to_string(), long)],
            (0..=MAX_BUCKET_KEYS)
                .map(|i| (i.to_string(), String::new()))
                .collect(),
        ] {
            assert_eq!(read(usage(bad)), Err(Unreadable::InvalidBucket));
        }
        assert_eq!(
            read(BucketQuotaUsage::default()),
            Err(Unreadable::InvalidBucket)
        );
        let ok = read(usage(vec![
            ("b".into(), "2".into()),
            ("a".into(), "1".into()),
        ]))
        .unwrap();
        assert_eq!(
            ok.id,
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
    }
}
