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

use tally_testkit::http::Client;
use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::accuracy;
use crate::common::primitives::Api;
use crate::common::process::TallyProcess;
use crate::common::replica::{cut_replica, fail_over_with_lag, port_of, wait_synced};

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
/// How many of `given` were given before (an item given twice counts once).
fn given_twice(given: &[String]) -> i64 {
    let mut distinct = given.to_vec();
    distinct.sort();
    distinct.dedup();
    (given.len() - distinct.len()) as i64
}

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
    let servers = Servers::start(p);
    let (api, locks) = (&servers.api, &servers.locks);
    let mut sold = Sold::while_replicated(api, &servers.tally);
    let fence_before = sold.while_the_replica_lags(api, locks, p, &replica);

    // The primary dies; the replica (without the last writes) is promoted and served at the
    // primary's address.
    let _new = fail_over_with_lag(&mut primary, &replica);
    // The old replica follows the new primary, so the durable families have a replica again
    // (until then they answer not-replicated).
    wait_synced(p, r_port);
    api.wait_redis();
    sold.after_the_failover(api);
    sold.check(api, locks, fence_before);
    sold.record_accuracy();
}

/// `tally serve` with the quotas, pools, onces and limits (durable and not) on the primary at
/// `p`, and a second one whose locks wait for a replica.
struct Servers {
    tally: TallyProcess,
    api: Api,
    /// The second tally, running while `locks` asks it.
    _durable_locks: TallyProcess,
    locks: Api,
}

impl Servers {
    fn start(p: u16) -> Servers {
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
        Servers {
            tally,
            api,
            _durable_locks: durable_locks,
            locks,
        }
    }
}

/// What each family admitted or gave across the failover: quotas (`flash` durable, `loose`
/// not), pools (`codes` durable, `lootbox` not) and limits per algorithm (`strict` durable,
/// `lax` not).
struct Sold {
    flash: Vec<String>,
    loose: Vec<String>,
    codes: Vec<String>,
    lootbox: Vec<String>,
    strict: [usize; 4],
    lax: [usize; 4],
}

impl Sold {
    /// Replication healthy: every take is confirmed.
    fn while_replicated(api: &Api, tally: &TallyProcess) -> Sold {
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
        let codes = vec![api.claim("codes", "alice").expect("an item for alice")];
        let lootbox = vec![api.claim("lootbox", "alice").expect("an item for alice")];
        // Admissions per algorithm, with durability (`strict`) and without (`lax`).
        let (mut strict, mut lax) = ([0usize; 4], [0usize; 4]);
        for _ in 0..5 {
            decide_all(api, &mut strict, &mut lax);
        }

        Sold {
            flash,
            loose,
            codes,
            lootbox,
            strict,
            lax,
        }
    }

    /// The replica stops and its link is cut (the primary closes it, so nothing written from
    /// now on reaches the replica, not even through a socket buffer): the primary acknowledges
    /// alone. Returns the fencing token handed out meanwhile.
    fn while_the_replica_lags(
        &mut self,
        api: &Api,
        locks: &Api,
        p: u16,
        replica: &LocalRedis,
    ) -> u64 {
        cut_replica(p, replica);
        for i in 6..=10 {
            let user = format!("u{i}");
            let started = Instant::now();
            assert!(
                !api.take("flash", &user),
                "an unreplicated take of a durable quota was admitted"
            );
            assert!(started.elapsed() < Duration::from_secs(2));
            if api.take("loose", &user) {
                self.loose.push(user);
            }
        }
        assert!(
            !api.first("bonus", "s2"),
            "an unreplicated once was answered first"
        );
        let refused = self.strict;
        for _ in 0..5 {
            decide_all(api, &mut self.strict, &mut self.lax);
        }
        assert_eq!(self.strict, refused, "an unreplicated charge was admitted");
        assert_eq!(
            api.claim("codes", "bob"),
            None,
            "an unreplicated claim of a durable pool was given"
        );
        self.lootbox
            .push(api.claim("lootbox", "bob").expect("an item for bob"));
        let free_first_before = api.first("free", "s2");
        assert!(free_first_before);
        let fence_before = api.fence().expect("the lock was free");
        assert_eq!(
            locks.acquire("fresh"),
            None,
            "an unreplicated acquire of a durable lock was granted"
        );

        fence_before
    }

