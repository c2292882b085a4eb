//! docker-compose.yml and the Dockerfile.
#![allow(unused_imports)]

use super::*;

// ---------------------------------------------------------------------------------------------
// docker-compose.yml and the Dockerfile.
// ---------------------------------------------------------------------------------------------

pub(crate) fn compose() -> Yaml {
    let text = std::fs::read_to_string(repo().join("docker-compose.yml")).expect("read compose");
    let mut y: Yaml = serde_yaml_ng::from_str(&text).expect("docker-compose.yml is YAML");
    y.apply_merge().expect("YAML merge keys");
    y
}

pub(crate) fn yaml_str(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A service's environment as a map (mapping or list of KEY=VALUE).
pub(crate) fn environment(service: &Yaml) -> BTreeMap<String, String> {
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
pub(crate) fn interpolate_default(s: &str) -> String {
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
pub(crate) fn compose_stack_is_well_formed() {
    let y = compose();
    every_service_is_sound(&y);
    kafka_is_kraft_and_the_topic_comes_first(&y);
    tallys_environment_is_its_configuration(&y);
    the_load_generators_flags_exist(&y);
    prometheus_and_grafana_are_wired(&y);
    the_dockerfile_builds_the_product(&y);
    a_real_compose_parser_accepts_it();
}

fn service<'a>(y: &'a Yaml, name: &str) -> &'a Yaml {
    &y["services"][name]
}

/// Every service is there; ports are published on loopback only; servers have a healthcheck;
/// dependencies, mounted files and Dockerfiles exist.
fn every_service_is_sound(y: &Yaml) {
    let services = y["services"].as_mapping().expect("services");
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
                let target = service(y, &dep);
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
}

/// Kafka: the official image, KRaft mode; the topic is created before tally or the load
/// generator start.
fn kafka_is_kraft_and_the_topic_comes_first(y: &Yaml) {
    let kafka = service(y, "kafka");
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
    let init_cmd: Vec<String> = service(y, "kafka-init")["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(yaml_str)
        .collect();
    assert!(init_cmd.contains(&"--create".to_string()) && init_cmd.contains(&"events".to_string()));
    for s in ["tally", "loadgen"] {
        assert_eq!(
            service(y, s)["depends_on"]["kafka-init"]["condition"].as_str(),
            Some("service_completed_successfully"),
            "{s} starts after the topic exists"
        );
    }
}

/// tally's TALLY_* variables are real configuration keys with valid values: `tally check`
/// (which rejects unknown keys) accepts them and echoes them back.
fn tallys_environment_is_its_configuration(y: &Yaml) {
    let tenv = environment(service(y, "tally"));
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
}

/// The load generator's flags exist.
fn the_load_generators_flags_exist(y: &Yaml) {
    let lg: Vec<String> = service(y, "loadgen")["command"]
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
}

/// Prometheus scrapes tally's published port, with the rules, from the mounted folder.
fn prometheus_and_grafana_are_wired(y: &Yaml) {
    let prom_cfg =
        std::fs::read_to_string(repo().join("deploy/prometheus/prometheus.yml")).unwrap();
    assert!(prom_cfg.contains("tally:9100"));
    let pvols: Vec<String> = service(y, "prometheus")["volumes"]
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
    let ds: Yaml = serde_yaml_ng::from_str(&ds).unwrap();
    assert_eq!(
        ds["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
    assert_eq!(ds["datasources"][0]["uid"].as_str(), Some("prometheus"));
    let dp =
        std::fs::read_to_string(repo().join("deploy/grafana/provisioning/dashboards/tally.yml"))
            .unwrap();
    let dp: Yaml = serde_yaml_ng::from_str(&dp).unwrap();
    let dash_path = dp["providers"][0]["options"]["path"].as_str().unwrap();
    let gvols: Vec<String> = service(y, "grafana")["volumes"]
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
}

/// The Dockerfile: a Rust builder with librdkafka's build needs, a slim Debian runtime.
fn the_dockerfile_builds_the_product(y: &Yaml) {
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
    // The product image has no dev tooling (no test kit); only the load generator's image, which
    // runs `tally produce`, is built with the `dev` feature.
    assert!(
        dockerfile.contains("cargo build --release --locked --no-default-features"),
        "the Dockerfile builds the product without the default (dev) features"
    );
    let features = |name: &str| service(y, name)["build"]["args"]["TALLY_FEATURES"].as_str();
    assert_eq!(
        features("tally"),
        None,
        "the service's image is the product"
    );
    assert_eq!(
        features("loadgen"),
        Some("dev"),
        "`tally produce` needs the dev feature"
    );
    assert_ne!(
        service(y, "tally")["image"].as_str(),
        service(y, "loadgen")["image"].as_str(),
        "two builds, two image names"
    );
}

/// A real compose parser, where one is installed (Debian's docker-compose, or the plugin).
fn a_real_compose_parser_accepts_it() {
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
