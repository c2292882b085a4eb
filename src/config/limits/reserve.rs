//! `reserve` in a limit of the limits file (tally's extension): reserve → settle for
//! usage-priced traffic (LLM tokens). The request reserves an upper bound of its cost, atomically
//! with the admission decision; the response settles the true cost by request id, once.
//!
//! How a call names its phase: the descriptor carries one more entry after the limit's own
//! entries, keyed `reserve_key` (on the request) or `settle_key` (at stream done), whose value
//! is the request's id (Envoy's `x-request-id`). The entry is not part of the counter's
//! subject: both phases, and a plain descriptor without the entry, count on one state.

use super::error::{invalid, LimitsProblem};
use std::time::Duration;

use serde::Deserialize;
use tally_counters::request::{unsupported_for_reservations, LimitPolicy, Phase};

/// A reservation's expiry when none is configured.
const DEFAULT_EXPIRY: Duration = Duration::from_secs(600);

/// `rate_limit.reserve` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveYaml {
    /// Units reserved when the reserving descriptor carries no `hits_addend` of its own (e.g.
    /// the route's largest `max_tokens`); absent: the request's `hits_addend` (at least 1).
    #[serde(default)]
    pub default: Option<u64>,
    /// How long an unsettled reservation holds its units (then it is released), and how long a
    /// settle is remembered (a retried settle within it changes nothing). Default 10m.
    #[serde(default, with = "humantime_serde")]
    pub expiry: Option<Duration>,
    /// Most units a settle charges above its reservation; the rest of a larger true cost is cut
    /// (and counted in `tally_rls_settles_total{result="capped"}`). Default 0: the reservation
    /// is the request's upper bound.
    #[serde(default)]
    pub max_extra: u64,
    /// The descriptor entry that makes a call a reservation; its value is the request's id.
    #[serde(default = "default_reserve_key")]
    pub reserve_key: String,
    /// The descriptor entry that makes a call a settle; its value is the request's id.
    #[serde(default = "default_settle_key")]
    pub settle_key: String,
}

fn default_reserve_key() -> String {
    "reserve".into()
}

fn default_settle_key() -> String {
    "settle".into()
}

/// A limit's compiled `reserve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    /// See [`ReserveYaml::default`].
    pub default: Option<u64>,
    /// See [`ReserveYaml::expiry`].
    pub expiry: Duration,
    /// See [`ReserveYaml::max_extra`].
    pub max_extra: u64,
    /// See [`ReserveYaml::reserve_key`].
    pub reserve_key: String,
    /// See [`ReserveYaml::settle_key`].
    pub settle_key: String,
}

impl Reserve {
    /// Compile `yaml` for `policy`; `usage` and `shadow` are the limit's other modes, which a
    /// reserving limit cannot have.
    pub fn compile(
        yaml: &ReserveYaml,
        policy: &LimitPolicy,
        usage: bool,
        shadow: bool,
    ) -> Result<Reserve, LimitsProblem> {
        if let Some(why) = unsupported_for_reservations(policy) {
            return invalid(format!("reserve: {why}"));
        }
        if usage {
            return invalid("reserve: a reserving limit settles what was used; drop `usage`");
        }
        if shadow {
            return invalid("reserve: a reserving limit cannot be in shadow_mode");
        }
        let expiry = yaml.expiry.unwrap_or(DEFAULT_EXPIRY);
        if expiry < Duration::from_millis(1) || expiry > tally_counters::request::MAX_RESERVATION {
            return invalid("reserve.expiry: must be between 1ms and 1 day");
        }
        match yaml.default {
            Some(0) => return invalid("reserve.default: must be at least 1"),
            Some(d) if d > policy.limit => {
                return invalid(format!(
                    "reserve.default: {d} is above requests_per_unit ({}): no request could pass",
                    policy.limit
                ))
            }
            _ => {}
        }
        if yaml.max_extra > i64::MAX as u64 / 1_000_000 {
            return invalid(format!(
                "reserve.max_extra: {} is out of range",
                yaml.max_extra
            ));
        }
        for (name, key) in [
            ("reserve_key", &yaml.reserve_key),
            ("settle_key", &yaml.settle_key),
        ] {
            if key.is_empty() {
                return invalid(format!("reserve.{name}: must not be empty"));
            }
        }
        if yaml.reserve_key == yaml.settle_key {
            return invalid("reserve: reserve_key and settle_key must differ");
        }
        Ok(Reserve {
            default: yaml.default,
            expiry,
            max_extra: yaml.max_extra,
            reserve_key: yaml.reserve_key.clone(),
            settle_key: yaml.settle_key.clone(),
        })
    }

    /// The phase a descriptor's last entry key names, if it names one.
    pub fn phase_of(&self, key: &str) -> Option<Phase> {
        if key == self.reserve_key {
            Some(Phase::Reserve)
        } else if key == self.settle_key {
            Some(Phase::Settle)
        } else {
            None
        }
    }
}
