//! Redis Sentinel: a primary, a replica and three sentinels (redis-server in sentinel mode) on
//! loopback; `tally serve` with `redis.mode = "sentinel"` takes quota units from a background
//! caller while the sentinels fail the primary over three times in a row (`SENTINEL FAILOVER`:
//! the old primary is demoted to a replica, so a connection left on it answers READONLY). After
//! each failover takes are admitted again within a few seconds, from the new primary; with
//! `durability = { replicas = 1 }` no admission is lost: the quota's count in Redis is at least
//! the admissions, and at most the admissions plus the takes that failed (which may have run).
//! A frozen sentinel (SIGSTOP) does not slow finding the primary while the others agree; two
//! that disagree are decided by their configuration epochs, never by who answered first.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::http::Client;
use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::process::TallyProcess;
use crate::common::replica::cli;
use crate::common::sentinel::{wait_until, Sentinels};

#[test]
fn quota_takes_follow_three_sentinel_failovers_and_lose_nothing_acknowledged() {
    let primary = LocalRedis::start(&[]).unwrap();
    let p: u16 = primary.url().rsplit(':').next().unwrap().parse().unwrap();
    let r = free_port().unwrap();
    let _replica = LocalRedis::start_on(r, &["--replicaof", "127.0.0.1", &p.to_string()]).unwrap();
    let sentinels = Sentinels::start(p, 1);
    let ports = sentinels.ports.clone();
    let config = format!(
        r#"{}connect_timeout = "1s"
response_timeout = "1s"
[[request.quotas]]
name = "seats"
size = 1000000
durability = {{ replicas = 1, timeout = "500ms" }}
[[request.quotas]]
name = "loose"
size = 1000000
"#,
        sentinels.redis_toml()
    );
    let tally = TallyProcess::start_command_with_http("serve", &config, "sentinel", "");
    let port = tally.port;

    let caller = Caller::start(port);
    wait_until(
        &format!("no take admitted at start; log: {}", tally.log()),
        Duration::from_secs(30),
        || caller.admitted_since(Instant::now() - Duration::from_secs(1)),
    );
    let mut resumed = Vec::new();
    for round in 1..=3 {
        resumed.push(fail_over(round, &sentinels, &ports, &tally, &caller));
    }
    let (ok, bad) = caller.stop();
    let now = sentinels.primary().unwrap();
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
    crate::common::accuracy(
        "quota",
        "3 Sentinel failovers (SENTINEL FAILOVER)",
        "replicas = 1",
        format!("{ok} admitted, {taken} taken in Redis, {bad} answered 503"),
        "admitted <= taken <= admitted + 503s",
        0,
        0,
    );
}

