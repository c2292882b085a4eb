//! A replicated Redis failing over with replication lag: a primary and a replica on loopback,
//! the replica stopped (SIGSTOP) and its link cut (`CLIENT KILL TYPE replica`), writes
//! acknowledged by the primary only, the primary killed with SIGKILL, the replica continued and promoted, and its data served
//! at the primary's address (a new server there, a replica of it, then promoted) — tally running
//! throughout.
//!
//! With `durability = { replicas = 1 }` a quota admits at most its size, a limit (each of the four
//! algorithms) at most its limit, and `once` answers first once: what the replica did not get was
//! answered 503 `not-replicated`, never admitted. Without it the test measures the loss the guide
//! states: every admission made while the replica lagged is undone (the quota oversells and every
//! limit over-admits by exactly those, `once` answers first twice). Fencing
//! tokens (Redis `TIME`-based) stay larger after the failover, though the lock itself was lost.

use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::http::Client;
use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::accuracy;
use crate::common::process::TallyProcess;
use crate::common::replica::{cut_replica, fail_over_with_lag, port_of, wait_synced};

struct Api {
    client: Client,
    port: u16,
}

impl Api {
    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        match self.client.post_json(self.port, path, body) {
            Ok(a) => (
                a.status,
                serde_json::from_str(&a.body).unwrap_or(Value::Null),
            ),
            // Not listening yet.
            Err(_) => (0, Value::Null),
        }
    }

    /// The answer's body when its status is one of `ok`; None when it is 503 `not-replicated`
    /// (fewer replicas than asked had the write in time); panics on any other answer.
    fn answered(&self, path: &str, body: &str, ok: &[u16]) -> Option<Value> {
        let (status, body) = self.post(path, body);
        match status {
            s if ok.contains(&s) => Some(body),
            503 => {
                let kind = body["type"].as_str().unwrap_or("");
                assert!(kind.ends_with("/not-replicated"), "{body}");
                None
            }
            _ => panic!("{status} {body}"),
        }
    }

    /// Whether a take of `quota` by `user` was admitted (200 `admitted`).
    fn take(&self, quota: &str, user: &str) -> bool {
        let body = format!(r#"{{"quota":"{quota}","user":"{user}"}}"#);
        self.answered("/v1/quota", &body, &[200])
            .is_some_and(|b| b["outcome"] == "admitted")
    }

    /// Whether a decision of limit `policy` was admitted (200 `admitted: true`).
    fn admitted(&self, policy: &str) -> bool {
        let body = format!(r#"{{"policy":"{policy}","subject":"s"}}"#);
        self.answered("/v1/limit", &body, &[200, 429])
            .is_some_and(|b| b["admitted"] == true)
    }

    /// Whether `once` answered first (200 `ok: true`).
    fn first(&self, name: &str, subject: &str) -> bool {
        let (status, body) = self.post(
            "/v1/once",
            &format!(r#"{{"name":"{name}","subject":"{subject}"}}"#),
        );
        status == 200 && body["ok"] == true
    }

    /// The item pool `pool` gave `user` (200 `given`); None when refused or empty.
    fn claim(&self, pool: &str, user: &str) -> Option<String> {
        let body = format!(r#"{{"pool":"{pool}","user":"{user}"}}"#);
        let answer = self.answered("/v1/pool", &body, &[200])?;
        (answer["outcome"] == "given").then(|| answer["item"].as_str().unwrap().to_string())
    }

    /// Acquire lock `name` for two minutes: Some(acquired), None when not replicated.
    fn acquire(&self, name: &str) -> Option<bool> {
        let path = format!("/v1/locks/{name}/acquire");
        self.answered(&path, r#"{"ttl_ms":120000}"#, &[200])
            .map(|b| b["acquired"] == true)
    }

    fn fence(&self) -> Option<u64> {
        let (status, body) = self.post("/v1/locks/nightly/acquire", r#"{"ttl_ms":120000}"#);
        assert_eq!(status, 200, "{body}");
        body["lease"]["fence"].as_u64()
    }

    /// Until tally answers from the new primary (a take of a throwaway quota user).
    fn wait_redis(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .post("/v1/once", r#"{"name":"free","subject":"probe"}"#)
            .0
            != 200
        {
            assert!(
                Instant::now() < deadline,
                "tally never reached the new primary"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Every limit algorithm: each has a durable policy (`strict_<algorithm>`) and one without
/// (`lax_<algorithm>`), 10 a day.
const ALGORITHMS: [&str; 4] = ["fixed", "sliding_log", "sliding_counter", "gcra"];

fn limits_toml() -> String {
    let mut toml = String::new();
    for a in ALGORITHMS {
        for (name, durability) in [
            (
                "strict",
                "durability = { replicas = 1, timeout = \"200ms\" }\n",
            ),
            ("lax", ""),
        ] {
            toml += &format!(
                "[[request.limits]]\nname = \"{name}_{a}\"\nalgorithm = \"{a}\"\nlimit = 10\n\
                 window = \"1d\"\n{durability}"
            );
        }
    }
    toml
}

/// One decision of every limit policy, counted per algorithm when admitted.
fn decide_all(api: &Api, strict: &mut [usize; 4], lax: &mut [usize; 4]) {
    for (i, a) in ALGORITHMS.iter().enumerate() {
        strict[i] += usize::from(api.admitted(&format!("strict_{a}")));
        lax[i] += usize::from(api.admitted(&format!("lax_{a}")));
    }
}

#[test]
fn a_failover_with_lag_undoes_nothing_acknowledged_at_the_durability_level() {
    let mut primary = LocalRedis::start(&[]).unwrap();
    let p = port_of(&primary);
    let r_port = free_port().unwrap();
    let replica =
        LocalRedis::start_on(r_port, &["--replicaof", "127.0.0.1", &p.to_string()]).unwrap();
    wait_synced(p, r_port);
    let config = format!(
        r#"[redis]
url = "redis://127.0.0.1:{p}"
response_timeout = "2s"
[[request.quotas]]
name = "flash"
size = 10
once_per_user = true
durability = {{ replicas = 1, timeout = "200ms" }}
[[request.quotas]]
name = "loose"
size = 10
once_per_user = true
{}
[[request.pools]]
name = "codes"
ttl = "1d"
durability = {{ replicas = 1, timeout = "200ms" }}
[[request.pools]]
name = "lootbox"
ttl = "1d"
[[request.once]]
name = "bonus"
window = "1d"
durability = {{ replicas = 1, timeout = "200ms" }}
[[request.once]]
name = "free"
window = "1d"
"#,
        limits_toml()
    );
    let tally = TallyProcess::start_command_with_http("serve", &config, "replication", "");
    let api = Api {
        client: Client::new(Duration::from_secs(10)),
        port: tally.port,
    };
    api.wait_redis();
    // A second tally whose locks wait for a replica.
    let locks_config = format!(
        "[redis]\nurl = \"redis://127.0.0.1:{p}\"\nresponse_timeout = \"2s\"\n[request.locks]\ndurability = {{ replicas = 1, timeout = \"200ms\" }}\n[[request.once]]\nname = \"free\"\nwindow = \"1d\"\n"
    );
    let durable_locks =
        TallyProcess::start_command_with_http("serve", &locks_config, "replication-locks", "");
    let locks = Api {
        client: Client::new(Duration::from_secs(10)),
        port: durable_locks.port,
    };
    locks.wait_redis();
    assert_eq!(locks.acquire("held"), Some(true), "{}", durable_locks.log());

    // Replication healthy: every take is confirmed.
    let (mut flash, mut loose) = (Vec::new(), Vec::new());
    for i in 1..=5 {
        let user = format!("u{i}");
        assert!(api.take("flash", &user), "{}", tally.log());
        flash.push(user.clone());
        assert!(api.take("loose", &user));
        loose.push(user);
    }
    assert!(api.first("bonus", "s1"));
    assert!(api.first("free", "s1"));
    // Each pool holds three items; alice gets one of each.
    for pool in ["codes", "lootbox"] {
        let fill = format!(r#"{{"pool":"{pool}","items":["c1","c2","c3"],"action":"fill"}}"#);
        assert_eq!(api.post("/v1/pool", &fill).0, 200);
    }
    let mut codes = vec![api.claim("codes", "alice").expect("an item for alice")];
    let mut lootbox = vec![api.claim("lootbox", "alice").expect("an item for alice")];
    // Admissions per algorithm, with durability (`strict`) and without (`lax`).
    let (mut strict, mut lax) = ([0usize; 4], [0usize; 4]);
    for _ in 0..5 {
        decide_all(&api, &mut strict, &mut lax);
    }

    // The replica stops and its link is cut (the primary closes it, so nothing written from now
    // on reaches the replica, not even through a socket buffer): the primary acknowledges alone.
    cut_replica(p, &replica);
    for i in 6..=10 {
        let user = format!("u{i}");
        let started = Instant::now();
        assert!(
            !api.take("flash", &user),
            "an unreplicated take of a durable quota was admitted"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        if api.take("loose", &user) {
            loose.push(user);
        }
    }
    assert!(
        !api.first("bonus", "s2"),
        "an unreplicated once was answered first"
    );
    let refused = strict;
    for _ in 0..5 {
        decide_all(&api, &mut strict, &mut lax);
    }
    assert_eq!(strict, refused, "an unreplicated charge was admitted");
    assert_eq!(
        api.claim("codes", "bob"),
        None,
        "an unreplicated claim of a durable pool was given"
    );
    lootbox.push(api.claim("lootbox", "bob").expect("an item for bob"));
    let free_first_before = api.first("free", "s2");
    assert!(free_first_before);
    let fence_before = api.fence().expect("the lock was free");
    assert_eq!(
        locks.acquire("fresh"),
        None,
        "an unreplicated acquire of a durable lock was granted"
    );

    // The primary dies; the replica (without the last writes) is promoted and served at the
    // primary's address.
    let _new = fail_over_with_lag(&mut primary, &replica);
    // The old replica follows the new primary, so the durable families have a replica again
    // (until then they answer not-replicated).
    wait_synced(p, r_port);
    api.wait_redis();

    // After the failover, as many more takes as are left.
    for i in 11..=25 {
        let user = format!("u{i}");
        if api.take("flash", &user) {
            flash.push(user.clone());
        }
        if api.take("loose", &user) {
            loose.push(user);
        }
    }
    // Everyone claims until the pools are empty.
    for user in ["bob", "carol", "dave", "erin"] {
        codes.extend(api.claim("codes", user));
        lootbox.extend(api.claim("lootbox", user));
    }
    for _ in 0..15 {
        decide_all(&api, &mut strict, &mut lax);
    }
    // Every algorithm alike: the charges the replica never got are undone.
    assert_eq!(
        (strict, lax),
        ([10; 4], [15; 4]),
        "durable limits of 10 ({ALGORITHMS:?}) admitted {strict:?} across the failover; \
         without durability, the loss bound: 15 (the 5 admitted while the replica lagged)"
    );
    assert_eq!(
        flash.len(),
        10,
        "a durable quota of 10 admitted {flash:?} across the failover"
    );
    // Without durability: the 5 admissions the replica never got are undone, and sold again.
    assert_eq!(
        loose.len(),
        15,
        "the loss bound: the 5 admissions made while the replica lagged: {loose:?}"
    );
    assert!(
        api.first("bonus", "s2"),
        "the refused once may be asked again"
    );
    assert!(
        api.first("free", "s2"),
        "without durability, once answers first a second time after the failover (measured)"
    );
    // The lock acquired while the replica lagged is gone with the primary, so a second holder
    // gets it; its fencing token is still larger (Redis TIME), so a resource refuses the first.
    locks.wait_redis();
    assert_eq!(
        locks.acquire("held"),
        Some(false),
        "a durable lease survives the failover: no second holder"
    );
    assert_eq!(
        locks.acquire("fresh"),
        Some(true),
        "the refused acquire was never granted, and is free after the failover"
    );
    let fence_after = api
        .fence()
        .expect("the lost lock is free on the new primary");
    assert!(
        fence_after > fence_before,
        "fence {fence_after} after the failover, {fence_before} before"
    );
    let twice = |given: &[String]| {
        let mut distinct = given.to_vec();
        distinct.sort();
        distinct.dedup();
        (given.len() - distinct.len()) as i64
    };
    assert_eq!(
        twice(&codes),
        0,
        "a durable pool gave an item twice: {codes:?}"
    );
    assert_eq!(codes.len(), 3, "every item given once: {codes:?}");
    // Without durability bob's item went back into the pool with the lost write, and was given
    // again.
    assert_eq!(
        twice(&lootbox),
        1,
        "the loss bound: the item given while the replica lagged is given again: {lootbox:?}"
    );
    let fault = "primary failover with replication lag";
    let over = |n: usize| n as i64 - 10;
    let (durable, none) = ("replicas = 1", "none");
    accuracy(
        "quota (size 10)",
        fault,
        durable,
        format!("{} sold", flash.len()),
        "10",
        over(flash.len()),
        0,
    );
    accuracy(
        "quota (size 10)",
        fault,
        none,
        format!("{} sold", loose.len()),
        "10",
        over(loose.len()),
        5,
    );
    for (i, algorithm) in ALGORITHMS.iter().enumerate() {
        let primitive = format!("limit, {algorithm} (10/day)");
        let (s, l) = (strict[i], lax[i]);
        accuracy(
            &primitive,
            fault,
            durable,
            format!("{s} admitted"),
            "10",
            over(s),
            0,
        );
        accuracy(
            &primitive,
            fault,
            none,
            format!("{l} admitted"),
            "10",
            over(l),
            5,
        );
    }
    accuracy("once", fault, durable, "first once", "first once", 0, 0);
    accuracy(
        "pool (3 items)",
        fault,
        durable,
        format!("{codes:?} given"),
        "each item once",
        twice(&codes),
        0,
    );
    accuracy(
        "pool (3 items)",
        fault,
        none,
        format!("{lootbox:?} given"),
        "each item once",
        twice(&lootbox),
        1,
    );
    accuracy("once", fault, none, "first twice", "first once", 1, 1);
    accuracy(
        "lock",
        fault,
        durable,
        "lease held across the failover; the unreplicated acquire answered 503",
        "one holder",
        0,
        0,
    );
    accuracy(
        "lock (fencing token)",
        fault,
        none,
        "lease lost, second holder's token larger",
        "tokens only grow",
        0,
        1,
    );
}
