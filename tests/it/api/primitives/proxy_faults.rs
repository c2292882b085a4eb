//! The network between `tally serve` and Redis misbehaving, for every request-path primitive:
//! a real `redis-server`, the fault-injecting proxy of the test kit between it and tally, and
//! several client threads per primitive calling tally over HTTP while the proxy
//!
//! - resets every connection every 75 ms, and every other time also loses the next reply Redis
//!   sends (the script ran, its caller never hears of it): a client that sent a script again
//!   after such a loss would run it twice;
//! - or holds all traffic for 2 s, twice, with `redis.response_timeout` and
//!   `redis.connect_timeout` at 250 ms: the calls in flight time out, and Redis runs them when
//!   the traffic flows again; the calls after them are answered within those timeouts (not
//!   when the traffic resumes: each call once waited for every reconnection queued before it).
//!
//! Then Redis is read directly (not through the proxy) and compared with what was answered
//! (`common/truth.rs`): what Redis holds lies between the calls answered "yes" and those plus the
//! calls answered "unknown" (a 503, a limit decided without Redis). Above is an admission past
//! the limit or a script run twice (`over`), below an acknowledged write lost (`lost`). Every
//! primitive must also have seen the fault (some call answered "unknown"), else its row measured
//! nothing.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::proxy::{Proxy, ProxyHandle};
use tally_testkit::wait::wait_until;

use crate::common::accuracy;
use crate::common::ledger::{Kind, Ledger, LockFloor, KINDS, LIMIT, LIMIT_WINDOW};
use crate::common::process::TallyProcess;
use crate::common::truth::{compare, Context};

/// Client threads per primitive.
const THREADS: usize = 2;
/// Units of the quota: fewer than its callers ask for, so it sells out under the faults.
const QUOTA_SIZE: u64 = 150;
/// Items filled into the pool before the faults.
const POOL_ITEMS: usize = 2000;
/// `redis.response_timeout` and `redis.connect_timeout` of the tally under test.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

#[derive(Clone, Copy)]
enum Fault {
    Resets,
    Paused,
}

impl Fault {
    fn describe(self) -> &'static str {
        match self {
            Fault::Resets => {
                "connections reset every 75 ms (proxy), every other time after losing a reply"
            }
            Fault::Paused => "Redis traffic held 2 s twice (proxy), response timeout 250 ms",
        }
    }

    /// Run the fault's schedule (its sleeps are the schedule, not waits for a condition).
    fn inject(self, proxy: &ProxyHandle) {
        let tick = |ms| std::thread::sleep(Duration::from_millis(ms));
        match self {
            Fault::Resets => {
                for i in 0..50 {
                    tick(75);
                    proxy.reset_all();
                    if i % 2 == 1 {
                        proxy.drop_next_reply();
                    }
                }
            }
            Fault::Paused => {
                for _ in 0..2 {
                    tick(700);
                    proxy.pause();
                    tick(2000);
                    proxy.resume();
                }
            }
        }
        // Calls without a fault at the end: what was held is delivered, the clients reconnect.
        tick(500);
    }
}

fn config(proxy_port: u16) -> String {
    let mut limits = String::new();
    for kind in KINDS {
        if let Kind::Limit(algorithm) = kind {
            limits += &format!(
                "[[request.limits]]\nname = \"{algorithm}\"\nalgorithm = \"{algorithm}\"\n\
                 limit = {LIMIT}\nwindow = \"{LIMIT_WINDOW}\"\non_redis_error = \"closed\"\n"
            );
        }
    }
    format!(
        r#"[redis]
url = "redis://127.0.0.1:{proxy_port}"
response_timeout = "{}ms"
connect_timeout = "{}ms"
[[counters]]
name = "hits"
dimensions = ["k"]
key = "hits:{{k}}:{{yyyyMMddHH}}"
window = "1h"
{limits}
[[request.quotas]]
name = "q"
size = {QUOTA_SIZE}
once_per_user = true
ttl = "1h"
[[request.once]]
name = "o"
window = "1d"
[[request.unique]]
name = "uq"
window = "1h"
[[request.pools]]
name = "p"
ttl = "1h"
"#,
        RESPONSE_TIMEOUT.as_millis(),
        CONNECT_TIMEOUT.as_millis()
    )
}

fn connect(redis: &LocalRedis) -> redis::Connection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

