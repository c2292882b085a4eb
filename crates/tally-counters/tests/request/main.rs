//! The request path against real redis-server processes (standalone and a 3-primary cluster):
//! concurrency, forced timeouts, script flushes and restarts, with every key's expiry checked.

mod batched;
mod durable;
mod exact;
mod limits;
mod spread;
mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use support::{assert_every_key_expires, clients, Deployment};
use tally_counters::request::{
    Claim, Counters, Hit, Once, Pool, Quota, QuotaReply, RequestError, Unique,
};
use tally_counters::window::WindowSpec;

/// 200 concurrent callers over four connections (as four processes would) try a quota of 100,
/// each as two users: exactly 100 are admitted, no user twice, and a release returns one unit.
async fn quota_admits_exactly_n(dep: &Deployment) {
    let clients = clients(dep, 4);
    let quotas: Vec<Quota> = clients
        .iter()
        .map(|c| Quota::new(c.clone(), "flash", 100, true, in_an_hour()))
        .collect();
    let tasks = (0..200).map(|i| {
        let q = quotas[i % quotas.len()].clone();
        async move {
            let mut mine = Vec::new();
            for user in [format!("u{i}"), format!("u{i}"), format!("v{i}")] {
                mine.push((user.clone(), q.take(Some(&user)).await.unwrap()));
            }
            mine
        }
    });
    let replies: Vec<_> = join_all(tasks).await.into_iter().flatten().collect();
    let admitted: Vec<&String> = replies
        .iter()
        .filter(|(_, r)| matches!(r, QuotaReply::Admitted { .. }))
        .map(|(u, _)| u)
        .collect();
    assert_eq!(admitted.len(), 100, "exactly N admitted");
    let distinct: HashSet<_> = admitted.iter().collect();
    assert_eq!(distinct.len(), 100, "no user admitted twice");
    let mut numbers: Vec<u64> = replies
        .iter()
        .filter_map(|(_, r)| match r {
            QuotaReply::Admitted { taken } => Some(*taken),
            _ => None,
        })
        .collect();
    numbers.sort();
    assert_eq!(
        numbers,
        (1..=100).collect::<Vec<_>>(),
        "each place given once"
    );
    assert_eq!(quotas[0].peek().await.unwrap(), 100);
    assert!(quotas[1].release(Some(admitted[0])).await.unwrap());
    assert!(
        !quotas[1].release(Some(admitted[0])).await.unwrap(),
        "released once"
    );
    assert!(matches!(
        quotas[2].take(Some("late")).await.unwrap(),
        QuotaReply::Admitted { taken: 100 }
    ));
    assert!(matches!(
        quotas[2].take(Some("later")).await.unwrap(),
        QuotaReply::SoldOut { taken: 100 }
    ));
}

/// Hits with idempotency keys whose first try times out (the server is paused past the client's
/// response timeout, then runs the hit): every retry finds the first try and nothing counts twice.
async fn hits_retried_after_timeouts_count_once(dep: &Deployment) {
    let spec = support::counter("plays", &["video"], Duration::from_secs(3600));
    let patient = Counters::new(clients(dep, 1)[0].clone(), vec![spec.clone()], dep.layout());
    let hasty = Counters::new(
        support::client_with_timeout(dep, Duration::from_millis(100)),
        vec![spec],
        dep.layout(),
    );
    // Load the script first, so that the paused first tries run when the pause ends.
    hasty.hit("plays", &["warm-up"], &Hit::one()).await.unwrap();
    let pause = support::stall_all(dep, Duration::from_millis(1200)).await;
    let first: Vec<_> = join_all((0..50).map(|i| {
        let hasty = hasty.clone();
        async move {
            let hit = Hit {
                delta: 2,
                idempotency_key: Some(format!("req-{i}")),
                ..Hit::one()
            };
            hasty.hit("plays", &["v1"], &hit).await
        }
    }))
    .await;
    pause.await.unwrap();
    assert!(
        first
            .iter()
            .all(|r| matches!(r, Err(e @ RequestError::OutcomeUnknown(_)) if !e.did_not_run())),
        "the first tries time out, outcome unknown: {:?}",
        first
            .iter()
            .find(|r| !matches!(r, Err(RequestError::OutcomeUnknown(_))))
    );
    let mut duplicates = 0;
    for i in 0..50 {
        let hit = Hit {
            delta: 2,
            idempotency_key: Some(format!("req-{i}")),
            ..Hit::one()
        };
        let reply = patient.hit("plays", &["v1"], &hit).await.unwrap();
        duplicates += usize::from(reply.duplicate);
    }
    assert_eq!(duplicates, 50, "every timed-out first try had landed");
    assert_eq!(patient.peek("plays", &["v1"], None).await.unwrap(), 100);
    let fresh = patient.hit("plays", &["v1"], &Hit::one()).await.unwrap();
    assert_eq!((fresh.value, fresh.duplicate), (101, false));
    assert!(fresh.expire_at_ms == fresh.window_end_ms);
    // An id is scoped to the counter key: reused for other dimension values it is refused, and
    // neither key changes (it was once answered "duplicate" with the other subject's value).
    let reused = Hit {
        delta: 2,
        idempotency_key: Some("req-0".into()),
        ..Hit::one()
    };
    let other = patient.hit("plays", &["v2"], &reused).await;
    match dep {
        Deployment::Standalone(_) => {
            assert!(matches!(other, Err(RequestError::Conflict(_))), "{other:?}");
            assert_eq!(patient.peek("plays", &["v2"], None).await.unwrap(), 0);
        }
        // In a cluster the id is checked in the counter key's slot: across slots, it is a new
        // id of the other key (counted, and answered with that key's own value).
        Deployment::Cluster(_) => match other {
            Err(RequestError::Conflict(_)) => {}
            Ok(r) => assert_eq!((r.value, r.duplicate), (2, false)),
            Err(e) => panic!("{e}"),
        },
    }
    assert_eq!(patient.peek("plays", &["v1"], None).await.unwrap(), 101);
}

