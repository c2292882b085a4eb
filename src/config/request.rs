//! The request path's configuration: named rate-limit policies, quotas, once-per-window
//! markers, unique-in-window families and pools. Hits use the counters of `[[counters]]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tally_counters::request::{Batching, Durability, LimitPolicy};

use super::validate::invalid;
use super::ConfigError;

/// `[request]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestConfig {
    /// Rate-limit policies (`[[request.limits]]`).
    pub limits: Vec<LimitPolicy>,
    /// Quotas: the first N win (`[[request.quotas]]`).
    pub quotas: Vec<QuotaConfig>,
    /// Once per subject and window (`[[request.once]]`).
    pub once: Vec<OnceConfig>,
    /// Distinct items per subject in a sliding window (`[[request.unique]]`).
    pub unique: Vec<UniqueConfig>,
    /// Pools of items handed out once each (`[[request.pools]]`).
    pub pools: Vec<PoolConfig>,
    /// How concurrent limit decisions share Redis script calls (`[request.batch]`).
    pub batch: BatchConfig,
    /// What every request-path write waits for before it is answered (`[request.durability]`):
    /// replicas that must have it. A quota, pool, once or unique family may set its own.
    pub durability: Durability,
    /// Locks (`[request.locks]`).
    pub locks: LocksConfig,
}

/// `[request.locks]`: settings every lock of the HTTP API and the CLI shares.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocksConfig {
    /// What an acquire, extend or release waits for before it is answered (unset: the global
    /// `[request.durability]`). A lease a failover can undo lets a second holder in.
    pub durability: Option<Durability>,
}

/// `[request.batch]`: limit decisions that arrive while `in_flight` script calls are already
/// out queue and go as one call of the batch script (group commit); each keeps its own answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most decisions in one script call; 1 turns batching off (every decision is sent alone,
    /// none waits for a slot).
    pub max_calls: usize,
    /// Script calls in flight before further decisions queue and share a call.
    pub in_flight: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        let b = Batching::default();
        BatchConfig {
            max_calls: b.max_calls,
            in_flight: b.in_flight,
        }
    }
}

impl BatchConfig {
    /// The client's batching: [`Batching::OFF`] when `max_calls` is 1.
    pub fn batching(&self) -> Batching {
        if self.max_calls <= 1 {
            return Batching::OFF;
        }
        Batching {
            max_calls: self.max_calls,
            in_flight: self.in_flight,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1000).contains(&self.max_calls) {
            return Err(invalid(
                "request.batch.max_calls",
                "must be between 1 and 1000",
            ));
        }
        if !(1..=1024).contains(&self.in_flight) {
            return Err(invalid(
                "request.batch.in_flight",
                "must be between 1 and 1024",
            ));
        }
        Ok(())
    }
}

/// One quota.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Name (part of the key, metric label).
    pub name: String,
    /// Units to hand out.
    pub size: u64,
    /// A user takes at most one unit; calls must name the user.
    #[serde(default)]
    pub once_per_user: bool,
    /// The quota's state expires this long after its last take.
    #[serde(with = "humantime_serde", default = "one_week")]
    pub ttl: Duration,
    /// Replicas that must have this family's writes before an answer (else the global
    /// `[request.durability]`).
    #[serde(default)]
    pub durability: Option<Durability>,
}

/// One once-per-window family.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnceConfig {
    /// Name.
    pub name: String,
    /// Window length (divides a day), aligned in `timezone`.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// IANA time zone.
    #[serde(default = "utc")]
    pub timezone: String,
    /// Replicas that must have this family's writes before an answer (else the global
    /// `[request.durability]`).
    #[serde(default)]
    pub durability: Option<Durability>,
}

/// One unique-in-window family.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UniqueConfig {
    /// Name.
    pub name: String,
    /// The sliding window.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Most distinct items kept per subject (1 to 10,000,000): beyond, the least recently seen
    /// are forgotten and the count stays at this number (bounds a subject's memory).
    #[serde(default = "default_max_items")]
    pub max_items: u64,
    /// Replicas that must have this family's writes before an answer (else the global
    /// `[request.durability]`).
    #[serde(default)]
    pub durability: Option<Durability>,
}

fn default_max_items() -> u64 {
    tally_counters::request::DEFAULT_MAX_ITEMS
}

/// One pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Name.
    pub name: String,
    /// The pool's state expires this long after it was last filled or claimed from.
    #[serde(with = "humantime_serde", default = "one_week")]
    pub ttl: Duration,
    /// Replicas that must have this family's writes before an answer (else the global
    /// `[request.durability]`).
    #[serde(default)]
    pub durability: Option<Durability>,
}

