//! Rate limiters under 200 concurrent callers: every admitted decision carries Redis server
//! time, and the admitted set is checked against each algorithm's promise.

use std::time::{Duration, Instant};

use futures::future::join_all;
use tally_counters::config::RedisConfig;
use tally_counters::request::{Algorithm, Client, Decision, FailureMode, LimitPolicy, RateLimiter};
use tally_testkit::local_redis::LocalRedis;

use super::support::{clients, Deployment};

pub fn policy(name: &str, algorithm: Algorithm, limit: u64, window_ms: u64) -> LimitPolicy {
    LimitPolicy {
        name: name.into(),
        algorithm,
        limit,
        window: Duration::from_millis(window_ms),
        burst: None,
        shadow: false,
        on_redis_error: FailureMode::Open,
        durability: None,
    }
}

/// 200 callers over four connections ask `policy` for `subject` until `run` has passed; the
/// server times of the admitted requests, sorted.
async fn hammer(dep: &Deployment, policy: &LimitPolicy, subject: &str, run: Duration) -> Vec<i64> {
    let limiters: Vec<RateLimiter> = clients(dep, 4)
        .into_iter()
        .map(|c| RateLimiter::new(c, vec![policy.clone()]).unwrap())
        .collect();
    let end = Instant::now() + run;
    let tasks = (0..200).map(|i| {
        let limiter = limiters[i % limiters.len()].clone();
        let (name, subject) = (policy.name.clone(), subject.to_string());
        async move {
            let mut admitted = Vec::new();
            while Instant::now() < end {
                let d = limiter.check(&[&name], &subject, 1).await.unwrap();
                assert!(!d.without_redis);
                if d.admitted {
                    admitted.push(d.now_ms);
                } else {
                    let wait = d.retry_after_ms().expect("cost 1 can pass later");
                    assert!(wait > 0);
                }
            }
            admitted
        }
    });
    let mut times: Vec<i64> = join_all(tasks).await.into_iter().flatten().collect();
    times.sort_unstable();
    times
}

