//! `deploy/kubernetes/`: the manifests validate against the Kubernetes API schemas
//! (`kubernetes-validate --strict`, from PyPI; scripts/setup.sh installs it), fit together (every
//! selector selects, every named port, ConfigMap key and mount path a manifest refers to exists,
//! the grace period outlasts the shutdown grace), and the configurations they carry pass
//! `tally check` with the limits file they mount.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_yaml_ng::Value as Yaml;

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "manifests: {files:?}");
    files
}

/// Every object of every manifest.
fn objects() -> Vec<Yaml> {
    manifest_files()
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).expect("read a manifest");
            serde_yaml_ng::Deserializer::from_str(&text)
                .map(|d| {
                    serde::Deserialize::deserialize(d)
                        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
                })
                .collect::<Vec<Yaml>>()
        })
        .collect()
}

fn of_kind<'a>(objects: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn name(o: &Yaml) -> &str {
    o["metadata"]["name"].as_str().expect("metadata.name")
}

/// Does `labels` hold every pair of `selector`?
fn selects(selector: &Yaml, labels: &Yaml) -> bool {
    let pairs = selector.as_mapping().expect("a selector is a mapping");
    !pairs.is_empty() && pairs.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn validate(files: &[PathBuf]) -> std::process::Output {
    Command::new("kubernetes-validate")
        .arg("--strict")
        .args(files)
        .output()
        .expect("kubernetes-validate is not installed: scripts/setup.sh installs it (pip)")
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let files = manifest_files();
    let out = validate(&files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate:\n{text}");
    // Only the Prometheus Operator's kinds have no schema in the validator (CRDs); they are
    // checked against what they select (and the rules against alerts.yml) in the next tests.
    for line in text.lines().filter(|l| l.contains("Couldn't find schema")) {
        assert!(
            ["ServiceMonitor", "PodMonitor", "PrometheusRule"]
                .iter()
                .any(|kind| line.contains(kind)),
            "a kind the validator does not know: {line}"
        );
    }
    let passed = text.lines().filter(|l| l.contains(" passed ")).count();
    assert!(passed >= 7, "objects validated: {passed}\n{text}");

    // The validator refuses what the API server would: a port that is not a number, and (strict)
    // a field the schema does not have.
    let dir = std::env::temp_dir().join(format!("tally-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let stream = std::fs::read_to_string(folder().join("stream.yaml")).expect("stream.yaml");
    for (what, broken) in [
        (
            "a port that is not a number",
            stream.replace("containerPort: 9100", "containerPort: ninety"),
        ),
        (
            "an unknown field",
            stream.replace("terminationGracePeriodSeconds:", "terminationGraceSeconds:"),
        ),
    ] {
        assert_ne!(broken, stream, "{what}: the edit applies");
        let file = dir.join("broken.yaml");
        std::fs::write(&file, broken).expect("write");
        let out = validate(&[file]);
        assert!(
            !out.status.success(),
            "kubernetes-validate accepted {what}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_manifests_fit_together() {
    let objects = objects();
    let deployments = of_kind(&objects, "Deployment");
    let config_maps = of_kind(&objects, "ConfigMap");
    assert_eq!(deployments.len(), 2, "tally-stream and tally-serve");
    each_deployment_probes_mounts_and_outlasts_its_grace(&deployments, &config_maps);
    services_and_monitors_select_pods_with_their_ports(&objects, &deployments);
    every_monitor_names_the_job_tally(&objects);
    replicas_spread_and_budgets_cover_one_deployment(&objects, &deployments);
}

fn pod_labels(d: &Yaml) -> Yaml {
    d["spec"]["template"]["metadata"]["labels"].clone()
}

fn port_names(d: &Yaml) -> Vec<String> {
    d["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .expect("containers")
        .iter()
        .flat_map(|c| c["ports"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

/// Each Deployment selects its own pods, probes a port of its container under `/health/`,
/// mounts its `--config` from a ConfigMap key that exists, and outlasts tally's shutdown grace.
fn each_deployment_probes_mounts_and_outlasts_its_grace(
    deployments: &[&Yaml],
    config_maps: &[&Yaml],
) {
    for d in deployments {
        let n = name(d);
        assert!(
            selects(&d["spec"]["selector"]["matchLabels"], &pod_labels(d)),
            "{n}: its selector selects its own pods"
        );
        let spec = &d["spec"]["template"]["spec"];
        let container = &spec["containers"][0];
        for probe in ["livenessProbe", "readinessProbe"] {
            let get = &container[probe]["httpGet"];
            assert!(
                port_names(d).iter().any(|p| get["port"] == p.as_str()),
                "{n}: {probe} names a port of the container"
            );
            let path = get["path"].as_str().expect("probe path");
            assert!(path.starts_with("/health/"), "{n}: {probe} on {path}");
        }
        // The --config file is mounted from a ConfigMap key that exists.
        let args: Vec<&str> = container["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let config = args[args
            .iter()
            .position(|a| *a == "--config")
            .expect("--config")
            + 1];
        let mounts = container["volumeMounts"].as_sequence().expect("mounts");
        let mount = mounts
            .iter()
            .find(|m| m["mountPath"] == config)
            .unwrap_or_else(|| panic!("{n}: {config} is mounted"));
        for volume in spec["volumes"].as_sequence().expect("volumes") {
            let Some(cm) = volume["configMap"]["name"].as_str() else {
                continue;
            };
            let found = config_maps.iter().find(|c| name(c) == cm);
            let found = found.unwrap_or_else(|| panic!("{n}: ConfigMap {cm} is in the set"));
            if volume["name"] == mount["name"] {
                let key = mount["subPath"].as_str().expect("subPath");
                assert!(
                    found["data"].get(key).is_some(),
                    "{n}: ConfigMap {cm} has {key}"
                );
            }
        }
        // The pod outlasts tally's shutdown grace (the last flush and commit).
        let toml_key = mount["subPath"].as_str().expect("subPath");
        let toml = config_maps
            .iter()
            .find_map(|c| c["data"][toml_key].as_str())
            .expect("the configuration");
        let config: toml::Value = toml::from_str(toml).expect("TOML");
        let grace = config
            .get("flush")
            .and_then(|f| f.get("shutdown_grace"))
            .and_then(|g| g.as_str())
            .map(|g| humantime::parse_duration(g).expect("a duration"))
            .unwrap_or(Duration::from_secs(30));
        let period = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        assert!(
            Duration::from_secs(period) >= grace,
            "{n}: terminationGracePeriodSeconds {period} < flush.shutdown_grace {grace:?}"
        );
    }
}

/// Every Service, ServiceMonitor and PodMonitor selects pods that have the port it names.
fn services_and_monitors_select_pods_with_their_ports(objects: &[Yaml], deployments: &[&Yaml]) {
    let services = of_kind(objects, "Service");
    for s in &services {
        let pods: Vec<_> = deployments
            .iter()
            .filter(|d| selects(&s["spec"]["selector"], &pod_labels(d)))
            .collect();
        assert!(!pods.is_empty(), "Service {} selects pods", name(s));
        for port in s["spec"]["ports"].as_sequence().expect("ports") {
            let target = port["targetPort"].as_str().expect("a named targetPort");
            assert!(
                pods.iter()
                    .all(|d| port_names(d).iter().any(|p| p == target)),
                "Service {}: its pods have port {target}",
                name(s)
            );
        }
    }
    for m in of_kind(objects, "ServiceMonitor") {
        let selector = &m["spec"]["selector"]["matchLabels"];
        let service = services
            .iter()
            .find(|s| selects(selector, &s["metadata"]["labels"]))
            .unwrap_or_else(|| panic!("ServiceMonitor {} selects a Service", name(m)));
        for e in m["spec"]["endpoints"].as_sequence().expect("endpoints") {
            assert!(
                service["spec"]["ports"]
                    .as_sequence()
                    .expect("ports")
                    .iter()
                    .any(|p| p["name"] == e["port"]),
                "ServiceMonitor {}: the Service has port {:?}",
                name(m),
                e["port"]
            );
        }
    }
    for m in of_kind(objects, "PodMonitor") {
        let selector = &m["spec"]["selector"]["matchLabels"];
        let pods: Vec<_> = deployments
            .iter()
            .filter(|d| selects(selector, &pod_labels(d)))
            .collect();
        assert!(!pods.is_empty(), "PodMonitor {} selects pods", name(m));
        for e in m["spec"]["podMetricsEndpoints"]
            .as_sequence()
            .expect("endpoints")
        {
            let port = e["port"].as_str().expect("a port name");
            assert!(
                pods.iter().all(|d| port_names(d).iter().any(|p| p == port)),
                "PodMonitor {}: its pods have port {port}",
                name(m)
            );
        }
    }
}

/// Every monitor names the scrape job `tally`, which the alert rules' `up{job="tally"}` needs.
fn every_monitor_names_the_job_tally(objects: &[Yaml]) {
    for (kind, endpoints) in [
        ("ServiceMonitor", "endpoints"),
        ("PodMonitor", "podMetricsEndpoints"),
    ] {
        for m in of_kind(objects, kind) {
            for e in m["spec"][endpoints].as_sequence().expect("endpoints") {
                let relabels = e["relabelings"].as_sequence().cloned().unwrap_or_default();
                assert!(
                    relabels
                        .iter()
                        .any(|r| r["targetLabel"] == "job" && r["replacement"] == "tally"),
                    "{kind} {}: the job is named tally",
                    name(m)
                );
            }
        }
    }
}

/// Replicas spread over zones and nodes, each constraint counting its own Deployment's pods. Every PodDisruptionBudget covers one Deployment.
fn replicas_spread_and_budgets_cover_one_deployment(objects: &[Yaml], deployments: &[&Yaml]) {
    for d in deployments {
        let spread = d["spec"]["template"]["spec"]["topologySpreadConstraints"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{}: topology spread", name(d)));
        let keys: Vec<&str> = spread
            .iter()
            .map(|c| c["topologyKey"].as_str().expect("topologyKey"))
            .collect();
        assert_eq!(
            keys,
            ["topology.kubernetes.io/zone", "kubernetes.io/hostname"],
            "{}",
            name(d)
        );
        for c in spread {
            let selector = &c["labelSelector"]["matchLabels"];
            assert!(selects(selector, &pod_labels(d)), "{}: spread", name(d));
            let others = deployments.iter().filter(|o| name(o) != name(d));
            assert!(
                others
                    .into_iter()
                    .all(|o| !selects(selector, &pod_labels(o))),
                "{}: its spread counts only its own pods",
                name(d)
            );
        }
    }
    for b in of_kind(objects, "PodDisruptionBudget") {
        let selector = &b["spec"]["selector"]["matchLabels"];
        let covered = deployments
            .iter()
            .filter(|d| selects(selector, &pod_labels(d)))
            .count();
        assert_eq!(
            covered,
            1,
            "PodDisruptionBudget {} covers one Deployment",
            name(b)
        );
    }
}

#[test]
fn the_configurations_in_the_config_map_pass_tally_check() {
    let objects = objects();
    let config_maps = of_kind(&objects, "ConfigMap");
    let config = config_maps
        .iter()
        .find(|c| name(c) == "tally-config")
        .expect("tally-config");
    let limits = config_maps
        .iter()
        .find(|c| name(c) == "tally-limits")
        .expect("tally-limits");
    let dir = std::env::temp_dir().join(format!("tally-k8s-check-{}", std::process::id()));
    let limits_dir = dir.join("limits");
    std::fs::create_dir_all(&limits_dir).expect("temp dir");
    for (file, text) in limits["data"].as_mapping().expect("data") {
        let file = file.as_str().expect("a file name");
        std::fs::write(limits_dir.join(file), text.as_str().expect("text")).expect("write");
    }
    for file in ["tally-token", "tally-admin-token"] {
        std::fs::write(dir.join(file), format!("{file}-of-the-test\n")).expect("write");
    }
    // `tally check` with the paths the pod mounts, here in the test's folder (the Secret's
    // files and the limits ConfigMap).
    let check = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(["check", "--config"])
            .arg(path)
            .env("TALLY_HTTP__TOKEN_FILE", dir.join("tally-token"))
            .env(
                "TALLY_HTTP__ADMIN_TOKEN_FILE",
                dir.join("tally-admin-token"),
            )
            .env("TALLY_RLS__LIMITS_FILE", &limits_dir)
            .output()
            .expect("run tally check")
    };
    let mut checked = 0;
    for (file, text) in config["data"].as_mapping().expect("data") {
        let file = file.as_str().expect("a file name");
        let path = dir.join(file);
        std::fs::write(&path, text.as_str().expect("text")).expect("write");
        let out = check(&path);
        assert!(
            out.status.success(),
            "tally check {file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert_eq!(checked, 2, "stream.toml and serve.toml");
    // `tally check` reads the limits file as `tally serve` would: a wrong one fails it.
    std::fs::write(
        limits_dir.join("broken.yaml"),
        "domain: other\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .expect("write");
    let out = check(&dir.join("serve.toml"));
    assert_eq!(
        out.status.code(),
        Some(64),
        "a wrong limits file fails the check"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("fortnight"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The PrometheusRule carries exactly deploy/prometheus/alerts.yml's groups (the ones promtool
/// tests and the observability test checks against a live tally): regenerate it with
/// `scripts/k8s_alerts.py`.
#[test]
fn the_prometheus_rule_is_the_alert_rules_file() {
    let objects = objects();
    let rules = of_kind(&objects, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml");
    let alerts: Yaml =
        serde_yaml_ng::from_str(&std::fs::read_to_string(path).expect("alerts.yml")).expect("yaml");
    let groups = alerts["groups"].as_sequence().expect("groups");
    assert!(!groups.is_empty() && !groups[0]["rules"].as_sequence().unwrap().is_empty());
    assert_eq!(
        rules[0]["spec"]["groups"], alerts["groups"],
        "deploy/kubernetes/alerts.yaml differs from alerts.yml: run scripts/k8s_alerts.py"
    );
}