/// At most 16 replicas, a positive timeout of at most a minute (a caller waits for it).
fn check_durability(at: &str, d: &Durability) -> Result<(), ConfigError> {
    if d.replicas > 16 {
        return Err(invalid(format!("{at}.replicas"), "at most 16"));
    }
    if d.timeout.is_zero() || d.timeout > Duration::from_secs(60) {
        return Err(invalid(
            format!("{at}.timeout"),
            "must be positive and at most 60s",
        ));
    }
    Ok(())
}

fn one_week() -> Duration {
    Duration::from_secs(7 * 86_400)
}

fn utc() -> String {
    "UTC".into()
}

impl RequestConfig {
    /// Names unique per kind, numbers in range, windows usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.batch.validate()?;
        check_durability("request.durability", &self.durability)?;
        if let Some(d) = &self.locks.durability {
            check_durability("request.locks.durability", d)?;
        }
        let own = self
            .limits
            .iter()
            .map(|l| ("limits", l.durability))
            .chain(self.quotas.iter().map(|q| ("quotas", q.durability)))
            .chain(self.once.iter().map(|o| ("once", o.durability)))
            .chain(self.unique.iter().map(|u| ("unique", u.durability)))
            .chain(self.pools.iter().map(|p| ("pools", p.durability)));
        for (i, (kind, d)) in own.enumerate() {
            if let Some(d) = d {
                check_durability(&format!("request.{kind}[{i}].durability"), &d)?;
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, p) in self.limits.iter().enumerate() {
            p.validate()
                .map_err(|e| invalid(format!("request.limits[{i}]"), e.to_string()))?;
            if !names.insert(("limit", p.name.as_str())) {
                return Err(invalid(format!("request.limits[{i}].name"), "used twice"));
            }
        }
        for (i, q) in self.quotas.iter().enumerate() {
            let at = |f: &str| format!("request.quotas[{i}].{f}");
            check_name(&at("name"), &q.name, &mut names, "quota")?;
            if q.size == 0 || q.size > i64::MAX as u64 {
                return Err(invalid(at("size"), "must be between 1 and 2^63-1"));
            }
            check_ttl(&at("ttl"), q.ttl)?;
        }
        for (i, o) in self.once.iter().enumerate() {
            let at = |f: &str| format!("request.once[{i}].{f}");
            check_name(&at("name"), &o.name, &mut names, "once")?;
            self.once_window(o)
                .map_err(|e| invalid(at("window"), e.to_string()))?;
        }
        for (i, u) in self.unique.iter().enumerate() {
            let at = |f: &str| format!("request.unique[{i}].{f}");
            check_name(&at("name"), &u.name, &mut names, "unique")?;
            check_ttl(&at("window"), u.window)?;
            if !(1..=10_000_000).contains(&u.max_items) {
                return Err(invalid(at("max_items"), "must be between 1 and 10000000"));
            }
        }
        for (i, p) in self.pools.iter().enumerate() {
            let at = |f: &str| format!("request.pools[{i}].{f}");
            check_name(&at("name"), &p.name, &mut names, "pool")?;
            check_ttl(&at("ttl"), p.ttl)?;
        }
        Ok(())
    }

    /// The window of a once family.
    pub fn once_window(
        &self,
        o: &OnceConfig,
    ) -> Result<tally_counters::window::WindowSpec, OnceWindowError> {
        let tz: chrono_tz::Tz = o
            .timezone
            .parse()
            .map_err(|_| OnceWindowError::UnknownTimeZone(o.timezone.clone()))?;
        Ok(tally_counters::window::WindowSpec::new(o.window, tz)?)
    }
}

/// Why a once family's window cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OnceWindowError {
    /// Not a time zone of the IANA database.
    #[error("`{0}` is not an IANA time zone")]
    UnknownTimeZone(String),
    /// A window size the key's time pattern cannot name.
    #[error(transparent)]
    Window(#[from] tally_counters::window::WindowError),
}

fn check_name<'a>(
    key: &str,
    name: &'a str,
    names: &mut std::collections::HashSet<(&'static str, &'a str)>,
    kind: &'static str,
) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(invalid(key, "must not be empty"));
    }
    if !names.insert((kind, name)) {
        return Err(invalid(key, "used twice"));
    }
    Ok(())
}

fn check_ttl(key: &str, ttl: Duration) -> Result<(), ConfigError> {
    if ttl < Duration::from_millis(1) || ttl > Duration::from_secs(366 * 86_400) {
        return Err(invalid(key, "must be between 1ms and 366 days"));
    }
    Ok(())
}
