//! Reading PromQL just enough: top-level set operators, threshold comparisons, metric names.
#![allow(unused_imports)]

use super::*;

// ---------------------------------------------------------------------------------------------
// Reading PromQL just enough: top-level set operators, threshold comparisons, metric names.
// ---------------------------------------------------------------------------------------------

/// Byte offsets of `expr` that are at nesting depth 0 and outside string literals.
pub(crate) fn top_level(expr: &str) -> Vec<bool> {
    let bytes = expr.as_bytes();
    let mut top = vec![false; bytes.len()];
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == b'\\' {
                i += 2;
                continue;
            }
            if b == q {
                quote = None;
            }
        } else {
            match b {
                b'"' | b'\'' | b'`' => quote = Some(b),
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                _ => top[i] = depth == 0,
            }
        }
        i += 1;
    }
    top
}

pub(crate) fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// The operands of the top-level `and` / `or` / `unless` operators of `expr`, each without a
/// leading `on (...)` / `ignoring (...)` matching clause.
pub(crate) fn set_operands(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let top = top_level(expr);
    let mut parts = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let mut matched = 0;
        if top[i] && (i == 0 || !is_word_byte(bytes[i - 1])) {
            for op in ["and", "or", "unless"] {
                let end = i + op.len();
                if bytes[i..].starts_with(op.as_bytes())
                    && (end >= bytes.len() || !is_word_byte(bytes[end]))
                {
                    matched = op.len();
                }
            }
        }
        if matched > 0 {
            parts.push(expr[start..i].to_string());
            start = i + matched;
            i = start;
        } else {
            i += 1;
        }
    }
    parts.push(expr[start..].to_string());
    parts
        .into_iter()
        .map(|p| strip_matching_clause(p.trim()).trim().to_string())
        .collect()
}

/// `on (a, b) rest` → `rest` (also `ignoring`).
pub(crate) fn strip_matching_clause(part: &str) -> &str {
    for kw in ["on", "ignoring"] {
        if let Some(rest) = part.strip_prefix(kw) {
            let rest = rest.trim_start();
            if rest.starts_with('(') {
                if let Some(close) = rest.find(')') {
                    return &rest[close + 1..];
                }
            }
        }
    }
    part
}

/// The left side of the first top-level comparison (`>`, `<`, `==`, `!=`, `>=`, `<=`).
pub(crate) fn strip_comparison(expr: &str) -> String {
    let bytes = expr.as_bytes();
    let top = top_level(expr);
    for (i, &b) in bytes.iter().enumerate() {
        if !top[i] {
            continue;
        }
        let next = bytes.get(i + 1).copied();
        let is_cmp = match b {
            b'>' | b'<' => true,
            b'=' | b'!' => next == Some(b'='),
            _ => false,
        };
        if is_cmp {
            return expr[..i].trim().to_string();
        }
    }
    expr.trim().to_string()
}

/// Metric names referenced by `expr`: identifiers outside strings, label matchers and range
/// brackets that are not functions, keywords or grouping labels.
pub(crate) fn metric_names(expr: &str) -> BTreeSet<String> {
    // Aggregation operators may be followed by `by (...)` instead of `(`.
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "atan2",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let bytes = expr.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'{' | b'[' => {
                let close = if b == b'{' { b'}' } else { b']' };
                while i < bytes.len() && bytes[i] != close {
                    i += 1;
                }
                i += 1;
            }
            _ if b.is_ascii_alphabetic() || b == b'_' => {
                let start = i;
                while i < bytes.len() && is_word_byte(bytes[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = expr[i..].trim_start().as_bytes().first().copied();
                if GROUPING.contains(&word) {
                    // Skip the label list: `by (job, instance)`.
                    let rest = &expr[i..];
                    if rest.trim_start().starts_with('(') {
                        i += rest.find(')').map_or(rest.len(), |c| c + 1);
                    }
                } else if !KEYWORDS.contains(&word) && next != Some(b'(') {
                    names.insert(word.to_string());
                }
            }
            b'0'..=b'9' | b'.' => {
                // A number or duration literal, e.g. 0.99 or 1e3.
                while i < bytes.len() && (is_word_byte(bytes[i]) || bytes[i] == b'.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
pub(crate) fn promql_helpers_read_alert_expressions() {
    let e = "sum by (job, instance) (x_total) > 0\nunless on (job, instance)\nsum by (job) (changes(y[10m])) > 0";
    let parts = set_operands(e);
    assert_eq!(parts.len(), 2);
    assert_eq!(
        strip_comparison(&parts[0]),
        "sum by (job, instance) (x_total)"
    );
    assert_eq!(
        strip_comparison(&parts[1]),
        "sum by (job) (changes(y[10m]))"
    );
    assert_eq!(
        strip_comparison(r#"up{job="a>b"} == 0"#),
        r#"up{job="a>b"}"#
    );
    assert_eq!(set_operands("a_total / b_total > 0.01").len(), 1);
    assert_eq!(
        set_operands("random_orders"),
        vec!["random_orders".to_string()]
    );
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{instance=~"$i"}[5m]))) and on (job) b"#,
    );
    assert_eq!(
        names,
        ["a_bucket", "b"].iter().map(|s| s.to_string()).collect()
    );
}