/// Scripts vanish (SCRIPT FLUSH on every node) between calls: the next call reloads them.
async fn noscript_is_reloaded(dep: &Deployment) {
    let c = clients(dep, 1).remove(0);
    let q = Quota::new(c.clone(), "reload", 10, false, in_an_hour());
    for round in 0..3u64 {
        support::flush_scripts(dep).await;
        assert_eq!(
            q.take(None).await.unwrap(),
            QuotaReply::Admitted { taken: round + 1 }
        );
    }
}

/// Concurrent first calls of one subject: exactly one is first; once, pool and unique answer
/// exactly under concurrency.
async fn once_pool_unique_are_exact(dep: &Deployment) {
    let c = clients(dep, 2);
    let day = WindowSpec::new(Duration::from_secs(86_400), chrono_tz::UTC).unwrap();
    let once = Once::new(c[0].clone(), "coupon", day);
    let firsts = join_all((0..100).map(|_| once.first("alice", None))).await;
    assert_eq!(firsts.iter().filter(|r| *r.as_ref().unwrap()).count(), 1);
    assert!(once.peek("alice", None).await.unwrap());
    assert!(!once.peek("bob", None).await.unwrap());

    let pool = Pool::new(c[1].clone(), "codes", in_an_hour());
    let items: Vec<String> = (0..50).map(|i| format!("CODE-{i}")).collect();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    assert_eq!(pool.fill(&refs).await.unwrap(), 50);
    let claims = join_all((0..200).map(|i| {
        let pool = pool.clone();
        async move { (i, pool.claim(&format!("user{i}")).await.unwrap()) }
    }))
    .await;
    let given: Vec<(usize, String)> = claims
        .iter()
        .filter_map(|(i, c)| match c {
            Claim::Given { item } => Some((*i, item.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(given.len(), 50);
    assert_eq!(given.iter().map(|g| &g.1).collect::<HashSet<_>>().len(), 50);
    let (user, item) = &given[0];
    assert_eq!(
        pool.claim(&format!("user{user}")).await.unwrap(),
        Claim::AlreadyGiven { item: item.clone() }
    );
    assert_eq!(
        pool.fill(&[item.as_str()]).await.unwrap(),
        0,
        "given items stay out"
    );
    assert_eq!(pool.peek().await.unwrap(), 0);

    let unique = Unique::new(c[0].clone(), "ips", Duration::from_secs(60));
    let adds = join_all(
        (0..300).map(|i| unique.add("acct", Box::leak(format!("ip{}", i % 120).into_boxed_str()))),
    )
    .await;
    assert!(adds.iter().all(|r| r.as_ref().unwrap() <= &120));
    assert_eq!(unique.peek("acct").await.unwrap(), 120);
    // Bounded: at most `max_items` per subject (the least recently seen go), items of at most
    // MAX_ITEM_BYTES.
    let capped = Unique::new(c[0].clone(), "capped", Duration::from_secs(60)).with_max_items(5);
    for i in 0..20 {
        let n = capped.add("acct", &format!("ip{i}")).await.unwrap();
        assert_eq!(n, (i + 1).min(5));
    }
    assert_eq!(capped.peek("acct").await.unwrap(), 5);
    let long = "x".repeat(tally_counters::request::MAX_ITEM_BYTES + 1);
    assert!(matches!(
        capped.add("acct", &long).await,
        Err(RequestError::InvalidField { field: "item", .. })
    ));
}

fn in_an_hour() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_millis() as i64 + 3_600_000
}

async fn run_all(dep: Arc<Deployment>) {
    quota_admits_exactly_n(&dep).await;
    hits_retried_after_timeouts_count_once(&dep).await;
    noscript_is_reloaded(&dep).await;
    once_pool_unique_are_exact(&dep).await;
    limits::fixed_and_sliding_log_admit_exactly_the_limit(&dep).await;
    limits::approximate_limiters_stay_within_their_bounds(&dep).await;
    limits::several_policies_decide_together(&dep).await;
    limits::a_peek_reports_what_is_left_now(&dep).await;
    limits::changing_the_algorithm_does_not_fail_open(&dep).await;
    limits::sliding_log_cost_is_capped(&dep).await;
    batched::mixed_batches_answer_each_caller_exactly(&dep).await;
    batched::an_error_in_a_batch_touches_only_its_caller(&dep).await;
    batched::abandoned_calls_are_never_charged_and_the_queue_is_bounded(&dep).await;
    exact::hits_are_exact_across_the_64_bit_range(&dep).await;
    exact::quota_counts_are_exact(&dep).await;
    spread::boundary_keys_expire_spread(&dep).await;
    assert_every_key_expires(&dep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone() {
    run_all(Arc::new(Deployment::standalone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    run_all(Arc::new(Deployment::cluster())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_run_and_unreachable_redis() {
    limits::restart_and_failure_modes().await;
}
