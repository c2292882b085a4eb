//! Limit decisions batched (group commit): many callers' decisions in one script call, each
//! with its own reply. A client with one call in flight batches whatever queues behind it; the
//! tests prove batches happened (fewer EVALSHA calls than decisions) and check every caller's
//! reply and the final state against what a serial order of single calls gives.

use std::collections::HashMap;

use futures::future::join_all;
use rand::RngExt;
use tally_counters::request::{Algorithm, Batching, Client, Decision, RateLimiter};

use super::limits::policy;
use super::support::{keys_matching, node, Deployment};

/// Long windows: the tests never cross a boundary, so every limit is a plain budget.
const DAY_100: u64 = 100 * 86_400_000;
const HOUR: u64 = 3_600_000;

/// Per (policy set, subject, policy): the admitted and the denied decisions as (cost, remaining).
type Seen = HashMap<(usize, &'static str, usize), (Vec<(u64, u64)>, Vec<(u64, u64)>)>;

/// A client that keeps one script call in flight and batches what queues behind it.
fn batching_client(dep: &Deployment) -> Client {
    let batching = Batching {
        max_calls: 32,
        in_flight: 1,
    };
    Client::with_batching(&dep.config(), batching).unwrap()
}

/// EVALSHA calls run so far, summed over every node.
async fn evalsha_calls(dep: &Deployment) -> u64 {
    let mut calls = 0;
    for url in dep.urls() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut node(&url).await)
            .await
            .unwrap();
        calls += info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap());
    }
    calls
}

/// An integer reply of `cmd` on `key`, asked of the node that holds it.
async fn read(dep: &Deployment, cmd: &str, key: &str, field: Option<&str>) -> i64 {
    let mut cmd = redis::cmd(cmd);
    cmd.arg(key);
    if let Some(f) = field {
        cmd.arg(f);
    }
    cmd.query_async(&mut node_of(dep, key).await).await.unwrap()
}

/// The admitted decisions of one policy on one key, as (cost, remaining): with a serial order
/// of single calls they form a chain from the limit down, each `remaining` being the one before
/// less the cost; and each denial saw fewer than its cost left.
fn assert_serial(label: &str, limit: u64, admitted: &mut [(u64, u64)], denied: &[(u64, u64)]) {
    admitted.sort_by_key(|&(_, remaining)| std::cmp::Reverse(remaining));
    let mut left = limit;
    for &(cost, remaining) in admitted.iter() {
        assert_eq!(remaining, left - cost, "{label}: {admitted:?}");
        left = remaining;
    }
    for &(cost, remaining) in denied {
        assert!(
            remaining < cost,
            "{label}: denied with {remaining} left for {cost}"
        );
    }
}

/// 200 callers, each asking 10 decisions of a random policy set, subject and cost (1 or 2),
/// over two batching clients: fixed, sliding log, sliding counter, GCRA and a pair in one call.
pub async fn mixed_batches_answer_each_caller_exactly(dep: &Deployment) {
    let policies = vec![
        policy("b_fixed", Algorithm::Fixed, 30, DAY_100),
        policy("b_log", Algorithm::SlidingLog, 20, HOUR),
        policy("b_counter", Algorithm::SlidingCounter, 25, DAY_100),
        policy("b_gcra", Algorithm::Gcra, 15, HOUR),
        policy("b_pair_gcra", Algorithm::Gcra, 10, HOUR),
        policy("b_pair_fixed", Algorithm::Fixed, 40, DAY_100),
    ];
    let sets: [&[&str]; 5] = [
        &["b_fixed"],
        &["b_log"],
        &["b_counter"],
        &["b_gcra"],
        &["b_pair_gcra", "b_pair_fixed"],
    ];
    let limiters: Vec<RateLimiter> = (0..2)
        .map(|_| RateLimiter::new(batching_client(dep), policies.clone()).unwrap())
        .collect();
    let before = evalsha_calls(dep).await;
    let tasks = (0..200).map(|t| {
        let limiter = limiters[t % 2].clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..10 {
                let (set, subject, cost) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(0..5),
                        ["x", "y"][rng.random_range(0..2)],
                        rng.random_range(1..=2),
                    )
                };
                let d = limiter.check(sets[set], subject, cost).await.unwrap();
                out.push((set, subject, cost, d));
            }
            out
        })
    });
    let results: Vec<(usize, &'static str, u64, Decision)> = join_all(tasks)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    let calls = evalsha_calls(dep).await - before;
    assert!(
        calls < 2000 / 4,
        "{calls} EVALSHA calls for 2000 decisions: not batched"
    );
    let mut by = Seen::new();
    for (set, subject, cost, d) in &results {
        assert!(!d.without_redis);
        let every = d.policies.iter().all(|v| v.allowed);
        assert_eq!(d.admitted, every, "admitted only if every policy admits");
        for (i, v) in d.policies.iter().enumerate() {
            let entry = by.entry((*set, *subject, i)).or_default();
            match d.admitted {
                true => entry.0.push((*cost, v.remaining)),
                false if !v.allowed => entry.1.push((*cost, v.remaining)),
                false => {}
            }
        }
    }
    for subject in ["x", "y"] {
        check_subject(dep, &mut by, subject).await;
    }
}

