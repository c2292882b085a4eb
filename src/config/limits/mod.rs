//! The compiled limits: one descriptor tree per domain, and the lookup that finds the limit of
//! a request's descriptor by envoyproxy/ratelimit's rules (its `GetLimit`):
//!
//! * entries are matched in order, one tree level each: first the node with the entry's key
//!   and exact value, then a sibling whose value has a `*` matching it, then the node with the
//!   key and no value (any value);
//! * a limit applies only if the descriptor ends exactly at a node that has one (a descriptor
//!   with more entries than the matched path has no limit; one with fewer uses the limit of the
//!   node it ends at);
//! * the counter is per *value*: two descriptors that match one wildcard or valueless node with
//!   different values count apart.
//!
//! Pure (no I/O beyond reading the files); unit-tested in `tests.rs`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use tally_counters::request::{Algorithm, LimitPolicy};

pub mod file;

use file::{DescriptorYaml, DomainFile, RateLimitYaml};

/// A window unit of Envoy's protocol (`RateLimitResponse.RateLimit.Unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days (as envoyproxy/ratelimit counts a month).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// `second` … `year`, any case (envoyproxy/ratelimit's spelling).
    pub fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// Its name in envoyproxy/ratelimit's files (`second` … `year`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit of the protocol's enum value (0, unknown, is none).
    pub fn from_code(code: i32) -> Option<Unit> {
        Some(match code {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The protocol's enum value.
    pub fn code(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The window: windows are aligned to the epoch, as envoyproxy/ratelimit's are.
    pub fn window(self) -> Duration {
        let secs = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        };
        Duration::from_secs(secs)
    }
}

/// A configured limit, ready for the limiter.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The limiter's policy. Its name (`<domain>.<key>_<value>.<key>…`, the path in the file, as
    /// envoyproxy/ratelimit names it) is part of the Redis key, so a reload that keeps the path
    /// keeps the counts.
    pub policy: LimitPolicy,
    /// The metric label and `RateLimit-Policy` name: the configured `name`, else the path.
    pub label: String,
    /// The window unit, for `current_limit`.
    pub unit: Unit,
    /// The configured `name` (what `replaces` refers to).
    pub name: Option<String>,
    /// Names of the limits this one replaces.
    pub replaces: Vec<String>,
    /// Never limited.
    pub unlimited: bool,
    /// `requests_per_unit: 0`: every request is over the limit (a block list), decided without
    /// Redis.
    pub blocked: bool,
    /// Check, then charge (see [`file::RateLimitYaml::usage`]).
    pub usage: bool,
    /// `on_redis_error` was configured: without Redis the policy answers, not gRPC UNAVAILABLE.
    pub answers_without_redis: bool,
}

impl Rule {
    /// The rule of a descriptor's own `limit` (Envoy's rate limit override): a fixed window,
    /// never in shadow mode (as envoyproxy/ratelimit does), labelled `override` in metrics and
    /// counted under a policy of its own per unit and limit (`override-minute-10`), so two
    /// overrides on one descriptor never share (and reset) one state. No path of the limits file
    /// has that shape (paths have a `.`).
    pub fn overridden(requests_per_unit: u32, unit: Unit) -> Result<Rule, String> {
        let policy = LimitPolicy {
            name: format!("override-{}-{requests_per_unit}", unit.name()),
            algorithm: Algorithm::Fixed,
            limit: u64::from(requests_per_unit),
            window: unit.window(),
            burst: None,
            shadow: false,
            on_redis_error: Default::default(),
            durability: None,
        };
        policy.validate()?;
        Ok(Rule {
            policy,
            label: "override".into(),
            unit,
            name: None,
            replaces: Vec::new(),
            unlimited: false,
            blocked: false,
            usage: false,
            answers_without_redis: false,
        })
    }
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct Node {
    /// key → value → child (nested, so a lookup borrows the request's strings: no allocation
    /// per entry on the hot path).
    exact: HashMap<String, HashMap<String, Node>>,
    /// key → child that matches any value.
    any: HashMap<String, Node>,
    /// (key, the value split on `*`, child), in file order.
    wildcards: Vec<(String, Vec<String>, Node)>,
    rule: Option<Rule>,
    /// Reached through a wildcard with `share_threshold`: the pattern that stands for the
    /// entry's value in the counter's subject, so every value it matches shares one count.
    share: Option<String>,
}

/// A descriptor's limit, and the entries whose value a shared wildcard stands for (by index).
pub struct Found<'a> {
    pub rule: &'a Rule,
    pub shared: smallvec::SmallVec<[(usize, &'a str); 2]>,
}

/// Every domain's tree.
#[derive(Debug, Default)]
pub struct Limits {
    domains: HashMap<String, Node>,
}

/// Why a limits file was refused: the file, and where in it.
#[derive(Debug, thiserror::Error)]
#[error("limits file {file}: {reason}")]
pub struct LimitsError {
    /// The file (or directory) read.
    pub file: String,
    /// What is wrong, with the descriptor path.
    pub reason: String,
}

impl Limits {
    /// Read `path`: one file, or every `*.yaml` / `*.yml` file of a directory (one domain each,
    /// as envoyproxy/ratelimit reads its directory).
    pub fn load(path: &Path) -> Result<Limits, LimitsError> {
        let err = |file: &Path, reason: String| LimitsError {
            file: file.display().to_string(),
            reason,
        };
        let mut files = Vec::new();
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| err(path, e.to_string()))?;
            for entry in entries {
                let p = entry.map_err(|e| err(path, e.to_string()))?.path();
                let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
                if p.is_file() && (ext == "yaml" || ext == "yml") {
                    files.push(p);
                }
            }
            files.sort();
        } else {
            files.push(path.to_path_buf());
        }
        let mut limits = Limits::default();
        for f in &files {
            let text = std::fs::read_to_string(f).map_err(|e| err(f, e.to_string()))?;
            limits.add(&text).map_err(|reason| err(f, reason))?;
        }
        Ok(limits)
    }

    /// Limits from one file's text (tests, and [`Limits::load`]).
    pub fn parse(text: &str) -> Result<Limits, String> {
        let mut limits = Limits::default();
        limits.add(text)?;
        Ok(limits)
    }

    fn add(&mut self, text: &str) -> Result<(), String> {
        let DomainFile {
            domain,
            descriptors,
        } = file::parse(text)?;
        if domain.is_empty() {
            return Err("`domain`: must not be empty".into());
        }
        if self.domains.contains_key(&domain) {
            return Err(format!("domain `{domain}` is defined twice"));
        }
        let mut root = Node::default();
        build(&mut root, &domain, &descriptors)?;
        self.domains.insert(domain, root);
        Ok(())
    }

    /// Every rule with its domain, sorted (metrics are registered for each).
    pub fn rules(&self) -> Vec<(&str, &Rule)> {
        let mut out = Vec::new();
        for (domain, node) in &self.domains {
            collect(node, domain, &mut out);
        }
        out.sort_by(|a, b| (a.0, &a.1.policy.name).cmp(&(b.0, &b.1.policy.name)));
        out
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit of one descriptor, by envoyproxy/ratelimit's rules (see the module's header).
    pub fn find<'a, 'e>(
        &'a self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&'a Rule> {
        self.lookup(domain, entries).map(|f| f.rule)
    }

    /// [`Limits::find`], with the entries a shared wildcard (`share_threshold`) matched.
    pub fn lookup<'a, 'e>(
        &'a self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<Found<'a>> {
        let mut node = self.domains.get(domain)?;
        let mut shared = smallvec::SmallVec::new();
        let mut entries = entries.into_iter().enumerate().peekable();
        while let Some((i, (key, value))) = entries.next() {
            let next = node
                .exact
                .get(key)
                .and_then(|values| values.get(value))
                .or_else(|| {
                    node.wildcards
                        .iter()
                        .find(|(k, parts, _)| k == key && wildcard_match(parts, value))
                        .map(|(_, _, n)| n)
                })
                .or_else(|| node.any.get(key))?;
            if let Some(pattern) = &next.share {
                shared.push((i, pattern.as_str()));
            }
            if entries.peek().is_none() {
                return next.rule.as_ref().map(|rule| Found { rule, shared });
            }
            node = next;
        }
        None
    }
}

fn collect<'a>(node: &'a Node, domain: &'a str, out: &mut Vec<(&'a str, &'a Rule)>) {
    let children = node
        .exact
        .values()
        .flat_map(HashMap::values)
        .chain(node.any.values())
        .chain(node.wildcards.iter().map(|(_, _, n)| n));
    for child in children {
        if let Some(rule) = &child.rule {
            out.push((domain, rule));
        }
        collect(child, domain, out);
    }
}

/// Add `descriptors` under `node`; `path` names `node` (`<domain>.<key>_<value>…`).
fn build(node: &mut Node, path: &str, descriptors: &[DescriptorYaml]) -> Result<(), String> {
    for d in descriptors {
        if d.key.is_empty() {
            return Err(format!("`{path}`: a descriptor has an empty key"));
        }
        let value = d.value.as_deref().filter(|v| !v.is_empty());
        let here = match value {
            Some(v) => format!("{path}.{}_{v}", d.key),
            None => format!("{path}.{}", d.key),
        };
        let mut child = Node::default();
        if d.share_threshold {
            match value {
                Some(v) if v.contains('*') => child.share = Some(v.to_string()),
                _ => {
                    return Err(format!(
                        "`{here}`: share_threshold needs a wildcard value (one with `*`)"
                    ))
                }
            }
        }
        if let Some(r) = &d.rate_limit {
            child.rule = Some(rule(&here, r, d.shadow_mode).map_err(|e| format!("`{here}`: {e}"))?);
        }
        build(&mut child, &here, &d.descriptors)?;
        let duplicate = format!("`{here}`: the descriptor is defined twice");
        match value {
            Some(v) if v.contains('*') => {
                if node
                    .wildcards
                    .iter()
                    .any(|(k, p, _)| *k == d.key && p.join("*") == v)
                {
                    return Err(duplicate);
                }
                let parts = v.split('*').map(str::to_string).collect();
                node.wildcards.push((d.key.clone(), parts, child));
            }
            Some(v) => {
                if node
                    .exact
                    .entry(d.key.clone())
                    .or_default()
                    .insert(v.to_string(), child)
                    .is_some()
                {
                    return Err(duplicate);
                }
            }
            None => {
                if node.any.insert(d.key.clone(), child).is_some() {
                    return Err(duplicate);
                }
            }
        }
    }
    Ok(())
}

/// Compile one `rate_limit` at `path`.
fn rule(path: &str, r: &RateLimitYaml, shadow: bool) -> Result<Rule, String> {
    let unit = r.unit.as_deref().map(|u| Unit::parse(u).ok_or(u));
    if r.unlimited && (matches!(unit, Some(Ok(_))) || r.requests_per_unit.is_some()) {
        return Err("an unlimited rate_limit takes no unit or requests_per_unit".into());
    }
    let unit = match unit {
        Some(Ok(u)) => u,
        Some(Err(u)) => return Err(format!("invalid rate limit unit `{u}`")),
        None if r.unlimited => Unit::Second,
        None => return Err("rate_limit: `unit` is required".into()),
    };
    let limit = match r.requests_per_unit {
        _ if r.unlimited => 1,
        Some(n) if n > u64::from(u32::MAX) => {
            return Err(format!("requests_per_unit: {n} is above 4294967295"))
        }
        Some(n) => n,
        None => return Err("rate_limit: `requests_per_unit` is required".into()),
    };
    let multiplier = match r.unit_multiplier {
        Some(0) => return Err("unit_multiplier: must be at least 1".into()),
        Some(_) if r.unlimited => {
            return Err("an unlimited rate_limit takes no unit_multiplier".into())
        }
        Some(m) => m,
        None => 1,
    };
    let name = r.name.clone().filter(|n| !n.is_empty());
    for rep in &r.replaces {
        if rep.name.is_empty() {
            return Err("replaces: an entry has an empty name".into());
        }
        if Some(&rep.name) == name.as_ref() {
            return Err("replaces: a limit cannot replace itself".into());
        }
    }
    let policy = LimitPolicy {
        name: path.to_string(),
        algorithm: r.algorithm.unwrap_or(Algorithm::Fixed),
        // A block list (0) never reaches the limiter; 1 keeps the policy valid.
        limit: limit.max(1),
        window: unit.window() * multiplier,
        burst: r.burst,
        shadow,
        on_redis_error: r.on_redis_error.unwrap_or_default(),
        durability: None,
    };
    policy.validate()?;
    Ok(Rule {
        label: name.clone().unwrap_or_else(|| path.to_string()),
        policy,
        unit,
        name,
        replaces: r.replaces.iter().map(|x| x.name.clone()).collect(),
        unlimited: r.unlimited,
        blocked: limit == 0,
        usage: r.usage,
        answers_without_redis: r.on_redis_error.is_some(),
    })
}

/// Whether `value` matches a pattern split on `*` (each `*` any run of characters, empty too).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (first, rest) = match parts.split_first() {
        Some(x) => x,
        None => return value.is_empty(),
    };
    let Some((last, middle)) = rest.split_last() else {
        return value == first;
    };
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut inner = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match inner.find(part.as_str()) {
            Some(i) => inner = &inner[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
