//! Replicated Redis on loopback: `redis-cli` against a port, waiting for a replica to catch up,
//! signals to the servers, and a failover with replication lag as operators meet it.

use std::process::Command;
use std::time::{Duration, Instant};

use tally_testkit::local_redis::LocalRedis;

/// `redis-cli -p port args…`; its stdout.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The port a local server listens on.
pub fn port_of(redis: &LocalRedis) -> u16 {
    redis.url().rsplit(':').next().unwrap().parse().unwrap()
}

/// Until `replica` (a port) reports its link to the primary up and caught up.
pub fn wait_synced(primary: u16, replica: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = cli(replica, &["INFO", "replication"]);
        let offset = |info: &str, key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<i64>().ok())
        };
        let master = offset(
            &cli(primary, &["INFO", "replication"]),
            "master_repl_offset:",
        );
        if info.contains("master_link_status:up")
            && master.is_some()
            && offset(&info, "slave_repl_offset:") >= master
        {
            return;
        }
        assert!(Instant::now() < deadline, "replica never synced: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// The replica stops (SIGSTOP) and the primary cuts its link (`CLIENT KILL TYPE replica`): from
/// now on the primary acknowledges writes alone; nothing reaches the replica, not even through
/// a socket buffer.
pub fn cut_replica(primary: u16, replica: &LocalRedis) {
    signal(replica.pid().unwrap(), "-STOP");
    cli(primary, &["CLIENT", "KILL", "TYPE", "replica"]);
}

/// The primary dies (SIGKILL) and the cut replica, without the writes it missed, is continued,
/// promoted and served at the primary's address (a new server there replicates it, then is
/// promoted); the old replica then follows the new primary. Returns the new primary.
pub fn fail_over_with_lag(primary: &mut LocalRedis, replica: &LocalRedis) -> LocalRedis {
    let p = port_of(primary);
    let r = port_of(replica);
    signal(primary.pid().unwrap(), "-KILL");
    primary.stop();
    signal(replica.pid().unwrap(), "-CONT");
    cli(r, &["REPLICAOF", "NO", "ONE"]);
    // Until its first sync the copy refuses reads (MASTERDOWN) rather than serve an empty
    // dataset: a promoted replica has the data, only this way of moving it has not yet.
    let args = [
        "--replicaof",
        "127.0.0.1",
        &r.to_string(),
        "--replica-serve-stale-data",
        "no",
    ];
    let new = LocalRedis::start_on(p, &args).unwrap();
    wait_synced(r, p);
    cli(p, &["REPLICAOF", "NO", "ONE"]);
    cli(r, &["REPLICAOF", "127.0.0.1", &p.to_string()]);
    new
}