/// Most admitted requests in any half-open interval `(t - window, t]` ending at an admission.
fn max_in_sliding(times: &[i64], window: i64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[lo] <= times[hi] - window {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

fn per_fixed_window(times: &[i64], window: i64) -> std::collections::BTreeMap<i64, usize> {
    let mut m = std::collections::BTreeMap::new();
    for t in times {
        *m.entry(t.div_euclid(window)).or_default() += 1;
    }
    m
}

pub async fn fixed_and_sliding_log_admit_exactly_the_limit(dep: &Deployment) {
    let fixed = policy("fixed", Algorithm::Fixed, 40, 400);
    let times = hammer(dep, &fixed, "ip-1", Duration::from_millis(2100)).await;
    let counts = per_fixed_window(&times, 400);
    assert!(counts.len() >= 4, "{counts:?}");
    assert!(counts.values().all(|&n| n <= 40), "never more: {counts:?}");
    let inner: Vec<usize> = counts
        .values()
        .skip(1)
        .take(counts.len() - 2)
        .copied()
        .collect();
    assert!(
        inner.iter().all(|&n| n == 40),
        "saturated windows admit exactly L: {counts:?}"
    );

    let log = policy("log", Algorithm::SlidingLog, 40, 400);
    let times = hammer(dep, &log, "ip-1", Duration::from_millis(2100)).await;
    assert_eq!(
        max_in_sliding(&times, 400),
        40,
        "exactly L in the busiest sliding window"
    );
    assert!(
        times.len() >= 40 * 4,
        "the log admits again as entries leave: {}",
        times.len()
    );
}

pub async fn approximate_limiters_stay_within_their_bounds(dep: &Deployment) {
    let counter = policy("counter", Algorithm::SlidingCounter, 40, 400);
    let times = hammer(dep, &counter, "ip-2", Duration::from_millis(2100)).await;
    let counts = per_fixed_window(&times, 400);
    assert!(
        counts.values().all(|&n| n <= 40),
        "never more per aligned window: {counts:?}"
    );
    assert!(
        max_in_sliding(&times, 400) <= 80,
        "at most 2L in a sliding window"
    );
    assert!(times.len() >= 40 * 3, "admits steadily: {}", times.len());

    let mut gcra = policy("gcra", Algorithm::Gcra, 50, 500);
    gcra.burst = Some(10);
    let times = hammer(dep, &gcra, "ip-2", Duration::from_millis(2000)).await;
    // One unit per 10 ms after a burst of 10: over any span, at most burst + span / interval.
    for (i, t) in times.iter().enumerate() {
        for (j, u) in times.iter().enumerate().skip(i) {
            let allowed = 10 + ((u - t) / 10) as usize + 1;
            assert!(j - i < allowed, "{} admitted in {} ms", j - i + 1, u - t);
        }
    }
    assert!(times.len() >= 150, "admits at its rate: {}", times.len());
}

/// A peek changes nothing, so it reports what is left now: applying the same cost right after
/// leaves `cost` fewer (GCRA: at least; time passes between the calls and refills it).
pub async fn a_peek_reports_what_is_left_now(dep: &Deployment) {
    let client = clients(dep, 1).remove(0);
    for (i, algorithm) in [
        Algorithm::Fixed,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::Gcra,
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("peek{i}");
        let limiter =
            RateLimiter::new(client.clone(), vec![policy(&name, algorithm, 10, 60_000)]).unwrap();
        let subject = format!("peeker{i}");
        limiter.check(&[&name], &subject, 3).await.unwrap();
        let peeked = limiter.peek(&[&name], &subject, 2).await.unwrap();
        let applied = limiter.check(&[&name], &subject, 2).await.unwrap();
        assert!(peeked.admitted && applied.admitted, "{algorithm:?}");
        let (p, a) = (peeked.policies[0].remaining, applied.policies[0].remaining);
        if algorithm == Algorithm::Gcra {
            assert!(
                (a + 2..=a + 3).contains(&p),
                "{algorithm:?}: peek {p}, then apply {a}"
            );
        } else {
            assert_eq!(p, 7, "{algorithm:?}: 10 - 3 left before the apply");
            assert_eq!(a, 5, "{algorithm:?}");
        }
    }
}

pub async fn several_policies_decide_together(dep: &Deployment) {
    let client = clients(dep, 1).remove(0);
    let mut shadow = policy("shadow", Algorithm::Fixed, 1, 60_000);
    shadow.shadow = true;
    let limiter = RateLimiter::new(
        client,
        vec![
            policy("burst", Algorithm::Fixed, 5, 60_000),
            policy("daily", Algorithm::SlidingLog, 8, 60_000),
            shadow,
        ],
    )
    .unwrap();
    let both = ["burst", "daily", "shadow"];
    let mut admitted = 0;
    for _ in 0..10 {
        let d: Decision = limiter.check(&both, "user", 1).await.unwrap();
        admitted += usize::from(d.admitted);
        if admitted > 1 {
            assert!(
                !d.policies[2].allowed,
                "the shadow policy denies, unenforced"
            );
        }
    }
    assert_eq!(admitted, 5, "the tighter policy decides");
    // A denied call is not charged: the policy that would admit it reports what it has left as
    // it is (not as if the call had been charged).
    let denied = limiter.check(&["burst", "daily"], "user", 1).await.unwrap();
    assert!(!denied.admitted && denied.policies[1].allowed, "{denied:?}");
    assert_eq!(
        denied.policies[1].remaining, 3,
        "8 - 5 left, as it is: {denied:?}"
    );
    // Denied requests cost nothing: the daily log holds only the 5 admitted.
    let daily = limiter.peek(&["daily"], "user", 3).await.unwrap();
    assert!(daily.admitted, "3 more fit");
    assert_eq!(
        daily.policies[0].remaining, 3,
        "a peek reports what is left now"
    );
    let d = limiter.check(&["daily"], "user", 4).await.unwrap();
    assert!(!d.admitted, "5 + 4 > 8");
    assert!(d.retry_after_ms().unwrap() > 0);
    let huge = limiter.check(&["daily"], "user", 9).await.unwrap();
    assert_eq!(
        huge.retry_after_ms(),
        None,
        "a cost above the limit never passes"
    );
    let (policy_h, state_h) = d.headers();
    assert_eq!(policy_h, "\"daily\";q=8;w=60");
    assert!(state_h.starts_with("\"daily\";r=3;t="), "{state_h}");
    limiter.reset(&both, "user").await.unwrap();
    assert!(limiter.check(&both, "user", 1).await.unwrap().admitted);
}

/// Redis restarted mid-run (scripts and state gone): calls reconnect and reload; with Redis
/// unreachable each policy answers by its failure mode.
/// A policy whose algorithm changes (fixed window, a hash, to GCRA, a string) keeps deciding
/// with Redis: the old state was answered WRONGTYPE, taken for an unreachable Redis, and every
/// such subject failed open for up to a window.
pub async fn changing_the_algorithm_does_not_fail_open(dep: &Deployment) {
    let client = clients(dep, 1).remove(0);
    let fixed = policy("swapped", Algorithm::Fixed, 1, 60_000);
    let before = RateLimiter::new(client.clone(), vec![fixed]).unwrap();
    assert!(before.check(&["swapped"], "s", 1).await.unwrap().admitted);
    let gcra = policy("swapped", Algorithm::Gcra, 1, 60_000);
    let after = RateLimiter::new(client, vec![gcra]).unwrap();
    let first = after.check(&["swapped"], "s", 1).await.unwrap();
    assert!(!first.without_redis, "decided with Redis: {first:?}");
    let second = after.check(&["swapped"], "s", 1).await.unwrap();
    assert!(
        !second.without_redis && !second.admitted,
        "the new algorithm limits: {second:?}"
    );
}

/// One call to a sliding log writes one entry per unit: its cost is capped (a cost of 1M held
/// Redis for about a second).
pub async fn sliding_log_cost_is_capped(dep: &Deployment) {
    let client = clients(dep, 1).remove(0);
    let log = policy("big_log", Algorithm::SlidingLog, 1_000_000, 60_000);
    let limiter = RateLimiter::new(client, vec![log]).unwrap();
    let max = tally_counters::request::MAX_LOG_COST;
    let refused = limiter.check(&["big_log"], "s", max + 1).await;
    assert!(
        matches!(
            refused,
            Err(tally_counters::request::RequestError::Invalid(_))
        ),
        "{refused:?}"
    );
    let d = limiter.check(&["big_log"], "s", max).await.unwrap();
    assert!(
        d.admitted && d.policies[0].remaining == 1_000_000 - max,
        "{d:?}"
    );
}

pub async fn restart_and_failure_modes() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let mut config = RedisConfig {
        url: redis.url(),
        ..RedisConfig::default()
    };
    config.connect_timeout = Duration::from_millis(300);
    config.response_timeout = Duration::from_millis(300);
    let mut closed = policy("closed", Algorithm::Gcra, 100, 1000);
    closed.on_redis_error = FailureMode::Closed;
    let open = policy("open", Algorithm::Fixed, 100, 1000);
    let limiter = RateLimiter::new(Client::new(&config).unwrap(), vec![open, closed]).unwrap();
    assert!(
        limiter
            .check(&["open", "closed"], "s", 1)
            .await
            .unwrap()
            .admitted
    );

    redis.stop();
    let open_only = limiter.check(&["open"], "s", 1).await.unwrap();
    assert!(open_only.without_redis && open_only.admitted, "fail open");
    let both = limiter.check(&["open", "closed"], "s", 1).await.unwrap();
    assert!(both.without_redis && !both.admitted, "fail closed wins");

    redis.restart().unwrap();
    let mut answered = None;
    for _ in 0..50 {
        let d = limiter.check(&["open", "closed"], "s", 1).await.unwrap();
        if !d.without_redis {
            answered = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = answered.expect("reconnects after the restart");
    assert!(
        d.admitted && d.policies[0].remaining == 99,
        "state was lost with the restart"
    );
}
