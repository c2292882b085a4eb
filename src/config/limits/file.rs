//! The limits file as its authors write it: envoyproxy/ratelimit's YAML (one domain per file),
//! (`quota_mode` and `metadata` included), plus tally's extensions in `rate_limit` (`algorithm`,
//! `burst`, `on_redis_error`, `usage`).
//! Inert serde data; [`super`] compiles it.

use serde::Deserialize;
use tally_counters::request::{Algorithm, FailureMode};

/// One file: a domain and its descriptor tree.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainFile {
    /// The domain Envoy names in its request (`domain` of the rate limit filter).
    pub domain: String,
    /// The descriptors at the top of the tree.
    #[serde(default)]
    pub descriptors: Vec<DescriptorYaml>,
}

/// One node of the descriptor tree: an entry `key` (and `value`, or any value when absent).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorYaml {
    /// The entry's key (`generic_key`, `remote_address`, a header's descriptor key…).
    pub key: String,
    /// The entry's value; absent: any value, each counted apart. A `*` matches any run of
    /// characters (envoyproxy/ratelimit's wildcards); the values it matches count apart, unless
    /// `share_threshold`.
    #[serde(default)]
    pub value: Option<String>,
    /// A wildcard `value` only: every value it matches shares one count (envoyproxy/ratelimit's
    /// shared thresholds), e.g. `files/*` limits all files together.
    #[serde(default)]
    pub share_threshold: bool,
    /// The limit of a descriptor that ends at this node.
    #[serde(default)]
    pub rate_limit: Option<RateLimitYaml>,
    /// Deeper entries.
    #[serde(default)]
    pub descriptors: Vec<DescriptorYaml>,
    /// Decide and count, but never deny.
    #[serde(default)]
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's quota mode: this descriptor's limit is a quota; a request is
    /// denied by its quotas only when none of them has room (ordinary limits still deny alone).
    #[serde(default)]
    pub quota_mode: bool,
    /// Returned to Envoy as dynamic metadata (under `metadata`) when this descriptor's limit
    /// passes, for quota-aware routing: a mapping of string keys; checked by [`super::metadata`].
    #[serde(default)]
    pub metadata: Option<serde_yaml_ng::Value>,
    /// envoyproxy/ratelimit: metric names per value. Accepted and ignored: tally's metrics are
    /// per domain and configured descriptor, never per value (bounded labels).
    #[serde(default)]
    pub detailed_metric: bool,
    /// As `detailed_metric`: accepted and ignored.
    #[serde(default)]
    pub value_to_metric: bool,
}

/// A limit: envoyproxy/ratelimit's keys, then tally's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitYaml {
    /// `second`, `minute`, `hour`, `day`, `week`, `month` (30 days) or `year` (365 days).
    #[serde(default)]
    pub unit: Option<String>,
    /// Requests (units) per `unit`.
    #[serde(default)]
    pub requests_per_unit: Option<u64>,
    /// The window is this many `unit`s (envoyproxy/ratelimit's custom window multiples, e.g.
    /// `unit: minute` with `unit_multiplier: 5` for five minutes); 1 by default.
    #[serde(default)]
    pub unit_multiplier: Option<u32>,
    /// Never limited: answers OK with `limit_remaining` 4294967295.
    #[serde(default)]
    pub unlimited: bool,
    /// The limit's name: `replaces` refers to it; metrics and `RateLimit-Policy` show it.
    #[serde(default)]
    pub name: Option<String>,
    /// Limits (by name) that this one replaces when both match one request.
    #[serde(default)]
    pub replaces: Vec<Replaces>,
    /// tally: how it counts (default `fixed`, envoyproxy/ratelimit's windows).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// tally, `gcra` only: the largest burst (default: `requests_per_unit`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// tally: what to answer when Redis cannot be asked; absent: gRPC UNAVAILABLE, so that
    /// Envoy's `failure_mode_deny` decides.
    #[serde(default)]
    pub on_redis_error: Option<FailureMode>,
    /// tally: usage-priced (check, then charge): a `hits_addend` of 0 checks that a unit is
    /// left; above 0 it charges what was used, recorded whatever is left and never denied.
    #[serde(default)]
    pub usage: bool,
    /// tally: reserve → settle (fixed windows only): see [`super::reserve`].
    #[serde(default)]
    pub reserve: Option<super::reserve::ReserveYaml>,
}

/// One entry of `replaces`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replaces {
    /// The replaced limit's `name`.
    pub name: String,
}

/// Read one file's text into the schema (unknown keys refused by serde, with the list of known
/// ones).
pub fn parse(text: &str) -> Result<DomainFile, super::LimitsProblem> {
    serde_yaml_ng::from_str(text).map_err(|e| super::LimitsProblem::Syntax(e.to_string()))
}
