//! Waiting for a replica, shared: concurrent decisions with a durability level are confirmed by
//! shared `WAIT`s (group commit), each still answered only once the replica had its write.

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
