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

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use tally_counters::request::{Algorithm, LimitPolicy, PolicyError};

mod error;
pub mod file;
pub mod metadata;
mod unit;
mod wildcard;

pub use unit::Unit;
pub use wildcard::wildcard_match;
pub mod reserve;

use error::invalid;
pub use error::{LimitsError, LimitsProblem};
use file::{DescriptorYaml, DomainFile, RateLimitYaml};

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
    /// `quota_mode`: out of room, it denies only when every quota of the request is.
    pub quota: bool,
    /// The descriptor's `metadata`, returned to Envoy while this limit passes.
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// Reserve → settle (see [`reserve`]).
    pub reserve: Option<reserve::Reserve>,
}

impl Rule {
    /// The rule of a descriptor's own `limit` (Envoy's rate limit override): a fixed window,
    /// never in shadow mode (as envoyproxy/ratelimit does), labelled `override` in metrics and
    /// counted under a policy of its own per unit and limit (`override-minute-10`), so two
    /// overrides on one descriptor never share (and reset) one state. No path of the limits file
    /// has that shape (paths have a `.`).
    pub fn overridden(requests_per_unit: u32, unit: Unit) -> Result<Rule, PolicyError> {
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
            quota: false,
            metadata: None,
            reserve: None,
        })
    }
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct DescriptorNode {
    /// key → value → child (nested, so a lookup borrows the request's strings: no allocation
    /// per entry on the hot path).
    exact: HashMap<String, HashMap<String, DescriptorNode>>,
    /// key → child that matches any value.
    any: HashMap<String, DescriptorNode>,
    /// (key, the value split on `*`, child), in file order.
    wildcards: Vec<(String, Vec<String>, DescriptorNode)>,
    rule: Option<Rule>,
    /// Reached through a wildcard with `share_threshold`: the pattern that stands for the
    /// entry's value in the counter's subject, so every value it matches shares one count.
    share: Option<String>,
}

/// A descriptor's limit, and the entries whose value a shared wildcard stands for (by index).
pub struct FoundRule<'a> {
    pub rule: &'a Rule,
    pub shared: smallvec::SmallVec<[(usize, &'a str); 2]>,
}

/// Every domain's tree.
#[derive(Debug, Default)]
pub struct Limits {
    domains: HashMap<String, DescriptorNode>,
    /// Domains with a `metadata` somewhere: their answers carry Envoy dynamic metadata.
    with_metadata: HashSet<String>,
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
            limits
                .add(&text)
                .map_err(|reason| err(f, reason.to_string()))?;
        }
        Ok(limits)
    }

    /// Limits from one file's text (tests, and [`Limits::load`]).
    pub fn parse(text: &str) -> Result<Limits, LimitsProblem> {
        let mut limits = Limits::default();
        limits.add(text)?;
        Ok(limits)
    }

    fn add(&mut self, text: &str) -> Result<(), LimitsProblem> {
        let DomainFile {
            domain,
            descriptors,
        } = file::parse(text)?;
        if domain.is_empty() {
            return invalid("`domain`: must not be empty");
        }
        if self.domains.contains_key(&domain) {
            return invalid(format!("domain `{domain}` is defined twice"));
        }
        let mut root = DescriptorNode::default();
        build(&mut root, &domain, &descriptors)?;
        let mut rules = Vec::new();
        collect(&root, &domain, &mut rules);
        if rules.iter().any(|(_, r)| r.metadata.is_some()) {
            self.with_metadata.insert(domain.clone());
        }
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

    /// Whether `domain` configures a `metadata`: then every answer for it carries Envoy dynamic
    /// metadata (as envoyproxy/ratelimit's with `RESPONSE_DYNAMIC_METADATA`).
    pub fn returns_metadata(&self, domain: &str) -> bool {
        self.with_metadata.contains(domain)
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
    ) -> Option<FoundRule<'a>> {
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
                return next.rule.as_ref().map(|rule| FoundRule { rule, shared });
            }
            node = next;
        }
        None
    }
}