/// Each policy's budget of `subject`: replies form a serial chain and Redis holds their sum.
async fn check_subject(dep: &Deployment, by: &mut Seen, subject: &'static str) {
    let mut take = |set: usize, i: usize| by.remove(&(set, subject, i)).unwrap_or_default();
    let sum = |a: &[(u64, u64)]| a.iter().map(|&(c, _)| c).sum::<u64>() as i64;
    let stored = |kind: &str, name: &str| format!("*{kind}:{name}:{subject}:*");
    // Fixed: the chain, and the hash's count.
    let (mut adm, den) = take(0, 0);
    assert_serial("fixed", 30, &mut adm, &den);
    let key = keys_matching(dep, &stored("limit.fixed", "b_fixed")).await;
    let n = read(dep, "HGET", &key, Some("n")).await;
    assert_eq!(n, sum(&adm));
    assert!(n >= 29, "the budget is used up: {n}");
    // Sliding log: the chain, one entry per admitted unit.
    let (mut adm, den) = take(1, 0);
    assert_serial("sliding_log", 20, &mut adm, &den);
    let key = keys_matching(dep, &stored("limit.log", "b_log")).await;
    assert_eq!(read(dep, "ZCARD", &key, None).await, sum(&adm));
    assert!(sum(&adm) >= 19);
    // Sliding counter (first window: a plain budget).
    let (mut adm, den) = take(2, 0);
    assert_serial("sliding_counter", 25, &mut adm, &den);
    assert!(sum(&adm) >= 24);
    // GCRA: the burst, less at most the drift of the test's few seconds.
    let (adm, _) = take(3, 0);
    assert!(
        (14..=15).contains(&sum(&adm)),
        "gcra admitted {}",
        sum(&adm)
    );
    // The pair: the GCRA bounds it; the fixed one counts exactly what the pair admitted.
    let (adm_gcra, _) = take(4, 0);
    let (mut adm_fixed, _) = take(4, 1);
    assert_eq!(sum(&adm_gcra), sum(&adm_fixed));
    assert!((9..=10).contains(&sum(&adm_gcra)));
    assert_serial("pair fixed", 40, &mut adm_fixed, &[]);
    let key = keys_matching(dep, &stored("limit.fixed", "b_pair_fixed")).await;
    assert_eq!(read(dep, "HGET", &key, Some("n")).await, sum(&adm_fixed));
}

/// The node that holds `key` (KEYS: a cluster node answers it for its own keys only).
async fn node_of(dep: &Deployment, key: &str) -> redis::aio::MultiplexedConnection {
    for url in dep.urls() {
        let mut conn = node(&url).await;
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !found.is_empty() {
            return conn;
        }
    }
    panic!("{key} is on no node");
}