/// A `redis-server`, the proxy in front of it, and `tally serve` through the proxy, answering,
/// its pool filled.
fn start(name: &str) -> (LocalRedis, Proxy, TallyProcess) {
    let redis = LocalRedis::start(&[]).unwrap();
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], redis.port))).unwrap();
    let tally = TallyProcess::start_command_with_http("serve", &config(proxy.port()), name, "");
    let client = Client::new(Duration::from_secs(10));
    let post = |path: &str, body: &str| {
        client
            .post_json(tally.port, path, body)
            .map(|a| (a.status, a.body))
            .unwrap_or((0, String::new()))
    };
    assert!(
        wait_until(Duration::from_secs(30), || post(
            "/v1/once",
            r#"{"name":"o","subject":"probe"}"#
        )
        .0 == 200),
        "tally serve never answered through the proxy:\n{}",
        tally.log()
    );
    let items: Vec<String> = (0..POOL_ITEMS).map(|i| format!("\"i{i}\"")).collect();
    let fill = format!(
        r#"{{"pool":"p","action":"fill","items":[{}]}}"#,
        items.join(",")
    );
    assert_eq!(post("/v1/pool", &fill).0, 200);

    (redis, proxy, tally)
}

/// Call every primitive under `fault`, then compare with Redis: what broke.
fn under(fault: Fault, name: &str) {
    let (redis, proxy, tally) = start(name);
    let ledgers: Vec<Ledger> = KINDS.into_iter().map(Ledger::new).collect();
    let floor = LockFloor::default();
    let (stop, seen_all) = (AtomicBool::new(false), AtomicBool::new(false));
    let started = Instant::now();
    let lock_tokens: HashSet<String> = std::thread::scope(|s| {
        let watcher = s.spawn(|| floor.watch(&seen_all, &mut connect(&redis)));
        let (stop, floor, redis, port) = (&stop, &floor, &redis, tally.port);
        let workers: Vec<_> = ledgers
            .iter()
            .flat_map(|l| std::iter::repeat_n(l, THREADS))
            .map(|l| s.spawn(move || l.drive(port, stop, floor, &mut connect(redis))))
            .collect();
        fault.inject(&proxy);
        stop.store(true, SeqCst);
        for w in workers {
            w.join().unwrap();
        }
        // Everything the proxy took in has reached Redis: nothing more arrives while it is
        // read.
        let mut last = proxy.bytes_up();
        assert!(wait_until(Duration::from_secs(10), || {
            std::thread::sleep(Duration::from_millis(50));
            let now = proxy.bytes_up();
            std::mem::replace(&mut last, now) == now
        }));
        seen_all.store(true, SeqCst);
        watcher.join().unwrap()
    });
    let took = started.elapsed();

    let broken = judge(fault, name, took, &ledgers, &floor, &lock_tokens, &redis);
    assert!(broken.is_empty(), "{}\n{}", broken.join("\n"), tally.log());
}

/// Each primitive's row (printed), and what broke: over or lost, odd answers, a primitive the
/// fault never reached, an answer slower than the timeouts allow.
fn judge(
    fault: Fault,
    name: &str,
    took: Duration,
    ledgers: &[Ledger],
    floor: &LockFloor,
    lock_tokens: &HashSet<String>,
    redis: &LocalRedis,
) -> Vec<String> {
    let mut direct = connect(redis);
    let ctx = Context {
        quota_size: QUOTA_SIZE,
        pool_items: POOL_ITEMS,
        floor,
        lock_tokens,
    };
    let mut broken = Vec::new();
    for ledger in ledgers {
        let calls = ledger.calls();
        let row = compare(ledger.kind, &calls, &mut direct, &ctx);
        let label = ledger.kind.label();
        accuracy(
            &label,
            fault.describe(),
            "none",
            format!("{} calls: {}", calls.len(), row.observed),
            &row.truth,
            row.over,
            row.lost,
        );
        if row.over != 0 || row.lost != 0 || !row.odd.is_empty() {
            broken.push(format!(
                "{label}: over {} lost {} ({}); odd answers: {:?}",
                row.over,
                row.lost,
                row.observed,
                &row.odd[..row.odd.len().min(5)]
            ));
        }
        let released = match ledger.kind {
            Kind::Lock => floor.releases_unknown.load(SeqCst) as usize,
            _ => 0,
        };
        if row.unknown + released == 0 {
            broken.push(format!(
                "{label}: no call answered unknown: the fault never reached it ({})",
                row.observed
            ));
        }
    }
    let slowest = ledgers
        .iter()
        .flat_map(|l| l.calls().iter().map(|c| c.took).max())
        .max()
        .unwrap_or_default();
    println!("{name}: {took:?} of calls under the fault; the slowest answer took {slowest:?}");
    // A call waits for at most one reconnection (its own or the one under way) and one reply.
    let bound = 2 * (CONNECT_TIMEOUT + RESPONSE_TIMEOUT);
    if slowest > bound {
        broken.push(format!("an answer took {slowest:?}, more than {bound:?}"));
    }
    broken
}

#[test]
fn connection_resets_lose_no_acknowledged_write_and_run_no_script_twice() {
    under(Fault::Resets, "proxy-resets");
}

#[test]
fn redis_held_past_the_response_timeout_answers_unknown_never_yes() {
    under(Fault::Paused, "proxy-paused");
}
