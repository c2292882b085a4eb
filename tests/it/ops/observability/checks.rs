//! The queries under test: every dashboard panel and variable, every alert and its operands.
#![allow(unused_imports)]

use super::*;

// ---------------------------------------------------------------------------------------------
// The queries under test.
// ---------------------------------------------------------------------------------------------

/// Every dashboard JSON in dashboards/.
pub(crate) fn dashboards() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(repo().join("dashboards"))
        .expect("dashboards/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).expect("read dashboard");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        out.push((name, v));
    }
    assert!(!out.is_empty(), "no dashboard in dashboards/");
    out
}

/// Every panel of a dashboard, including those nested in collapsed rows.
pub(crate) fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels array") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested.iter());
        }
    }
    out
}

/// A template variable's query text (a string, or an object with `query`).
pub(crate) fn variable_query(var: &Value) -> Option<&str> {
    var["query"]
        .as_str()
        .or_else(|| var["query"]["query"].as_str())
}

/// Replace Grafana variables by what the "All" option and a 1s-scrape Prometheus need.
pub(crate) fn substitute(expr: &str, variables: &[String]) -> String {
    let mut s = expr.to_string();
    for builtin in ["__rate_interval", "__interval", "__range"] {
        s = s
            .replace(&format!("${{{builtin}}}"), "1m")
            .replace(&format!("${builtin}"), "1m");
    }
    for v in variables {
        s = s
            .replace(&format!("${{{v}}}"), ".*")
            .replace(&format!("${v}"), ".*");
    }
    assert!(
        !s.contains('$'),
        "unknown variable left in `{s}` (from `{expr}`)"
    );
    s
}

/// Metrics that have series only with a configuration `tally demo` does not run, and the test
/// that reads them instead: a query of one of them is checked as valid, not for series.
const CONFIGURED_ONLY: &[(&str, &str)] = &[
    (
        "tally_pattern_topics",
        "only with kafka.topics[].pattern; tests/it/stream/consumer/topic_patterns.rs reads it",
    ),
    (
        "tally_rls_settles_total",
        "only with a limit that has `reserve`; tests/it/api/rls/reserve.rs reads it",
    ),
    (
        "tally_rlqs_reported_requests_total",
        "per domain and limit, once an Envoy reports to [rlqs]; tests/it/api/rlqs/service.rs",
    ),
    (
        "tally_rlqs_granted_requests_total",
        "per domain and limit, once an Envoy reports to [rlqs]; tests/it/api/rlqs/service.rs",
    ),
    (
        "tally_rlqs_window_used",
        "per domain and limit, once an Envoy reports to [rlqs]; tests/it/api/rlqs/service.rs",
    ),
    (
        "tally_rlqs_excess_requests_total",
        "per domain and limit, once a report passes its grants; tests/it/api/rlqs/bounds.rs",
    ),
    (
        "tally_rlqs_actions_total",
        "per domain, limit and action, once an Envoy reports to [rlqs]; tests/it/api/rlqs/service.rs",
    ),
];

/// Whether `expr` reads a metric of [`CONFIGURED_ONLY`].
fn configured_only(expr: &str) -> bool {
    CONFIGURED_ONLY.iter().any(|(m, _)| expr.contains(m))
}

/// One query to evaluate: where it comes from, the expression, and whether it must return series.
pub(crate) struct Check {
    pub(crate) source: String,
    pub(crate) expr: String,
    pub(crate) must_have_series: bool,
}

/// Every query of every dashboard panel, with variables substituted, plus the variables' own
/// `label_values` selectors.
pub(crate) fn dashboard_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for (file, d) in dashboards() {
        let vars: Vec<String> = d["templating"]["list"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter(|v| v["type"] == "query" || v["type"] == "custom")
                    .filter_map(|v| v["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        for var in d["templating"]["list"].as_array().into_iter().flatten() {
            let Some(q) = variable_query(var) else {
                continue;
            };
            if var["type"] != "query" {
                continue;
            }
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|r| r.rsplit_once(','))
                .map(|(sel, _label)| sel.trim().to_string())
                .unwrap_or_else(|| {
                    panic!("{file}: variable query `{q}` is not label_values(selector, label)")
                });
            checks.push(Check {
                source: format!("{file} variable ${}", var["name"].as_str().unwrap_or("?")),
                expr: substitute(&inner, &vars),
                must_have_series: true,
            });
        }
        for p in panels(&d) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("target has expr");
                checks.push(Check {
                    source: format!(
                        "{file} panel \"{}\" {}",
                        p["title"].as_str().unwrap_or("?"),
                        t["refId"].as_str().unwrap_or("?")
                    ),
                    expr: substitute(expr, &vars),
                    must_have_series: !configured_only(expr),
                });
            }
        }
    }
    checks
}

/// The alert rules of alerts.yml: (name, expr).
pub(crate) fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml"))
        .expect("read alerts.yml");
    let y: Yaml = serde_yaml_ng::from_str(&text).expect("alerts.yml is YAML");
    let mut out = Vec::new();
    for g in y["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            if let (Some(name), Some(expr)) = (r["alert"].as_str(), r["expr"].as_str()) {
                out.push((name.to_string(), expr.trim().to_string()));
            }
        }
    }
    assert!(!out.is_empty(), "no alert in alerts.yml");
    out
}

/// For each alert: the full expression (valid, may be empty), and each set-operator operand
/// without its threshold comparison (must return series).
pub(crate) fn alert_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for (name, expr) in alert_rules() {
        checks.push(Check {
            source: format!("alert {name} (full expression)"),
            expr: expr.clone(),
            must_have_series: false,
        });
        for (i, part) in set_operands(&parse(&expr)).iter().enumerate() {
            checks.push(Check {
                source: format!("alert {name} operand {} without threshold", i + 1),
                expr: strip_comparison(part).to_string(),
                must_have_series: true,
            });
        }
    }
    checks
}

/// Every metric name the checks reference, as checks of their own.
pub(crate) fn metric_checks(checks: &[Check]) -> Vec<Check> {
    let mut names = BTreeSet::new();
    for c in checks {
        names.extend(metric_names(&parse(&c.expr)));
    }
    names
        .into_iter()
        .map(|n| Check {
            source: format!("metric {n}"),
            must_have_series: !configured_only(&n),
            expr: n,
        })
        .collect()
}
