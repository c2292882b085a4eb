//! `[rlqs]`: Envoy's rate limit quota service (`envoy.filters.http.rate_limit_quota`) on the
//! RLS port: one global limit per bucket, shared among the Envoys by their reported demand.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::{ensure, invalid};
use super::ConfigError;

/// The quota service's limits and how assignments are made.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlqsConfig {
    /// The limits, first match wins; none disables the service. Served on `rls.listen`
    /// (same TLS, token and connection caps), which must then be set.
    pub buckets: Vec<RlqsBucket>,
    /// The interval between two reports of one Envoy: the length of the first assignment,
    /// before the interval is measured. Envoy 1.40 reports every 5 s whatever its buckets'
    /// `reporting_interval` says (its filter keeps a fixed interval), hence the default. Whole
    /// seconds are what Envoy's timers keep.
    #[serde(with = "humantime_serde")]
    pub report_interval: Duration,
    /// `assignment_time_to_live` of every assignment (whole seconds, as Envoy keeps it): longer
    /// than `report_interval`, so that the next report renews it. When tally stops answering, an
    /// Envoy keeps its last assignment this long, then turns to its
    /// `expired_assignment_behavior`. Each assignment stays reserved in the global budget this
    /// long (plus a second) after it is given, whether or not its Envoy reports again.
    #[serde(with = "humantime_serde")]
    pub assignment_ttl: Duration,
    /// A bucket an Envoy reported no request for (allowed or denied) this long is abandoned
    /// (`AbandonAction`): the Envoy forgets it, and its assignment is released.
    #[serde(with = "humantime_serde")]
    pub abandon_after: Duration,
    /// Requests every subscribed Envoy may admit before its next report even when it reported
    /// none (while the budget lasts), so that a new burst is not denied outright.
    pub floor: u64,
    /// An Envoy is assigned its measured demand times this over the next report interval
    /// (while the budget is larger than every Envoy's need), so that a rising demand is met.
    pub headroom: f64,
    /// Buckets one stream (one Envoy) may subscribe; reports of more are skipped and counted
    /// (`tally_rlqs_skipped_total{reason="too_many_buckets"}`).
    pub max_buckets_per_stream: usize,
    /// Streams served at once by this replica; one more is refused (RESOURCE_EXHAUSTED).
    pub max_streams: usize,
    /// Streams served at once from one peer (an IPv4 address, an IPv6 /64), so that one host
    /// cannot take every one of `max_streams`; one more is refused (RESOURCE_EXHAUSTED).
    pub max_streams_per_peer: usize,
    /// Streams served at once on one connection (an Envoy opens one per filter configuration);
    /// one more is refused (RESOURCE_EXHAUSTED).
    pub max_streams_per_connection: usize,
    /// Requests a report may say a bucket admitted beyond what its stream was granted since
    /// its previous report (its last grant and the reserve for the round trip); earned back
    /// over one report interval. What Envoy admits before a bucket's first assignment and a
    /// report after a reconnect need some; the rest of a report is not counted (logged, and
    /// counted in `tally_rlqs_excess_requests_total`).
    pub report_slack: u64,
}

/// One limit: the buckets it applies to and how many requests each of them may admit, summed
/// over every Envoy, per window.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlqsBucket {
    /// The `domain` of the Envoy filter.
    pub domain: String,
    /// Names the limit in metrics (letters, digits, '_', '-').
    pub name: String,
    /// The bucket ids it applies to: every key here with this value (others may be there
    /// too). Empty: every bucket of the domain. Each distinct bucket id has a limit of its own.
    #[serde(rename = "match", default)]
    pub matches: BTreeMap<String, String>,
    /// Requests per window, across every Envoy and tally replica.
    pub limit: u64,
    /// The window (aligned to the Unix epoch, as the request path's fixed windows), 1s to 1d.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        RlqsConfig {
            buckets: Vec::new(),
            report_interval: Duration::from_secs(5),
            assignment_ttl: Duration::from_secs(10),
            abandon_after: Duration::from_secs(300),
            floor: 1,
            headroom: 2.0,
            max_buckets_per_stream: 1000,
            max_streams: 1024,
            max_streams_per_peer: 64,
            max_streams_per_connection: 16,
            report_slack: 10,
        }
    }
}

/// Largest limit: Envoy's token bucket holds at most `u32::MAX` tokens.
const MAX_LIMIT: u64 = u32::MAX as u64;