/// The caller: one take after another, each by a new user, until stopped; the same for a quota
/// without durability (`loose`: how soon tally itself is back).
struct Caller {
    stop: Arc<AtomicBool>,
    admitted: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    last_admit: Arc<parking_lot::Mutex<Option<Instant>>>,
    last_loose: Arc<parking_lot::Mutex<Option<Instant>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Caller {
    fn start(port: u16) -> Caller {
        let stop = Arc::new(AtomicBool::new(false));
        let (admitted, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let last_admit = Arc::new(parking_lot::Mutex::new(None::<Instant>));
        let last_loose = Arc::new(parking_lot::Mutex::new(None::<Instant>));
        let thread = {
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
        Caller {
            stop,
            admitted,
            failed,
            last_admit,
            last_loose,
            thread,
        }
    }

    fn admitted_since(&self, t: Instant) -> bool {
        self.last_admit.lock().is_some_and(|at| at > t)
    }

    /// Stops the caller; the takes admitted and failed.
    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (
            self.admitted.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// One `SENTINEL FAILOVER`, until takes are admitted from the new primary and the demoted one
/// follows it: how long the promotion took, then the first take without durability, then the
/// first with it.
fn fail_over(
    round: usize,
    sentinels: &Sentinels,
    ports: &[u16],
    tally: &TallyProcess,
    caller: &Caller,
) -> (Duration, Duration, Duration) {
    let before = sentinels.primary().unwrap();
    let started = Instant::now();
    let out = cli(ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
    assert!(out.contains("OK"), "round {round}: {out}");
    wait_until(
        "the sentinels name a new primary",
        Duration::from_secs(30),
        || sentinels.primary().is_some_and(|now| now != before),
    );
    let promoted = Instant::now();
    wait_until(
        &format!(
            "round {round}: tally never reached the new primary; log: {}",
            tally.log()
        ),
        Duration::from_secs(30),
        || caller.last_loose.lock().is_some_and(|at| at > promoted),
    );
    let reconnected = caller.last_loose.lock().unwrap() - promoted;
    wait_until(
        &format!(
            "round {round}: no take admitted after the failover; log: {}",
            tally.log()
        ),
        Duration::from_secs(30),
        || caller.admitted_since(promoted) && caller.admitted.load(Ordering::Relaxed) > 0,
    );
    let resumed = (
        promoted - started,
        reconnected,
        caller.last_admit.lock().unwrap() - promoted,
    );
    // The demoted primary follows the new one before the next round.
    let new = sentinels.primary().unwrap();
    wait_until(
        "the old primary replicates again",
        Duration::from_secs(30),
        || cli(new, &["INFO", "replication"]).contains("connected_slaves:1"),
    );
    resumed
}

/// One of three sentinels is frozen (SIGSTOP: its port accepts, nothing answers). tally finds
/// the primary as soon as the two others name it, without waiting for the frozen one: after its
/// connections are cut (`CLIENT KILL`) takes are admitted again well within the half of
/// `connect_timeout` (2 s here) that a frozen sentinel could otherwise hold every connect; and a
/// failover the two others carry out is followed.
#[test]
fn a_frozen_sentinel_does_not_hold_finding_the_primary() {
    let primary = LocalRedis::start(&[]).unwrap();
    let p: u16 = primary.url().rsplit(':').next().unwrap().parse().unwrap();
    let r = free_port().unwrap();
    let _replica = LocalRedis::start_on(r, &["--replicaof", "127.0.0.1", &p.to_string()]).unwrap();
    let sentinels = Sentinels::start(p, 1);
    sentinels.freeze(2);
    let config = format!(
        r#"{}connect_timeout = "4s"
response_timeout = "1s"
[[request.quotas]]
name = "seats"
size = 1000000
"#,
        sentinels.redis_toml()
    );
    let tally = TallyProcess::start_command_with_http("serve", &config, "sentinel-frozen", "");
    let client = Client::new(Duration::from_secs(10));
    let mut n = 0u64;
    // Takes until one is admitted; returns how long that took.
    let mut take_until_admitted = |what: &str| {
        let started = Instant::now();
        loop {
            n += 1;
            let body = format!(r#"{{"quota":"seats","user":"u{n}"}}"#);
            if client
                .post_json(tally.port, "/v1/quota", &body)
                .is_ok_and(|a| a.status == 200)
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what}: no take admitted in 30 s; log: {}",
                tally.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    take_until_admitted("at start");
    let mut reconnects = Vec::new();
    for _ in 0..3 {
        let now = sentinels.primary().unwrap();
        let killed = cli(now, &["CLIENT", "KILL", "TYPE", "normal"]);
        assert!(killed.trim().parse::<u32>().unwrap_or(0) >= 1, "{killed}");
        reconnects.push(take_until_admitted("after CLIENT KILL"));
    }
    let before = sentinels.primary().unwrap();
    let out = cli(sentinels.ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
    assert!(out.contains("OK"), "{out}");
    wait_until(
        "the sentinels name a new primary",
        Duration::from_secs(30),
        || sentinels.primary().is_some_and(|now| now != before),
    );
    let after_failover = take_until_admitted("after the failover");
    eprintln!(
        "one of three sentinels frozen: admitted again {reconnects:?} after each CLIENT KILL, {after_failover:?} after the failover"
    );
    for took in &reconnects {
        assert!(
            *took < Duration::from_secs(1),
            "took {took:?} to find the primary with one sentinel frozen (a frozen sentinel may hold a connect 2 s); log: {}",
            tally.log()
        );
    }
    // The primary now is the replica promoted by the two sentinels that answer.
    let promoted = sentinels.primary().unwrap();
    assert_eq!(
        promoted, r,
        "the first sentinel names {promoted}, not the replica"
    );
}

/// Two sentinels that disagree and a third that does not answer: one missed a failover and
/// still names the deposed primary (which, cut off from the sentinels but not from tally, still
/// says `ROLE master`); the other names the promoted replica with a newer configuration epoch.
/// Neither is a majority, and every take goes to the promoted replica whichever answers first
/// (the stale one is listed first, so it usually does).
#[test]
fn a_tie_between_sentinels_goes_to_the_newest_epoch() {
    let deposed = LocalRedis::start(&[]).unwrap();
    let d: u16 = deposed.url().rsplit(':').next().unwrap().parse().unwrap();
    let old = LocalRedis::start(&[]).unwrap();
    let o: u16 = old.url().rsplit(':').next().unwrap().parse().unwrap();
    let r = free_port().unwrap();
    let _replica = LocalRedis::start_on(r, &["--replicaof", "127.0.0.1", &o.to_string()]).unwrap();
    // Sentinel 0 watches the deposed primary; sentinel 1 fails `old` over to its replica.
    let sentinels = Sentinels::each_alone(&[d, o]);
    // Refused (`NOGOODSLAVE`) until the sentinel has seen the replica up and in sync.
    wait_until("sentinel 1 fails over", Duration::from_secs(30), || {
        cli(sentinels.ports[1], &["SENTINEL", "FAILOVER", "mymaster"]).contains("OK")
    });
    wait_until(
        "sentinel 1 names the replica",
        Duration::from_secs(30),
        || {
            let named = cli(
                sentinels.ports[1],
                &["SENTINEL", "get-master-addr-by-name", "mymaster"],
            );
            named.lines().nth(1).map(str::trim) == Some(&r.to_string())
                && cli(r, &["ROLE"]).starts_with("master")
        },
    );
    let (stale, honest) = (sentinels.epoch(0).unwrap(), sentinels.epoch(1).unwrap());
    assert!(stale < honest, "epochs: stale {stale}, honest {honest}");
    // The third sentinel: a port nobody listens on.
    let silent = free_port().unwrap();
    let config = format!(
        r#"[redis]
mode = "sentinel"
sentinels = ["redis://127.0.0.1:{}", "redis://127.0.0.1:{}", "redis://127.0.0.1:{silent}"]
master_name = "mymaster"
[[request.quotas]]
name = "seats"
size = 1000000
"#,
        sentinels.ports[0], sentinels.ports[1]
    );
    let tally = TallyProcess::start_command_with_http("serve", &config, "sentinel-tie", "");
    let client = Client::new(Duration::from_secs(10));
    for n in 0..10 {
        // A connection per take: each one asks the sentinels again.
        cli(r, &["CLIENT", "KILL", "TYPE", "normal"]);
        cli(d, &["CLIENT", "KILL", "TYPE", "normal"]);
        let body = format!(r#"{{"quota":"seats","user":"u{n}"}}"#);
        let admitted = wait_for_admission(&client, tally.port, &body);
        assert!(
            admitted,
            "take {n} not admitted in 10 s; log: {}",
            tally.log()
        );
    }
    let keys = |port: u16| cli(port, &["DBSIZE"]).trim().parse::<u64>().unwrap();
    assert_eq!(keys(d), 0, "a take went to the deposed primary");
    assert!(keys(r) > 0, "no take reached the promoted replica");
}

/// Posts `body` until it is admitted (a take may fail while the connection is re-made).
fn wait_for_admission(client: &Client, port: u16, body: &str) -> bool {
    tally_testkit::wait::wait_until(Duration::from_secs(10), || {
        client
            .post_json(port, "/v1/quota", body)
            .is_ok_and(|a| a.status == 200)
    })
}
