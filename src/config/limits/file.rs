//! The limits file as its authors write it: envoyproxy/ratelimit's YAML (one domain per file),
//! plus tally's extensions in `rate_limit` (`algorithm`, `burst`, `on_redis_error`, `usage`).
//! Inert serde data; [`super`] compiles it.

use serde::Deserialize;
use tally_counters::request::{Algorithm, FailureMode};

/// envoyproxy/ratelimit keys that tally does not implement: a file that sets one (to anything
/// but `false`) is refused with its path, rather than loaded with a behaviour its author did
/// not get; set to `false`, it is taken out before the schema reads the file.
pub const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "quota_mode",
        "tally has no quota mode for Envoy (its quotas are `/v1/quota`)",
    ),
    ("metadata", "tally sends no dynamic metadata"),
];

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
}

/// One entry of `replaces`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replaces {
    /// The replaced limit's `name`.
    pub name: String,
}

/// Read one file's text: first take out the keys tally does not implement (set to `false`)
/// or refuse them (set to anything else, naming where), then parse into the schema (unknown
/// keys refused by serde, with the list of known ones).
pub fn parse(text: &str) -> Result<DomainFile, String> {
    let mut value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    strip_unsupported(&mut value, "")?;
    serde_yaml_ng::from_value(value).map_err(|e| e.to_string())
}

/// Remove every [`UNSUPPORTED`] key set to `false` from `value` (depth first); the first one
/// set to anything else is the error, with its path.
fn strip_unsupported(value: &mut serde_yaml_ng::Value, at: &str) -> Result<(), String> {
    match value {
        serde_yaml_ng::Value::Mapping(map) => {
            let mut result = Ok(());
            map.retain(|k, v| {
                let name = k.as_str().unwrap_or_default();
                let Some((key, why)) = UNSUPPORTED.iter().find(|(key, _)| *key == name) else {
                    return true;
                };
                if !matches!(v, serde_yaml_ng::Value::Bool(false)) && result.is_ok() {
                    result = Err(format!(
                        "`{}`: `{key}` is an envoyproxy/ratelimit key that tally does not support ({why})",
                        join(at, name)
                    ));
                }
                false
            });
            result?;
            for (k, v) in map.iter_mut() {
                strip_unsupported(v, &join(at, k.as_str().unwrap_or_default()))?;
            }
            Ok(())
        }
        serde_yaml_ng::Value::Sequence(items) => items
            .iter_mut()
            .enumerate()
            .try_for_each(|(i, v)| strip_unsupported(v, &format!("{at}[{i}]"))),
        _ => Ok(()),
    }
}

/// `at.name`, or `name` at the top.
fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}