/// One decision in a batch meets a key of the wrong type: that caller alone gets the error
/// (answered by its policy's `on_redis_error`, as for a single call), every other decision of
/// the same batches is exact.
pub async fn an_error_in_a_batch_touches_only_its_caller(dep: &Deployment) {
    let limiter = RateLimiter::new(
        batching_client(dep),
        vec![
            policy("e_broken", Algorithm::Gcra, 1000, HOUR),
            policy("e_fine", Algorithm::Fixed, 50, DAY_100),
        ],
    )
    .unwrap();
    // Make the broken policy's key a hash: GCRA's GET fails with WRONGTYPE.
    limiter.check(&["e_broken"], "s", 1).await.unwrap();
    let key = keys_matching(dep, "*limit.gcra:e_broken:s:*").await;
    let mut conn = node_of(dep, &key).await;
    let _: () = redis::pipe()
        .del(&key)
        .hset(&key, "f", 1)
        .pexpire(&key, 3_600_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = evalsha_calls(dep).await;
    let tasks = (0..200).map(|t| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let broken = t % 2 == 0;
            let name = if broken { "e_broken" } else { "e_fine" };
            (broken, limiter.check(&[name], "s", 1).await.unwrap())
        })
    });
    let results: Vec<(bool, Decision)> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let calls = evalsha_calls(dep).await - before;
    assert!(
        calls < 200 / 4,
        "{calls} EVALSHA calls for 200 decisions: not batched"
    );
    let (mut admitted, mut denied) = (Vec::new(), Vec::new());
    for (broken, d) in results {
        assert_eq!(d.without_redis, broken, "{d:?}");
        if broken {
            assert!(d.admitted, "fails open as configured: {d:?}");
        } else if d.admitted {
            admitted.push((1, d.policies[0].remaining));
        } else {
            denied.push((1, d.policies[0].remaining));
        }
    }
    assert_eq!(
        (admitted.len(), denied.len()),
        (50, 50),
        "100 asks of a budget of 50"
    );
    assert_serial("fine", 50, &mut admitted, &denied);
    let key = keys_matching(dep, "*limit.fixed:e_fine:s:*").await;
    assert_eq!(read(dep, "HGET", &key, Some("n")).await, 50);
}

/// While Redis does not answer, the queue behind the busy slot is bounded (a call beyond it is
/// answered at once as without Redis), and a queued call whose caller gave up is dropped, not
/// sent when Redis answers again: after the stall only the call already sent is charged, and a
/// fresh decision is answered at once.
pub async fn abandoned_calls_are_never_charged_and_the_queue_is_bounded(dep: &Deployment) {
    // One call in flight, batches of 4: 4 × 1 × 16 = 64 calls may wait.
    let batching = Batching {
        max_calls: 4,
        in_flight: 1,
    };
    assert_eq!(batching.max_queued(), 64);
    let client = Client::with_batching(&dep.config(), batching).unwrap();
    let limiter = RateLimiter::new(
        client,
        vec![policy("q_abandon", Algorithm::Fixed, 1_000_000, HOUR)],
    )
    .unwrap();
    limiter.check(&["q_abandon"], "s", 1).await.unwrap();
    let stall = super::support::stall_all(dep, std::time::Duration::from_millis(1500)).await;
    let callers = (0..500).map(|_| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let give_up = std::time::Duration::from_millis(200);
            tokio::time::timeout(give_up, limiter.check(&["q_abandon"], "s", 1)).await
        })
    });
    let results: Vec<_> = join_all(callers)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let at_once = results
        .iter()
        .filter(|r| matches!(r, Ok(Ok(d)) if d.without_redis))
        .count();
    let gave_up = results.iter().filter(|r| r.is_err()).count();
    // One call sent alone (in flight), one taken by the driver to wait for the slot, at most 64
    // queued: every other answered at once.
    assert!(
        at_once >= 500 - 2 - 64,
        "{at_once} answered at once, {gave_up} gave up"
    );
    assert_eq!(
        at_once + gave_up,
        500,
        "every caller either waited or was answered"
    );
    stall.await.unwrap();
    let fresh = std::time::Instant::now();
    let d = limiter.peek(&["q_abandon"], "s", 1).await.unwrap();
    assert!(
        fresh.elapsed() < std::time::Duration::from_secs(1),
        "a fresh decision waited {:?} behind abandoned ones",
        fresh.elapsed()
    );
    let used = 1_000_000 - d.policies[0].remaining;
    // The first check, the call that was in flight when the callers gave up, and at most one
    // batch taken in the instant between its caller's timeout (freeing the slot) and theirs.
    assert!(
        used <= 2 + 4,
        "{used} charged: abandoned decisions were sent after the stall"
    );
}