impl RlqsConfig {
    /// Whole-second intervals, a TTL longer than the report interval, limits Envoy can hold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.buckets.is_empty() {
            return Ok(());
        }
        self.validate_timing()?;
        self.validate_capacity()?;
        self.validate_buckets()
    }

    /// The report interval and assignment lifetimes, as Envoy keeps them.
    fn validate_timing(&self) -> Result<(), ConfigError> {
        let whole = |d: Duration| d.subsec_nanos() == 0 && !d.is_zero();
        ensure(
            whole(self.report_interval) && self.report_interval <= Duration::from_secs(60),
            "rlqs.report_interval",
            "must be whole seconds, 1s to 60s (Envoy keeps whole seconds)",
        )?;
        ensure(
            whole(self.assignment_ttl)
                && self.assignment_ttl > self.report_interval
                && self.assignment_ttl <= Duration::from_secs(600),
            "rlqs.assignment_ttl",
            "must be whole seconds, longer than rlqs.report_interval and at most 10m",
        )?;
        ensure(
            self.abandon_after >= self.assignment_ttl,
            "rlqs.abandon_after",
            "must be at least rlqs.assignment_ttl",
        )
    }

    /// Headroom, and the bounds on buckets, streams and report slack.
    fn validate_capacity(&self) -> Result<(), ConfigError> {
        ensure(
            (1.0..=100.0).contains(&self.headroom),
            "rlqs.headroom",
            "must be between 1 and 100",
        )?;
        ensure(
            self.max_buckets_per_stream >= 1 && self.max_buckets_per_stream <= 100_000,
            "rlqs.max_buckets_per_stream",
            "must be between 1 and 100000",
        )?;
        ensure(
            self.max_streams >= 1,
            "rlqs.max_streams",
            "must be at least 1",
        )?;
        ensure(
            self.max_streams_per_peer >= 1,
            "rlqs.max_streams_per_peer",
            "must be at least 1",
        )?;
        ensure(
            self.max_streams_per_connection >= 1,
            "rlqs.max_streams_per_connection",
            "must be at least 1",
        )?;
        ensure(
            self.report_slack <= MAX_LIMIT,
            "rlqs.report_slack",
            format!("must be at most {MAX_LIMIT}"),
        )
    }

    /// Each bucket: a domain, a name unique within it, its limit, window and match keys.
    fn validate_buckets(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for (i, b) in self.buckets.iter().enumerate() {
            let at = |field: &str| format!("rlqs.buckets[{i}].{field}");
            ensure(!b.domain.is_empty(), at("domain"), "must not be empty")?;
            let allowed = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
            ensure(
                !b.name.is_empty() && b.name.bytes().all(allowed),
                at("name"),
                "use letters, digits, '_' or '-'",
            )?;
            if !names.insert((&b.domain, &b.name)) {
                return Err(invalid(at("name"), "two limits of one domain share it"));
            }
            ensure(
                (1..=MAX_LIMIT).contains(&b.limit),
                at("limit"),
                format!("must be between 1 and {MAX_LIMIT} (Envoy's token bucket holds a u32)"),
            )?;
            ensure(
                b.window.subsec_nanos() == 0
                    && (Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&b.window),
                at("window"),
                "must be whole seconds, 1s to 1d",
            )?;
            ensure(
                b.matches.len() <= MAX_MATCH_KEYS,
                at("match"),
                format!("at most {MAX_MATCH_KEYS} keys"),
            )?;
        }
        Ok(())
    }
}

/// Keys one limit may match on (a bucket id carries at most `api::rlqs::MAX_BUCKET_KEYS`).
const MAX_MATCH_KEYS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn one(limit: u64) -> RlqsConfig {
        RlqsConfig {
            buckets: vec![RlqsBucket {
                domain: "edge".into(),
                name: "per_user".into(),
                matches: [("name".to_string(), "per_user".to_string())].into(),
                limit,
                window: Duration::from_secs(60),
            }],
            ..RlqsConfig::default()
        }
    }

    fn refused(c: &RlqsConfig) -> String {
        match c.validate() {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_with_one_limit_are_valid() {
        one(1000).validate().unwrap();
        RlqsConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(refused(&one(0)), "rlqs.buckets[0].limit");
        assert_eq!(refused(&one(MAX_LIMIT + 1)), "rlqs.buckets[0].limit");
        let mut c = one(10);
        c.assignment_ttl = c.report_interval;
        assert_eq!(refused(&c), "rlqs.assignment_ttl");
        let mut c = one(10);
        c.report_interval = Duration::from_millis(500);
        assert_eq!(refused(&c), "rlqs.report_interval");
        let mut c = one(10);
        c.buckets[0].window = Duration::from_millis(1500);
        assert_eq!(refused(&c), "rlqs.buckets[0].window");
        let mut c = one(10);
        c.buckets.push(c.buckets[0].clone());
        assert_eq!(refused(&c), "rlqs.buckets[1].name");
        let mut c = one(10);
        c.headroom = 0.5;
        assert_eq!(refused(&c), "rlqs.headroom");
        let mut c = one(10);
        c.max_streams_per_peer = 0;
        assert_eq!(refused(&c), "rlqs.max_streams_per_peer");
        let mut c = one(10);
        c.max_streams_per_connection = 0;
        assert_eq!(refused(&c), "rlqs.max_streams_per_connection");
    }
}
