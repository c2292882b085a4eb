//! Redis Sentinel: a primary, a replica and three sentinels (redis-server in sentinel mode) on
//! loopback; `tally serve` with `redis.mode = "sentinel"` takes quota units from a background
//! caller while the sentinels fail the primary over three times in a row (`SENTINEL FAILOVER`:
//! the old primary is demoted to a replica, so a connection left on it answers READONLY). After
//! each failover takes are admitted again within a few seconds, from the new primary; with
//! `durability = { replicas = 1 }` no admission is lost: the quota's count in Redis is at least
//! the admissions, and at most the admissions plus the takes that failed (which may have run).

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::http::Client;
use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::process::TallyProcess;
use crate::common::replica::cli;

struct Sentinels(Vec<Child>);

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The primary's port as the sentinels name it.
fn primary_of(sentinel: u16) -> Option<u16> {
    let out = cli(
        sentinel,
        &["SENTINEL", "get-master-addr-by-name", "mymaster"],
    );
    out.lines().nth(1)?.trim().parse().ok()
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn quota_takes_follow_three_sentinel_failovers_and_lose_nothing_acknowledged() {
    let primary = LocalRedis::start(&[]).unwrap();
    let p: u16 = primary.url().rsplit(':').next().unwrap().parse().unwrap();
    let r = free_port().unwrap();
    let _replica = LocalRedis::start_on(r, &["--replicaof", "127.0.0.1", &p.to_string()]).unwrap();
    let dir = std::env::temp_dir().join(format!("tally-sentinel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let mut children = Vec::new();
    for port in &ports {
        let conf = dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {p} 2\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 3000\n",
                dir.display()
            ),
        )
        .unwrap();
        children.push(
            Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let _sentinels = Sentinels(children);
    // Every sentinel knows the replica and the other sentinels.
    wait_until("sentinels ready", Duration::from_secs(30), || {
        ports.iter().all(|s| {
            let info = cli(*s, &["SENTINEL", "master", "mymaster"]);
            let field = |name: &str| {
                let lines: Vec<&str> = info.lines().collect();
                lines
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|i| lines.get(i + 1))
                    .and_then(|v| v.parse::<u32>().ok())
            };
            field("num-slaves") == Some(1) && field("num-other-sentinels") == Some(2)
        })
    });
    let sentinels: Vec<String> = ports
        .iter()
        .map(|s| format!("\"redis://127.0.0.1:{s}\""))
        .collect();
    let config = format!(
        r#"[redis]
mode = "sentinel"
sentinels = [{}]
master_name = "mymaster"
connect_timeout = "1s"
response_timeout = "1s"
[[request.quotas]]
name = "seats"
size = 1000000
durability = {{ replicas = 1, timeout = "500ms" }}
[[request.quotas]]
name = "loose"
size = 1000000
"#,
        sentinels.join(", ")
    );
    let tally = TallyProcess::start_command_with_http("serve", &config, "sentinel", "");
    let port = tally.port;

    // The caller: one take after another, each by a new user, until stopped.
    let stop = Arc::new(AtomicBool::new(false));
    let (admitted, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let last_admit = Arc::new(parking_lot::Mutex::new(None::<Instant>));
    // The same for a quota without durability: how soon tally itself is back.
    let last_loose = Arc::new(parking_lot::Mutex::new(None::<Instant>));
    let caller = {
        let (stop, admitted, failed, last_admit, last_loose) = (
            stop.clone(),
            admitted.clone(),
            failed.clone(),
            last_admit.clone(),
            last_loose.clone(),
        );
        std::thread::spawn(move || {
            let client = Client::new(Duration::from_secs(5));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let body = format!(r#"{{"quota":"seats","user":"u{n}"}}"#);
                match client.post_json(port, "/v1/quota", &body) {
                    Ok(a) if a.status == 200 => {
                        let v: Value = serde_json::from_str(&a.body).unwrap();
                        assert_eq!(v["outcome"], "admitted", "{v}");
                        admitted.fetch_add(1, Ordering::Relaxed);
                        *last_admit.lock() = Some(Instant::now());
                    }
                    Ok(a) => {
                        assert_eq!(a.status, 503, "{}", a.body);
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    // Not listening yet.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
                let body = format!(r#"{{"quota":"loose","user":"u{n}"}}"#);
                if client
                    .post_json(port, "/v1/quota", &body)
                    .is_ok_and(|a| a.status == 200)
                {
                    *last_loose.lock() = Some(Instant::now());
                }
            }
        })
    };
    let admitted_since = |t: Instant| last_admit.lock().is_some_and(|at| at > t);
    wait_until(
        &format!("no take admitted at start; log: {}", tally.log()),
        Duration::from_secs(30),
        || admitted_since(Instant::now() - Duration::from_secs(1)),
    );
    let mut resumed = Vec::new();
    for round in 1..=3 {
        let before = primary_of(ports[0]).unwrap();
        let started = Instant::now();
        let out = cli(ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
        assert!(out.contains("OK"), "round {round}: {out}");
        wait_until(
            "the sentinels name a new primary",
            Duration::from_secs(30),
            || primary_of(ports[0]).is_some_and(|now| now != before),
        );
        let promoted = Instant::now();
        wait_until(
            &format!(
                "round {round}: tally never reached the new primary; log: {}",
                tally.log()
            ),
            Duration::from_secs(30),
            || last_loose.lock().is_some_and(|at| at > promoted),
        );
        let reconnected = last_loose.lock().unwrap() - promoted;
        wait_until(
            &format!(
                "round {round}: no take admitted after the failover; log: {}",
                tally.log()
            ),
            Duration::from_secs(30),
            || admitted_since(promoted) && admitted.load(Ordering::Relaxed) > 0,
        );
        resumed.push((
            promoted - started,
            reconnected,
            last_admit.lock().unwrap() - promoted,
        ));
        // The demoted primary follows the new one before the next round.
        let new = primary_of(ports[0]).unwrap();
        wait_until(
            "the old primary replicates again",
            Duration::from_secs(30),
            || cli(new, &["INFO", "replication"]).contains("connected_slaves:1"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    caller.join().unwrap();
    let (ok, bad) = (
        admitted.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    let now = primary_of(ports[0]).unwrap();
    let taken: u64 = {
        let keys = cli(now, &["--scan", "--pattern", "*seats*"]);
        let key = keys.lines().next().expect("the quota's key").to_string();
        cli(now, &["GET", &key]).trim().parse().unwrap_or(0)
    };
    eprintln!(
        "{ok} admitted, {bad} failed, {taken} taken in Redis; per failover (promotion took; then the first take without durability; the first with it, which waits for the demoted primary to replicate again): {resumed:?}"
    );
    assert!(
        taken >= ok && taken <= ok + bad,
        "{taken} taken for {ok} admissions and {bad} failures"
    );
}
