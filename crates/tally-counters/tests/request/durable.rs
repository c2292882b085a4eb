//! Waiting for a replica, shared: concurrent decisions with a durability level are confirmed by
//! shared `WAIT`s (group commit), each still answered only once the replica had its write. On a
//! cluster each shard's decisions wait for that shard's replica only.

use std::time::Duration;

use futures::future::join_all;
use tally_counters::config::RedisConfig;
use tally_counters::request::{Client, Durability, Quota, QuotaReply, RequestError};
use tally_testkit::local_redis::{free_port, LocalRedis};

fn info(url: &str, section: &str) -> String {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("INFO").arg(section).query(&mut c).unwrap()
}

/// `calls=` of a command in `INFO commandstats`.
fn calls(url: &str, command: &str) -> u64 {
    let stats = info(url, "commandstats");
    stats
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_share_their_waits_and_each_is_confirmed() {
    let primary = LocalRedis::start(&[]).unwrap();
    let port = free_port().unwrap();
    let primary_port = primary.url().rsplit(':').next().unwrap().to_string();
    let replica = LocalRedis::start_on(port, &["--replicaof", "127.0.0.1", &primary_port]).unwrap();
    assert!(
        tally_testkit::wait::wait_until(Duration::from_secs(20), || {
            info(&replica.url(), "replication").contains("master_link_status:up")
        }),
        "the replica never synced"
    );
    let config = RedisConfig {
        url: primary.url(),
        ..RedisConfig::default()
    };
    let client = Client::new(&config).unwrap().durable(Durability {
        replicas: 1,
        timeout: Duration::from_secs(2),
    });
    let quota = Quota::new(client, "durable", 300, false, i64::MAX / 2);
    let before = calls(&primary.url(), "wait");
    let replies = join_all((0..400).map(|_| {
        let q = quota.clone();
        async move { q.take(None).await }
    }))
    .await;
    let admitted = replies
        .iter()
        .filter(|r| matches!(r, Ok(QuotaReply::Admitted { .. })))
        .count();
    assert_eq!(admitted, 300, "{:?}", replies.iter().find(|r| r.is_err()));
    assert!(replies.iter().all(Result::is_ok));
    let waits = calls(&primary.url(), "wait") - before;
    eprintln!("400 concurrent takes confirmed by {waits} WAITs");
    assert!(waits >= 1, "nothing waited for the replica");
    assert!(
        waits < 400,
        "every decision sent its own WAIT ({waits} for 400)"
    );

    // With the replica frozen, nothing is confirmed: "not replicated", never admitted.
    let pid = replica.pid().unwrap().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let quick = Client::new(&config).unwrap().durable(Durability {
        replicas: 1,
        timeout: Duration::from_millis(100),
    });
    let q = Quota::new(quick, "durable-frozen", 10, false, i64::MAX / 2);
    let frozen = join_all((0..20).map(|_| {
        let q = q.clone();
        async move { q.take(None).await }
    }))
    .await;
    signal("-CONT");
    assert!(
        frozen
            .iter()
            .all(|r| matches!(r, Err(RequestError::NotReplicated { wanted: 1, .. }))),
        "{frozen:?}"
    );
}

/// The primary of `port`'s replica (ROLE), as a port.
fn replica_of(port: u16) -> u16 {
    let url = format!("redis://127.0.0.1:{port}");
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut c).unwrap();
    let Some(redis::Value::Array(replicas)) = role.get(2) else {
        panic!("{port} is not a primary: {role:?}");
    };
    match replicas.first() {
        Some(redis::Value::Array(r)) => redis::from_redis_value_ref::<String>(&r[1])
            .unwrap()
            .parse()
            .unwrap(),
        other => panic!("{port} has no replica: {other:?}"),
    }
}

/// The primary (a port) among `primaries` that holds quota `name`.
fn owner(primaries: &[u16], name: &str) -> u16 {
    *primaries
        .iter()
        .find(|&&port| {
            let url = format!("redis://127.0.0.1:{port}");
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("*quota:{name}:taken:*"))
                .query(&mut c)
                .unwrap();
            !keys.is_empty()
        })
        .expect("the quota's primary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_shard_whose_replica_lags_holds_up_only_its_own_decisions() {
    let cluster = tally_testkit::local_redis::LocalCluster::start(3, 1).unwrap();
    let config = RedisConfig {
        mode: tally_counters::config::RedisMode::Cluster,
        nodes: cluster.urls(),
        ..RedisConfig::default()
    };
    let client = Client::new(&config).unwrap().durable(Durability {
        replicas: 1,
        timeout: Duration::from_millis(300),
    });
    let quotas: Vec<Quota> = (0..12)
        .map(|i| {
            Quota::new(
                client.clone(),
                &format!("q{i:02}"),
                1000,
                false,
                i64::MAX / 2,
            )
        })
        .collect();
    for q in &quotas {
        assert!(matches!(
            q.take(None).await,
            Ok(QuotaReply::Admitted { .. })
        ));
    }
    let primaries = cluster.primaries();
    let owners: Vec<u16> = (0..12)
        .map(|i| owner(&primaries, &format!("q{i:02}")))
        .collect();
    let lagging = owners[0];
    let url = |port: u16| format!("redis://127.0.0.1:{port}");
    let waits_before: Vec<u64> = primaries.iter().map(|p| calls(&url(*p), "wait")).collect();

    // The lagging shard's replica is frozen: it acknowledges nothing.
    let frozen = replica_of(lagging).to_string();
    let pid = cluster
        .nodes
        .iter()
        .find(|n| n.url() == url(frozen.parse().unwrap()));
    let pid = pid.unwrap().pid().unwrap().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let replies = join_all((0..240).map(|i| {
        let q = quotas[i % 12].clone();
        async move { q.take(None).await }
    }))
    .await;
    signal("-CONT");
    for (i, reply) in replies.iter().enumerate() {
        if owners[i % 12] == lagging {
            assert!(
                matches!(reply, Err(RequestError::NotReplicated { wanted: 1, .. })),
                "q{:02}, on the lagging shard: {reply:?}",
                i % 12
            );
        } else {
            assert!(
                matches!(reply, Ok(QuotaReply::Admitted { .. })),
                "q{:02}, its replica in sync: {reply:?}",
                i % 12
            );
        }
    }
    // Each primary got WAITs for its own decisions only, shared among them.
    for (p, before) in primaries.iter().zip(waits_before) {
        let decisions = owners.iter().filter(|o| *o == p).count() * 20;
        let waits = calls(&url(*p), "wait") - before;
        eprintln!("primary {p}: {decisions} decisions confirmed by {waits} WAITs");
        assert!(
            (decisions == 0 || waits >= 1) && waits < decisions.max(1) as u64,
            "primary {p}: {waits} WAITs for {decisions} decisions"
        );
    }
}