    /// After the failover, as many more takes as are left; everyone claims until the pools are
    /// empty.
    fn after_the_failover(&mut self, api: &Api) {
        for i in 11..=25 {
            let user = format!("u{i}");
            if api.take("flash", &user) {
                self.flash.push(user.clone());
            }
            if api.take("loose", &user) {
                self.loose.push(user);
            }
        }
        // Everyone claims until the pools are empty.
        for user in ["bob", "carol", "dave", "erin"] {
            self.codes.extend(api.claim("codes", user));
            self.lootbox.extend(api.claim("lootbox", user));
        }
        for _ in 0..15 {
            decide_all(api, &mut self.strict, &mut self.lax);
        }
    }

    fn check(&self, api: &Api, locks: &Api, fence_before: u64) {
        let Sold {
            flash,
            loose,
            codes,
            lootbox,
            ..
        } = self;
        let (strict, lax) = (self.strict, self.lax);
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
        assert_eq!(
            given_twice(codes),
            0,
            "a durable pool gave an item twice: {codes:?}"
        );
        assert_eq!(codes.len(), 3, "every item given once: {codes:?}");
        // Without durability bob's item went back into the pool with the lost write, and was given
        // again.
        assert_eq!(
            given_twice(lootbox),
            1,
            "the loss bound: the item given while the replica lagged is given again: {lootbox:?}"
        );
    }

    /// The accuracy table's rows for this failover, in the table's order: (primitive,
    /// durability, observed, truth, over, lost).
    fn record_accuracy(&self) {
        let (durable, none) = ("replicas = 1", "none");
        let over = |n: usize| n as i64 - 10;
        let (flash, loose) = (self.flash.len(), self.loose.len());
        let (codes, lootbox) = (&self.codes, &self.lootbox);
        let mut rows: Vec<(String, &str, String, &str, i64, i64)> = vec![
            (
                "quota (size 10)".into(),
                durable,
                format!("{flash} sold"),
                "10",
                over(flash),
                0,
            ),
            (
                "quota (size 10)".into(),
                none,
                format!("{loose} sold"),
                "10",
                over(loose),
                5,
            ),
        ];
        for (i, algorithm) in ALGORITHMS.iter().enumerate() {
            let primitive = format!("limit, {algorithm} (10/day)");
            let (s, l) = (self.strict[i], self.lax[i]);
            rows.push((
                primitive.clone(),
                durable,
                format!("{s} admitted"),
                "10",
                over(s),
                0,
            ));
            rows.push((primitive, none, format!("{l} admitted"), "10", over(l), 5));
        }
        let (pool, each) = ("pool (3 items)", "each item once");
        rows.extend([
            (
                "once".into(),
                durable,
                "first once".into(),
                "first once",
                0,
                0,
            ),
            (
                pool.into(),
                durable,
                format!("{codes:?} given"),
                each,
                given_twice(codes),
                0,
            ),
            (
                pool.into(),
                none,
                format!("{lootbox:?} given"),
                each,
                given_twice(lootbox),
                1,
            ),
            (
                "once".into(),
                none,
                "first twice".into(),
                "first once",
                1,
                1,
            ),
            (
                "lock".into(),
                durable,
                "lease held across the failover; the unreplicated acquire answered 503".into(),
                "one holder",
                0,
                0,
            ),
            (
                "lock (fencing token)".into(),
                none,
                "lease lost, second holder's token larger".into(),
                "tokens only grow",
                0,
                1,
            ),
        ]);
        let fault = "primary failover with replication lag";
        for (primitive, durability, observed, truth, over, lost) in rows {
            accuracy(&primitive, fault, durability, observed, truth, over, lost);
        }
    }
}
