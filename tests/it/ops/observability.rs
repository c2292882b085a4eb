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
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use serde_yaml_ng::Value as Yaml;
use tally_testkit::http;
use tally_testkit::scrape::Scrape;

mod checks;
mod compose;
mod promql;
mod support;

use checks::*;
use promql::*;
use support::*;

// ---------------------------------------------------------------------------------------------
// The Prometheus-backed test.
// ---------------------------------------------------------------------------------------------

#[test]
fn dashboards_and_alerts_query_real_prometheus() {
    let started = Instant::now();
    let tmp = TempDir::new("prom");
    let (mut demo, tally_port) = start_demo(&tmp);
    let (prometheus, prom) = start_prometheus(&tmp, tally_port);
    println!(
        "prometheus 127.0.0.1:{} scrapes tally demo 127.0.0.1:{tally_port} ({:.1}s)",
        prom.port,
        started.elapsed().as_secs_f64()
    );
    every_query_has_series(&prom, &mut demo);
    every_alert_rule_evaluates(&prom);
    let families = every_family_is_on_a_dashboard(tally_port);
    println!(
        "{families} tally metric families, all on a dashboard; done in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    drop(prometheus);
    drop(demo);
}

/// tally demo: in-process Kafka broker, synthetic events, its own redis-server; once it serves
/// `/metrics`, with its port.
fn start_demo(tmp: &TempDir) -> (Proc, u16) {
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
            matches!(http::get(tally_port, "/metrics"), Some((200, body)) if body.contains("tally_messages_consumed_total"))
        },
    );
    (demo, tally_port)
}

/// Prometheus scraping tally at `tally_port` every second, with the alert rules, once it has
/// scraped three times.
fn start_prometheus(tmp: &TempDir, tally_port: u16) -> (Proc, Prom) {
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
        matches!(http::get(prom_port, "/-/ready"), Some((200, _)))
    });
    wait_until(
        "three successful scrapes of tally",
        Duration::from_secs(30),
        || {
            prom.query(r#"sum_over_time(up{job="tally"}[5m]) >= 3"#)
                .is_ok()
        },
    );
    (prometheus, prom)
}

/// Every dashboard query, alert operand and metric name returns series (retried until a
/// deadline while series appear); an invalid query fails at once.
fn every_query_has_series(prom: &Prom, demo: &mut Proc) {
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
}

/// Prometheus loaded every alert of alerts.yml and evaluates each without error.
fn every_alert_rule_evaluates(prom: &Prom) {
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
}

/// Every tally metric family is shown on some dashboard. (A family appears in the exposition
/// once it has a series; by now the demo has them all.) Returns how many there are.
fn every_family_is_on_a_dashboard(tally_port: u16) -> usize {
    let exposition = Scrape::get(tally_port, Duration::from_secs(15)).expect("/metrics");
    let all_dashboard_text: String = dashboard_checks()
        .iter()
        .map(|c| c.expr.clone())
        .collect::<Vec<_>>()
        .join("\n");
    let families: BTreeSet<&str> = exposition
        .families
        .keys()
        .map(String::as_str)
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
    families.len()
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
    let y: Yaml = serde_yaml_ng::from_str(&text).expect("alerts_test.yml is YAML");
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
