//! The TTL auditor across three `tally serve` replicas on one real redis-server: one leads at a
//! time, leadership moves when the leader is killed, and counter keys made without expiry get
//! the expiry of their window (and only counter keys).

use std::time::Duration;

use crate::common::process::TallyProcess;
use crate::common::request::PLAYS;
use crate::common::wait_for;
use tally::model::stored_expire_at;
use tally_testkit::http;
use tally_testkit::local_redis::LocalRedis;

fn config(redis: &LocalRedis) -> String {
    format!(
        r#"
[redis]
url = "{}"

{PLAYS}
retention = "1h"

[jobs.ttl_audit]
enabled = true
interval = "100ms"
lease = "600ms"
"#,
        redis.url()
    )
}

fn leaders(procs: &[TallyProcess]) -> f64 {
    procs
        .iter()
        .filter_map(|p| p.metric("tally_job_leader{task=\"ttl_audit\"}"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_audits_and_leadership_moves_when_it_dies() {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut procs: Vec<TallyProcess> = (0..3)
        .map(|i| TallyProcess::start_command("serve", &config(&redis), &format!("jobs{i}")))
        .collect();
    for p in &procs {
        wait_for("tally serve ready", Duration::from_secs(20), || {
            http::get(p.port, "/health/ready").is_some_and(|(code, _)| code == 200)
        })
        .await;
    }
    wait_for("one leader", Duration::from_secs(10), || {
        leaders(&procs) == 1.0
    })
    .await;

    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let now = chrono::Utc::now();
    let hour = now.format("%Y%m%d%H").to_string();
    let hour_end = (now.timestamp_millis() / 3_600_000 + 1) * 3_600_000;
    let set = |conn: &mut redis::Connection, key: &str| {
        let _: () = redis::cmd("SET").arg(key).arg(5).query(conn).unwrap();
    };
    let expire_time = |conn: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PEXPIRETIME").arg(key).query(conn).unwrap()
    };
    let current = format!("plays:v%3A1:{hour}");
    set(&mut conn, &current);
    set(&mut conn, "plays:v2:2020010100"); // a window long over
    set(&mut conn, "plays:not-a-counter-key");
    set(&mut conn, "other:x");
    wait_for("the current key repaired", Duration::from_secs(10), || {
        expire_time(&mut conn, &current) > 0
    })
    .await;
    // The expiry the flush would have stored: window end + retention, spread by the key's hash
    // (the default spread, 2 h / 10 capped at 5 min).
    let stored = |key: &str| stored_expire_at(key.as_bytes(), hour_end + 3_600_000, 300_000);
    assert_eq!(
        expire_time(&mut conn, &current),
        stored(&current),
        "window end + retention, spread"
    );
    wait_for("the old key expired", Duration::from_secs(10), || {
        expire_time(&mut conn, "plays:v2:2020010100") == -2
    })
    .await;
    assert_eq!(
        expire_time(&mut conn, "plays:not-a-counter-key"),
        -1,
        "not ours"
    );
    assert_eq!(expire_time(&mut conn, "other:x"), -1, "not ours");
    assert_eq!(leaders(&procs), 1.0, "one leader at a time");

    // Kill the leader: another takes over within a lease and repairs new keys.
    let leader = procs
        .iter()
        .position(|p| p.metric("tally_job_leader{task=\"ttl_audit\"}") == Some(1.0))
        .unwrap();
    let repaired = procs[leader]
        .metric("tally_ttl_audit_keys_repaired_total{counter=\"plays\"}")
        .unwrap();
    assert!(repaired >= 2.0, "{repaired}");
    procs[leader].kill9();
    procs.remove(leader);
    wait_for("a new leader", Duration::from_secs(10), || {
        leaders(&procs) == 1.0
    })
    .await;
    let later = format!("plays:v3:{hour}");
    set(&mut conn, &later);
    wait_for(
        "repaired by the new leader",
        Duration::from_secs(10),
        || expire_time(&mut conn, &later) == stored(&later),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_walks_every_cluster_primary() {
    let cluster = tally_testkit::local_redis::LocalCluster::start(3, 0).unwrap();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let config = format!(
        r#"
[redis]
mode = "cluster"
nodes = [{}]

{PLAYS}

[jobs.ttl_audit]
enabled = true
interval = "100ms"
lease = "600ms"
"#,
        nodes.join(", ")
    );
    let p = TallyProcess::start_command("serve", &config, "jobs-cluster");
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let now = chrono::Utc::now();
    let hour = now.format("%Y%m%d%H").to_string();
    let hour_end = (now.timestamp_millis() / 3_600_000 + 1) * 3_600_000;
    // Keys on every primary (plain keys spread over the slots), none with an expiry.
    let keys: Vec<String> = (0..200).map(|i| format!("plays:x{i}y:{hour}")).collect();
    for k in &keys {
        let _: () = redis::cmd("SET").arg(k).arg(1).query(&mut conn).unwrap();
    }
    let slots: std::collections::BTreeSet<u32> = keys
        .iter()
        .map(|k| u32::from(tally::model::layout::key_slot(k.as_bytes())) * 3 / 16_384)
        .collect();
    assert_eq!(slots.len(), 3, "the keys lie on all three primaries");
    wait_for("every key repaired", Duration::from_secs(20), || {
        keys.iter().all(|k| {
            redis::cmd("PEXPIRETIME")
                .arg(k)
                .query::<i64>(&mut conn)
                .unwrap()
                // Window end, spread by the key's hash (default: 1 h / 10, at most 5 min).
                == stored_expire_at(k.as_bytes(), hour_end, 300_000)
        })
    })
    .await;
    assert!(
        p.metric("tally_ttl_audit_keys_repaired_total{counter=\"plays\"}")
            .unwrap()
            >= 200.0
    );
}