fn collect<'a>(node: &'a DescriptorNode, domain: &'a str, out: &mut Vec<(&'a str, &'a Rule)>) {
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
fn build(
    node: &mut DescriptorNode,
    path: &str,
    descriptors: &[DescriptorYaml],
) -> Result<(), LimitsProblem> {
    for d in descriptors {
        if d.key.is_empty() {
            return invalid(format!("`{path}`: a descriptor has an empty key"));
        }
        let value = d.value.as_deref().filter(|v| !v.is_empty());
        let here = match value {
            Some(v) => format!("{path}.{}_{v}", d.key),
            None => format!("{path}.{}", d.key),
        };
        let mut child = DescriptorNode::default();
        if d.share_threshold {
            match value {
                Some(v) if v.contains('*') => child.share = Some(v.to_string()),
                _ => {
                    return invalid(format!(
                        "`{here}`: share_threshold needs a wildcard value (one with `*`)"
                    ))
                }
            }
        }
        let metadata = match &d.metadata {
            Some(m) => metadata::compile(&here, m)?,
            None => None,
        };
        match &d.rate_limit {
            Some(r) => {
                let mut compiled =
                    rule(&here, r, d.shadow_mode).map_err(|e| e.at(&here))?;
                quota_and_metadata(&here, &mut compiled, d.quota_mode, metadata)?;
                child.rule = Some(compiled);
            }
            None if d.quota_mode || metadata.is_some() => {
                return invalid(format!(
                    "`{here}`: quota_mode and metadata apply to the descriptor's rate_limit, and it has none"
                ))
            }
            None => {}
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
                    return invalid(duplicate);
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
                    return invalid(duplicate);
                }
            }
            None => {
                if node.any.insert(d.key.clone(), child).is_some() {
                    return invalid(duplicate);
                }
            }
        }
    }
    Ok(())
}

/// Mark `rule` a quota and give it `metadata`, refusing what would never take effect.
fn quota_and_metadata(
    path: &str,
    rule: &mut Rule,
    quota: bool,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<(), LimitsProblem> {
    if rule.unlimited && (quota || metadata.is_some()) {
        return invalid(format!(
            "`{path}`: an unlimited rate_limit is never counted, so quota_mode and metadata would never apply"
        ));
    }
    if quota && rule.blocked {
        return invalid(format!(
            "`{path}`: a quota_mode limit of 0 never has room; drop the descriptor or its quota_mode"
        ));
    }
    if quota && rule.reserve.is_some() {
        return invalid(format!(
            "`{path}`: quota_mode and reserve cannot be combined (a quota charges only while it has room; a reservation holds budget until it settles)"
        ));
    }
    rule.quota = quota;
    rule.metadata = metadata.map(Arc::new);
    Ok(())
}

/// Compile one `rate_limit` at `path`.
fn rule(path: &str, r: &RateLimitYaml, shadow: bool) -> Result<Rule, LimitsProblem> {
    let unit = r.unit.as_deref().map(|u| Unit::parse(u).ok_or(u));
    if r.unlimited && (matches!(unit, Some(Ok(_))) || r.requests_per_unit.is_some()) {
        return invalid("an unlimited rate_limit takes no unit or requests_per_unit");
    }
    let unit = match unit {
        Some(Ok(u)) => u,
        Some(Err(u)) => return invalid(format!("invalid rate limit unit `{u}`")),
        None if r.unlimited => Unit::Second,
        None => return invalid("rate_limit: `unit` is required"),
    };
    let limit = match r.requests_per_unit {
        _ if r.unlimited => 1,
        Some(n) if n > u64::from(u32::MAX) => {
            return invalid(format!("requests_per_unit: {n} is above 4294967295"))
        }
        Some(n) => n,
        None => return invalid("rate_limit: `requests_per_unit` is required"),
    };
    let multiplier = match r.unit_multiplier {
        Some(0) => return invalid("unit_multiplier: must be at least 1"),
        Some(_) if r.unlimited => {
            return invalid("an unlimited rate_limit takes no unit_multiplier")
        }
        Some(m) => m,
        None => 1,
    };
    let name = r.name.clone().filter(|n| !n.is_empty());
    for rep in &r.replaces {
        if rep.name.is_empty() {
            return invalid("replaces: an entry has an empty name");
        }
        if Some(&rep.name) == name.as_ref() {
            return invalid("replaces: a limit cannot replace itself");
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
    let reserve = match &r.reserve {
        Some(_) if r.unlimited || limit == 0 => {
            return invalid("reserve: an unlimited or blocking limit reserves nothing")
        }
        Some(y) => Some(reserve::Reserve::compile(y, &policy, r.usage, shadow)?),
        None => None,
    };
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
        quota: false,
        metadata: None,
        reserve,
    })
}

#[cfg(test)]
mod tests;
