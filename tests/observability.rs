//! Proof that the observability files work, without Docker:
//!
//! - every query of every dashboard panel and every alert expression is evaluated by a real
//!   Prometheus (Debian's `prometheus`, installed by scripts/setup.sh) that scrapes `tally demo`
//!   every second with the alert rules loaded. A query that is invalid or returns no series fails
//!   the test, so dashboards and alerts cannot drift from the metrics tally exports;
//! - `promtool` checks the rules, runs their unit tests and checks the compose stack's config;
//! - docker-compose.yml and the dashboards' JSON are checked for structure.
//!
//! Alerts are not firing on a healthy demo, so an alert's full expression legitimately returns
//! nothing. To still tell "wrong metric name" from "not firing", each alert expression is checked
//! three ways: the full expression must evaluate without error; each operand of its top-level
//! `and` / `or` / `unless`, with its threshold comparison removed, must return series; and every
//! metric name it references must return series.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use serde_yaml::Value as Yaml;

/// The repository root.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A child process in its own process group, stopped on drop: SIGTERM first when `graceful` (so
/// the demo stops its own redis-server), then SIGKILL to the whole group (grandchildren included).
struct Proc {
    name: &'static str,
    child: Child,
    graceful: bool,
    log: PathBuf,
}

impl Proc {
    /// Spawn `cmd` with stdout and stderr to `log`. If the spawning thread ends without dropping
    /// this (the test process is killed), the kernel sends `death_signal` to the child
    /// (PR_SET_PDEATHSIG).
    fn spawn(
        name: &'static str,
        mut cmd: Command,
        log: PathBuf,
        graceful: bool,
        death_signal: i32,
    ) -> Proc {
        let out = std::fs::File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, death_signal);
                Ok(())
            });
        }
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e} (scripts/setup.sh installs it)"));
        Proc {
            name,
            child,
            graceful,
            log,
        }
    }

    /// Panic with the log if the process has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited early ({status}); log:\n{}",
                self.name,
                tail(&self.log)
            );
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.graceful {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Whatever is left of the group. The group id stays reserved while members exist.
        // SAFETY: kill(2) on the process group this child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last 40 lines of a log file.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let port = tally_testkit::local_redis::free_port().expect("free port");
        let dir =
            std::env::temp_dir().join(format!("tally-obs-{name}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// HTTP/1.0 GET on loopback: (status, body).
fn http_get(port: u16, target: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status"))?;
    Ok((status, body.to_string()))
}

/// Percent-encode a query-string value.
fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Poll `cond` every 250 ms until it holds; panic with `what` after `timeout`.
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A Prometheus HTTP API client on a loopback port.
struct Prom {
    port: u16,
}

/// Why a query did not pass.
enum QueryError {
    /// Prometheus refused the query: it is invalid (never fixed by waiting).
    Invalid(String),
    /// The query is valid but returned no series (yet).
    Empty,
    /// Prometheus could not be reached.
    Unreachable(String),
}

impl QueryError {
    fn describe(&self) -> String {
        match self {
            QueryError::Invalid(e) => format!("invalid: {e}"),
            QueryError::Empty => "no series".to_string(),
            QueryError::Unreachable(e) => format!("prometheus unreachable: {e}"),
        }
    }
}

impl Prom {
    /// Evaluate `expr` now; the number of series (or scalar) it returned.
    fn query(&self, expr: &str) -> Result<usize, QueryError> {
        let (status, body) = http_get(
            self.port,
            &format!("/api/v1/query?query={}", urlencode(expr)),
        )
        .map_err(|e| QueryError::Unreachable(e.to_string()))?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| QueryError::Unreachable(format!("HTTP {status}: {e}: {body}")))?;
        if v["status"] != "success" {
            return Err(QueryError::Invalid(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("?"),
                v["error"].as_str().unwrap_or(&body)
            )));
        }
        let n = match v["data"]["resultType"].as_str() {
            Some("vector") | Some("matrix") => {
                v["data"]["result"].as_array().map_or(0, |a| a.len())
            }
            Some("scalar") | Some("string") => 1,
            _ => 0,
        };
        if n == 0 {
            Err(QueryError::Empty)
        } else {
            Ok(n)
        }
    }

    /// GET an API path and return `data`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.port, path).expect("prometheus answers");
        assert_eq!(status, 200, "GET {path}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["data"].clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Reading PromQL just enough: top-level set operators, threshold comparisons, metric names.
// ---------------------------------------------------------------------------------------------

/// Byte offsets of `expr` that are at nesting depth 0 and outside string literals.
fn top_level(expr: &str) -> Vec<bool> {
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

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// The operands of the top-level `and` / `or` / `unless` operators of `expr`, each without a
/// leading `on (...)` / `ignoring (...)` matching clause.
fn set_operands(expr: &str) -> Vec<String> {
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
fn strip_matching_clause(part: &str) -> &str {
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
fn strip_comparison(expr: &str) -> String {
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
fn metric_names(expr: &str) -> BTreeSet<String> {
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
fn promql_helpers_read_alert_expressions() {
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

// ---------------------------------------------------------------------------------------------
// The queries under test.
// ---------------------------------------------------------------------------------------------

/// Every dashboard JSON in dashboards/.
fn dashboards() -> Vec<(String, Value)> {
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
fn panels(dashboard: &Value) -> Vec<&Value> {
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
fn variable_query(var: &Value) -> Option<&str> {
    var["query"]
        .as_str()
        .or_else(|| var["query"]["query"].as_str())
}

/// Replace Grafana variables by what the "All" option and a 1s-scrape Prometheus need.
fn substitute(expr: &str, variables: &[String]) -> String {
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

/// One query to evaluate: where it comes from, the expression, and whether it must return series.
struct Check {
    source: String,
    expr: String,
    must_have_series: bool,
}

/// Every query of every dashboard panel, with variables substituted, plus the variables' own
/// `label_values` selectors.
fn dashboard_checks() -> Vec<Check> {
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
                    must_have_series: true,
                });
            }
        }
    }
    checks
}

/// The alert rules of alerts.yml: (name, expr).
fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml"))
        .expect("read alerts.yml");
    let y: Yaml = serde_yaml::from_str(&text).expect("alerts.yml is YAML");
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
fn alert_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for (name, expr) in alert_rules() {
        checks.push(Check {
            source: format!("alert {name} (full expression)"),
            expr: expr.clone(),
            must_have_series: false,
        });
        for (i, part) in set_operands(&expr).iter().enumerate() {
            checks.push(Check {
                source: format!("alert {name} operand {} without threshold", i + 1),
                expr: strip_comparison(part),
                must_have_series: true,
            });
        }
    }
    checks
}

/// Every metric name the checks reference, as checks of their own.
fn metric_checks(checks: &[Check]) -> Vec<Check> {
    let mut names = BTreeSet::new();
    for c in checks {
        names.extend(metric_names(&c.expr));
    }
    names
        .into_iter()
        .map(|n| Check {
            source: format!("metric {n}"),
            expr: n,
            must_have_series: true,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The Prometheus-backed test.
// ---------------------------------------------------------------------------------------------

#[test]
fn dashboards_and_alerts_query_real_prometheus() {
    let started = Instant::now();
    let tmp = TempDir::new("prom");

    // tally demo: in-process Kafka broker, synthetic events, its own redis-server.
    let tally_port = tally_testkit::local_redis::free_port().expect("free port");
    let mut demo_cmd = Command::new(env!("CARGO_BIN_EXE_tally"));
    demo_cmd
        .args([
            "demo",
            "--rate",
            "5000",
            "--keys",
            "1000",
            "--partitions",
            "4",
        ])
        .args(["--duration", "170s", "--listen"])
        .arg(format!("127.0.0.1:{tally_port}"))
        .env("TALLY_LOG", "warn");
    for (k, _) in std::env::vars() {
        if k.starts_with("TALLY_") && k != "TALLY_LOG" {
            demo_cmd.env_remove(k);
        }
    }
    let mut demo = Proc::spawn(
        "tally demo",
        demo_cmd,
        tmp.0.join("demo.log"),
        true,
        libc::SIGTERM,
    );
    wait_until(
        "tally demo to serve /metrics",
        Duration::from_secs(30),
        || {
            demo.assert_running();
            matches!(http_get(tally_port, "/metrics"), Ok((200, body)) if body.contains("tally_messages_consumed_total"))
        },
    );

    // Prometheus scraping it every second, with the alert rules.
    let prom_port = tally_testkit::local_redis::free_port().expect("free port");
    let config = tmp.0.join("prometheus.yml");
    let rules = repo().join("deploy/prometheus/alerts.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tally\n    static_configs:\n      - targets: ['127.0.0.1:{tally_port}']\n",
            rules.display()
        ),
    )
    .expect("write prometheus.yml");
    let mut prom_cmd = Command::new("prometheus");
    prom_cmd
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            tmp.0.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .arg("--log.level=warn");
    let mut prometheus = Proc::spawn(
        "prometheus",
        prom_cmd,
        tmp.0.join("prometheus.log"),
        false,
        libc::SIGKILL,
    );
    let prom = Prom { port: prom_port };
    wait_until("prometheus to be ready", Duration::from_secs(30), || {
        prometheus.assert_running();
        matches!(http_get(prom_port, "/-/ready"), Ok((200, _)))
    });
    wait_until(
        "three successful scrapes of tally",
        Duration::from_secs(30),
        || {
            prom.query(r#"sum_over_time(up{job="tally"}[5m]) >= 3"#)
                .is_ok()
        },
    );
    println!(
        "prometheus 127.0.0.1:{prom_port} scrapes tally demo 127.0.0.1:{tally_port} ({:.1}s)",
        started.elapsed().as_secs_f64()
    );

    let mut checks = dashboard_checks();
    checks.extend(alert_checks());
    let metrics = metric_checks(&checks);
    checks.extend(metrics);

    // Some series appear only after a few seconds (consumer lag comes with librdkafka's
    // statistics every 5 s; rates need two samples): retry what is empty until a deadline.
    // An invalid query fails at once.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut results: BTreeMap<usize, Result<usize, QueryError>> = BTreeMap::new();
    loop {
        demo.assert_running();
        for (i, c) in checks.iter().enumerate() {
            if matches!(results.get(&i), Some(Ok(_))) {
                continue;
            }
            let r = match prom.query(&c.expr) {
                Err(QueryError::Empty) if !c.must_have_series => Ok(0),
                r => r,
            };
            if let Err(QueryError::Invalid(e)) = &r {
                panic!("{}: invalid query `{}`: {e}", c.source, c.expr);
            }
            results.insert(i, r);
        }
        let pending = results.values().filter(|r| r.is_err()).count();
        if pending == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    println!("checked {} queries:", checks.len());
    let mut failures = Vec::new();
    for (i, c) in checks.iter().enumerate() {
        match &results[&i] {
            Ok(n) => println!("  ok  {n:>3} series  {}: {}", c.source, one_line(&c.expr)),
            Err(e) => {
                let e = e.describe();
                println!("  FAIL {e}  {}: {}", c.source, one_line(&c.expr));
                failures.push(format!("{}: {e}: {}", c.source, c.expr));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "queries without series (wrong metric or label?):\n{}\ntally log:\n{}",
        failures.join("\n"),
        tail(&demo.log)
    );

    // Prometheus loaded every alert of alerts.yml and evaluates each without error.
    let expected: BTreeSet<String> = alert_rules().into_iter().map(|(n, _)| n).collect();
    let mut rule_states = BTreeMap::new();
    wait_until(
        "every alert rule to be evaluated",
        Duration::from_secs(30),
        || {
            let data = prom.api("/api/v1/rules?type=alert");
            rule_states.clear();
            for g in data["groups"].as_array().into_iter().flatten() {
                for r in g["rules"].as_array().into_iter().flatten() {
                    let name = r["name"].as_str().unwrap_or("?").to_string();
                    let evaluated = r["lastEvaluation"]
                        .as_str()
                        .is_some_and(|t| !t.starts_with("0001-"));
                    rule_states.insert(
                        name,
                        (
                            evaluated,
                            r["health"].clone(),
                            r["lastError"].clone(),
                            r["state"].clone(),
                        ),
                    );
                }
            }
            rule_states.len() == expected.len() && rule_states.values().all(|s| s.0)
        },
    );
    assert_eq!(
        rule_states.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "alert rules loaded by prometheus"
    );
    for (name, (_, health, error, state)) in &rule_states {
        println!("  rule {name}: health {health}, state {state}");
        assert_eq!(health, "ok", "rule {name} fails to evaluate: {error}");
    }

    // Every tally metric family is shown on some dashboard. (A family appears in the
    // exposition once it has a series; by now the demo has them all.)
    let (_, exposition) = http_get(tally_port, "/metrics").expect("/metrics");
    let all_dashboard_text: String = dashboard_checks()
        .iter()
        .map(|c| c.expr.clone())
        .collect::<Vec<_>>()
        .join("\n");
    let families: BTreeSet<&str> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("tally_"))
        .collect();
    let unshown: Vec<&&str> = families
        .iter()
        .filter(|f| !all_dashboard_text.contains(**f))
        .collect();
    assert!(
        unshown.is_empty(),
        "metrics tally exports that no dashboard panel shows (add a panel): {unshown:?}"
    );
    println!(
        "{} tally metric families, all on a dashboard; done in {:.1}s",
        families.len(),
        started.elapsed().as_secs_f64()
    );
    drop(prometheus);
    drop(demo);
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// promtool.
// ---------------------------------------------------------------------------------------------

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}); scripts/setup.sh installs it"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ promtool {}\n{}", args.join(" "), text.trim_end());
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
}

#[test]
fn promtool_checks_rules_unit_tests_and_config() {
    promtool(&["check", "rules", "deploy/prometheus/alerts.yml"]);
    promtool(&["test", "rules", "deploy/prometheus/alerts_test.yml"]);
    // Also checks the rule files it lists, relative to the config file.
    promtool(&["check", "config", "deploy/prometheus/prometheus.yml"]);

    // The unit tests make every alert fire at least once, and check silence at least once.
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/alerts_test.yml"))
        .expect("read alerts_test.yml");
    let y: Yaml = serde_yaml::from_str(&text).expect("alerts_test.yml is YAML");
    let mut fired = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for t in y["tests"].as_sequence().expect("tests") {
        for a in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = a["alertname"].as_str().expect("alertname").to_string();
            if a["exp_alerts"].as_sequence().is_some_and(|s| !s.is_empty()) {
                fired.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let all: BTreeSet<String> = alert_rules().into_iter().map(|(n, _)| n).collect();
    let never_fired: Vec<_> = all.difference(&fired).collect();
    assert!(
        never_fired.is_empty(),
        "alerts no unit test makes fire: {never_fired:?}"
    );
    assert!(
        !silent.is_empty(),
        "no unit test checks that an alert stays silent"
    );
}

// ---------------------------------------------------------------------------------------------
// docker-compose.yml and the Dockerfile.
// ---------------------------------------------------------------------------------------------

fn compose() -> Yaml {
    let text = std::fs::read_to_string(repo().join("docker-compose.yml")).expect("read compose");
    let mut y: Yaml = serde_yaml::from_str(&text).expect("docker-compose.yml is YAML");
    y.apply_merge().expect("YAML merge keys");
    y
}

fn yaml_str(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A service's environment as a map (mapping or list of KEY=VALUE).
fn environment(service: &Yaml) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    match &service["environment"] {
        Yaml::Mapping(m) => {
            for (k, v) in m {
                env.insert(yaml_str(k).unwrap(), yaml_str(v).unwrap_or_default());
            }
        }
        Yaml::Sequence(s) => {
            for item in s {
                let item = yaml_str(item).unwrap();
                let (k, v) = item.split_once('=').unwrap_or((&item, ""));
                env.insert(k.to_string(), v.to_string());
            }
        }
        _ => {}
    }
    env
}

/// `${VAR:-default}` → `default` (what compose substitutes when VAR is unset).
fn interpolate_default(s: &str) -> String {
    let mut out = s.to_string();
    while let Some(start) = out.find("${") {
        let end = start + out[start..].find('}').expect("closing brace");
        let inner = &out[start + 2..end];
        let value = inner
            .split_once(":-")
            .map(|(_, d)| d)
            .unwrap_or("")
            .to_string();
        out.replace_range(start..=end, &value);
    }
    out
}

#[test]
fn compose_stack_is_well_formed() {
    let y = compose();
    let services = y["services"].as_mapping().expect("services");
    let service = |name: &str| &y["services"][name];
    let names: BTreeSet<String> = services.keys().filter_map(yaml_str).collect();
    for want in [
        "kafka",
        "kafka-init",
        "redis",
        "tally",
        "loadgen",
        "prometheus",
        "grafana",
    ] {
        assert!(names.contains(want), "service {want} missing: {names:?}");
    }

    for (name, s) in services {
        let name = yaml_str(name).unwrap();
        // Published ports are bound to loopback only.
        for p in s["ports"].as_sequence().into_iter().flatten() {
            match p {
                Yaml::String(p) => assert!(
                    p.starts_with("127.0.0.1:") && p.matches(':').count() == 2,
                    "{name}: port `{p}` must be 127.0.0.1:HOST:CONTAINER"
                ),
                Yaml::Mapping(_) => assert_eq!(
                    p["host_ip"].as_str(),
                    Some("127.0.0.1"),
                    "{name}: port {p:?} must have host_ip 127.0.0.1"
                ),
                other => panic!("{name}: port {other:?} publishes on every interface"),
            }
        }
        // Long-running servers (those publishing a port) have a healthcheck.
        if s["ports"].as_sequence().is_some_and(|p| !p.is_empty()) {
            let test = &s["healthcheck"]["test"];
            assert!(
                test.as_sequence().is_some_and(|t| t.len() > 1) || test.as_str().is_some(),
                "{name}: no healthcheck"
            );
        }
        // Dependencies exist and their conditions make sense.
        if let Some(deps) = s["depends_on"].as_mapping() {
            for (dep, cond) in deps {
                let dep = yaml_str(dep).unwrap();
                let target = service(&dep);
                assert!(!target.is_null(), "{name} depends on unknown {dep}");
                match cond["condition"].as_str() {
                    Some("service_healthy") => assert!(
                        !target["healthcheck"].is_null(),
                        "{name} waits for {dep} to be healthy but it has no healthcheck"
                    ),
                    Some("service_completed_successfully") => assert_eq!(
                        target["restart"].as_str(),
                        Some("no"),
                        "{name} waits for one-shot {dep}, which must not restart"
                    ),
                    _ => {}
                }
            }
        }
        // Bind-mounted files exist.
        for v in s["volumes"].as_sequence().into_iter().flatten() {
            let v = yaml_str(v).expect("short volume syntax");
            if let Some(src) = v.split(':').next().filter(|s| s.starts_with("./")) {
                assert!(
                    repo().join(src).exists(),
                    "{name}: mounted {src} does not exist"
                );
            }
        }
        // Built services point at an existing Dockerfile.
        if !s["build"].is_null() {
            let ctx = s["build"]["context"]
                .as_str()
                .or(s["build"].as_str())
                .unwrap();
            let file = s["build"]["dockerfile"].as_str().unwrap_or("Dockerfile");
            assert!(
                repo().join(ctx).join(file).exists(),
                "{name}: no {file} in {ctx}"
            );
        }
    }

    // Kafka: the official image, KRaft mode; the topic is created before tally or the load
    // generator start.
    let kafka = service("kafka");
    assert!(kafka["image"]
        .as_str()
        .unwrap()
        .starts_with("apache/kafka:"));
    let kenv = environment(kafka);
    assert!(
        kenv["KAFKA_PROCESS_ROLES"].contains("controller"),
        "KRaft mode"
    );
    assert!(kenv["KAFKA_ADVERTISED_LISTENERS"].contains("PLAINTEXT://kafka:9092"));
    let init_cmd: Vec<String> = service("kafka-init")["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(yaml_str)
        .collect();
    assert!(init_cmd.contains(&"--create".to_string()) && init_cmd.contains(&"events".to_string()));
    for s in ["tally", "loadgen"] {
        assert_eq!(
            service(s)["depends_on"]["kafka-init"]["condition"].as_str(),
            Some("service_completed_successfully"),
            "{s} starts after the topic exists"
        );
    }

    // tally's TALLY_* variables are real configuration keys with valid values: `tally check`
    // (which rejects unknown keys) accepts them and echoes them back.
    let tenv = environment(service("tally"));
    assert_eq!(tenv["TALLY_KAFKA__BROKERS"], "kafka:9092");
    assert_eq!(tenv["TALLY_REDIS__URL"], "redis://redis:6379");
    assert_eq!(tenv["TALLY_HTTP__LISTEN"], "0.0.0.0:9100");
    let mut check = Command::new(env!("CARGO_BIN_EXE_tally"));
    check
        .args(["check", "--config"])
        .arg(repo().join("config/tally.toml"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TALLY_") {
            check.env_remove(k);
        }
    }
    check.envs(tenv.iter());
    let out = check.output().expect("run tally check");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tally check rejects the compose environment: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.contains("kafka:9092") && printed.contains("redis://redis:6379"));
    assert!(printed.contains("0.0.0.0:9100"));

    // The load generator's flags exist.
    let lg: Vec<String> = service("loadgen")["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(yaml_str)
        .map(|a| interpolate_default(&a))
        .collect();
    assert_eq!(lg[0], "produce");
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(&lg)
        .arg("--help")
        .output()
        .expect("tally produce --help");
    assert!(
        out.status.success(),
        "tally {lg:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Prometheus scrapes tally's published port, with the rules, from the mounted folder.
    let prom_cfg =
        std::fs::read_to_string(repo().join("deploy/prometheus/prometheus.yml")).unwrap();
    assert!(prom_cfg.contains("tally:9100"));
    let pvols: Vec<String> = service("prometheus")["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(yaml_str)
        .collect();
    assert!(pvols
        .iter()
        .any(|v| v.starts_with("./deploy/prometheus:/etc/prometheus")));
    // Grafana's data source is the prometheus service, and its dashboards folder is mounted.
    let ds = std::fs::read_to_string(
        repo().join("deploy/grafana/provisioning/datasources/prometheus.yml"),
    )
    .unwrap();
    let ds: Yaml = serde_yaml::from_str(&ds).unwrap();
    assert_eq!(
        ds["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
    assert_eq!(ds["datasources"][0]["uid"].as_str(), Some("prometheus"));
    let dp =
        std::fs::read_to_string(repo().join("deploy/grafana/provisioning/dashboards/tally.yml"))
            .unwrap();
    let dp: Yaml = serde_yaml::from_str(&dp).unwrap();
    let dash_path = dp["providers"][0]["options"]["path"].as_str().unwrap();
    let gvols: Vec<String> = service("grafana")["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(yaml_str)
        .collect();
    assert!(
        gvols
            .iter()
            .any(|v| v.starts_with("./dashboards:") && v.contains(dash_path)),
        "grafana mounts dashboards/ where the provider reads ({dash_path})"
    );

    // The Dockerfile: a Rust builder with librdkafka's build needs, a slim Debian runtime.
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    assert!(
        froms[0].contains("rust:") && froms[1].contains("debian:") && froms[1].contains("slim")
    );
    for pkg in ["cmake", "libssl-dev", "pkg-config"] {
        assert!(dockerfile.contains(pkg), "builder installs {pkg}");
    }

    // A real compose parser, where one is installed (Debian's docker-compose, or the plugin).
    let parsers: [&[&str]; 2] = [&["docker-compose"], &["docker", "compose"]];
    let mut validated = false;
    for p in parsers {
        let Ok(out) = Command::new(p[0])
            .args(&p[1..])
            .args(["-f", "docker-compose.yml", "config", "-q"])
            .current_dir(repo())
            .output()
        else {
            continue;
        };
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            && (err.contains("unknown command") || err.contains("is not a docker command"))
        {
            continue;
        }
        assert!(out.status.success(), "{} config: {err}", p.join(" "));
        println!("{} config: valid", p.join(" "));
        validated = true;
        break;
    }
    if !validated {
        println!("no docker-compose on PATH: structural checks only");
    }
}

// ---------------------------------------------------------------------------------------------
// Dashboard JSON.
// ---------------------------------------------------------------------------------------------

#[test]
fn dashboards_are_well_formed() {
    for (file, d) in dashboards() {
        assert!(
            d["schemaVersion"].as_i64().is_some_and(|v| v >= 36),
            "{file}: schemaVersion of current Grafana"
        );
        assert!(
            d["uid"].as_str().is_some_and(|s| !s.is_empty()),
            "{file}: uid"
        );
        assert!(
            d["title"].as_str().is_some_and(|s| !s.is_empty()),
            "{file}: title"
        );

        let vars = d["templating"]["list"].as_array().expect("templating.list");
        let var = |name: &str| vars.iter().find(|v| v["name"] == name);
        for name in ["instance", "counter"] {
            let v = var(name).unwrap_or_else(|| panic!("{file}: variable {name} missing"));
            assert_eq!(v["type"], "query", "{file}: ${name} is a query variable");
            let q = variable_query(v).unwrap_or_default();
            assert!(
                q.starts_with("label_values(") && q.contains(name),
                "{file}: ${name} comes from label_values(…, {name}), not `{q}`"
            );
        }

        let mut ids = BTreeSet::new();
        let all = panels(&d);
        assert!(all.len() > 1, "{file}: no panels");
        for p in all {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(!title.is_empty(), "{file}: panel without title: {p}");
            assert!(
                ids.insert(p["id"].as_i64().expect("panel id")),
                "{file}: duplicate id"
            );
            assert!(
                p["gridPos"]["w"].as_i64().is_some(),
                "{file}: {title}: gridPos"
            );
            if p["type"] == "row" {
                continue;
            }
            assert!(
                ["timeseries", "stat"].contains(&p["type"].as_str().unwrap_or_default()),
                "{file}: {title}: type {}",
                p["type"]
            );
            assert!(
                p["description"].as_str().is_some_and(|s| s.len() > 20),
                "{file}: {title}: description"
            );
            let datasource_ok = |ds: &Value| {
                ds["type"] == "prometheus"
                    && (ds["uid"] == "${DS_PROMETHEUS}" || ds["uid"] == "prometheus")
            };
            assert!(
                datasource_ok(&p["datasource"]),
                "{file}: {title}: datasource"
            );
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{file}: {title}: no targets");
            let mut refs = BTreeSet::new();
            for t in targets {
                assert!(
                    t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                    "{file}: {title}: target without expr"
                );
                assert!(
                    refs.insert(t["refId"].to_string()),
                    "{file}: {title}: refId"
                );
                if !t["datasource"].is_null() {
                    assert!(
                        datasource_ok(&t["datasource"]),
                        "{file}: {title}: target datasource"
                    );
                }
            }
        }
        if d.to_string().contains("${DS_PROMETHEUS}") {
            let ds = var("DS_PROMETHEUS").expect("DS_PROMETHEUS variable");
            assert_eq!(ds["type"], "datasource");
            assert_eq!(ds["query"], "prometheus");
        }
    }
}
