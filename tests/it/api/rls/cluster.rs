//! `rls.spread` on a 3-primary Redis Cluster: with `subject`, each descriptor's keys land in
//! the slot of its own values (every primary holds some, and decides them); with `domain`, the
//! whole domain sits on one primary. Exactness across slots: 240 concurrent calls of 40 users,
//! each with a shared route limit and a per-user limit in different slots, against Redis: no
//! limit admits past its count, and once every call is answered the route's and each user's
//! count equal the admitted calls (a denied call's units on other slots were given back).

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tally_testkit::local_redis::{free_port, LocalCluster};

use crate::common::process::TallyProcess;
use crate::common::rls::{ask, descriptor, limits_dir, unique, Rls};

const USERS: usize = 40;
const CALLS_PER_USER: usize = 6;
const USER_LIMIT: usize = 5;
const ROUTE_LIMIT: usize = 220;

/// `tally serve` with the RLS on the cluster, keys spread by `spread`.
fn serve(cluster: &LocalCluster, dir: &std::path::Path, spread: &str, name: &str) -> Rls {
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let port = free_port().unwrap();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = [{}]\n\n[rls]\nlisten = \"127.0.0.1:{port}\"\nlimits_file = \"{}\"\nspread = \"{spread}\"\n",
        nodes.join(", "),
        dir.display()
    );
    Rls {
        tally: TallyProcess::start_command_with_http("serve", &config, name, ""),
        port,
    }
}

/// Every key of every primary with its `n` field (fixed windows), by primary port.
fn keys_by_primary(cluster: &LocalCluster, pattern: &str) -> HashMap<u16, Vec<(String, i64)>> {
    let mut out = HashMap::new();
    for port in cluster.primaries() {
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut con).unwrap();
        let counted = keys
            .into_iter()
            .map(|k| {
                let n: Option<i64> = redis::cmd("HGET").arg(&k).arg("n").query(&mut con).unwrap();
                (k, n.unwrap_or(0))
            })
            .collect();
        out.insert(port, counted);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_by_subject_uses_every_primary_and_stays_exact_across_slots() {
    let cluster = LocalCluster::start(3, 0).unwrap();
    let dir = limits_dir("cluster-spread");
    std::fs::write(
        dir.join("api.yaml"),
        format!(
            "domain: api
descriptors:
  - key: route
    rate_limit: {{unit: hour, requests_per_unit: {ROUTE_LIMIT}}}
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: {USER_LIMIT}}}
"
        ),
    )
    .unwrap();
    let rls = serve(&cluster, &dir, "subject", "rls-cluster-subject");
    let client = rls.client().await;
    let run = unique("sp");
    let route = format!("r-{run}");
    let calls = (0..USERS * CALLS_PER_USER).map(|i| {
        let mut c = client.clone();
        let (user, route) = (format!("u{}-{run}", i % USERS), route.clone());
        tokio::spawn(async move {
            let d = vec![
                descriptor(&[("route", &route)], None),
                descriptor(&[("user", &user)], None),
            ];
            let r = ask(&mut c, "api", d).await;
            let ok = |i: usize| r.statuses[i].code == Code::Ok as i32;
            (user, r.overall_code == Code::Ok as i32, ok(0), ok(1))
        })
    });
    let mut admitted: HashMap<String, usize> = HashMap::new();
    let (mut route_ok, mut total) = (0, 0);
    for call in futures::future::join_all(calls).await {
        let (user, all_ok, route_passed, user_passed) = call.unwrap();
        assert_eq!(all_ok, route_passed && user_passed);
        route_ok += usize::from(route_passed);
        if all_ok {
            *admitted.entry(user).or_default() += 1;
            total += 1;
        }
    }
    // Both limits denied calls: the users (6 calls each, 5 allowed) and the route; a call a user
    // denied gave its route unit back, so more than 220 calls passed the route.
    assert!(admitted.values().all(|&n| n <= USER_LIMIT), "{admitted:?}");
    assert!(total <= ROUTE_LIMIT, "{total}");
    assert!(route_ok > total, "some user denied a call the route passed");

    // Redis against what the calls were told.
    let by_primary = keys_by_primary(&cluster, &format!("*{run}*"));
    let all: Vec<&(String, i64)> = by_primary.values().flatten().collect();
    let route_count: Vec<i64> = all
        .iter()
        .filter(|(k, _)| k.contains(&route))
        .map(|(_, n)| *n)
        .collect();
    // Every call is answered: a denied call holds nothing, so the route counts the admitted.
    assert_eq!(route_count, vec![total as i64], "the route's one key");
    for u in 0..USERS {
        let user = format!("u{u}-{run}");
        let counted: i64 = all
            .iter()
            .filter(|(k, _)| k.contains(&user))
            .map(|(_, n)| *n)
            .sum();
        let told = admitted.get(&user).copied().unwrap_or(0) as i64;
        assert_eq!(counted, told, "{user}: Redis counts what was admitted");
    }
    let spread: Vec<usize> = by_primary.values().map(Vec::len).collect();
    assert!(
        spread.iter().all(|&n| n > 0),
        "every primary holds keys: {spread:?}"
    );
    eprintln!(
        "spread = subject: {} calls, route OK {route_ok} (limit {ROUTE_LIMIT}), admitted {total}, keys per primary {spread:?}",
        USERS * CALLS_PER_USER
    );

    // The same calls' keys with `domain`: one primary holds them all.
    let rls = serve(&cluster, &dir, "domain", "rls-cluster-domain");
    let mut c = rls.client().await;
    let run = unique("dm");
    for u in 0..USERS {
        let user = format!("u{u}-{run}");
        let route = format!("r-{run}");
        let d = vec![
            descriptor(&[("route", &route)], None),
            descriptor(&[("user", &user)], None),
        ];
        assert_eq!(ask(&mut c, "api", d).await.overall_code, Code::Ok as i32);
    }
    let spread: Vec<usize> = keys_by_primary(&cluster, &format!("*{run}*"))
        .values()
        .map(Vec::len)
        .collect();
    let mut sorted = spread.clone();
    sorted.sort();
    assert_eq!(sorted, vec![0, 0, USERS + 1], "spread = domain: {spread:?}");
}
