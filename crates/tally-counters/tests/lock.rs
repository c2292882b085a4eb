//! Locks against real redis-server processes (standalone and a 3-primary cluster): contenders
//! never overlap and fencing tokens strictly increase; a frozen holder loses its lease and its
//! stale release deletes nothing; the watchdog keeps a long job's lock; scripts flushed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tally_counters::config::{RedisConfig, RedisMode};
use tally_counters::lock::Locks;
use tally_counters::request::Client;
use tally_testkit::local_redis::{LocalCluster, LocalRedis};

/// A resource that records who wrote with which fencing token and refuses overlap.
#[derive(Default)]
struct Resource {
    busy: AtomicBool,
    fences: Mutex<Vec<u64>>,
}

impl Resource {
    fn write(&self, fence: u64) {
        assert!(
            !self.busy.swap(true, Ordering::SeqCst),
            "two holders inside the lock at once"
        );
        let mut fences = self.fences.lock().unwrap();
        if let Some(&last) = fences.last() {
            assert!(fence > last, "fencing token {fence} after {last}");
        }
        fences.push(fence);
    }

    fn done(&self) {
        self.busy.store(false, Ordering::SeqCst);
    }
}

fn locks(config: &RedisConfig, n: usize) -> Vec<Locks> {
    (0..n)
        .map(|_| Locks::new(Client::new(config).unwrap()))
        .collect()
}

async fn contenders_never_overlap(config: &RedisConfig) {
    let all = locks(config, 4);
    let resource = Arc::new(Resource::default());
    let tasks = (0..50).map(|i| {
        let (locks, resource) = (all[i % 4].clone(), resource.clone());
        async move {
            for _ in 0..4 {
                let lease = locks
                    .acquire("job", Duration::from_secs(5), Duration::from_secs(60))
                    .await
                    .unwrap()
                    .expect("acquired within the wait");
                resource.write(lease.fence);
                tokio::task::yield_now().await;
                resource.done();
                assert!(
                    locks.release(&lease).await.unwrap(),
                    "released by its holder"
                );
            }
        }
    });
    join_all(tasks).await;
    assert_eq!(resource.fences.lock().unwrap().len(), 200);
}

async fn stale_holder_cannot_touch_the_next_lease(config: &RedisConfig) {
    let l = locks(config, 2);
    let ttl = Duration::from_millis(300);
    let stale = l[0].try_acquire("pause", ttl).await.unwrap().unwrap();
    assert!(
        l[1].try_acquire("pause", ttl).await.unwrap().is_err(),
        "held"
    );
    // The holder is "paused" past its ttl (no watchdog): the lease runs out.
    let taken = loop {
        if let Ok(lease) = l[1].try_acquire("pause", ttl).await.unwrap() {
            break lease;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(taken.fence > stale.fence);
    assert!(
        !l[0].extend(&stale, ttl).await.unwrap(),
        "a stale extend changes nothing"
    );
    assert!(
        !l[0].release(&stale).await.unwrap(),
        "a stale release deletes nothing"
    );
    assert!(
        l[0].try_acquire("pause", ttl).await.unwrap().is_err(),
        "still held"
    );
    assert!(l[1].release(&taken).await.unwrap());
}

async fn watchdog_keeps_a_long_job(config: &RedisConfig) {
    let l = locks(config, 2);
    let ttl = Duration::from_millis(300);
    let lease = l[0].try_acquire("long", ttl).await.unwrap().unwrap();
    let guard = l[0].guard(lease, None);
    let end = Instant::now() + ttl * 4;
    while Instant::now() < end {
        assert!(
            l[1].try_acquire("long", ttl).await.unwrap().is_err(),
            "kept"
        );
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(guard.release().await.unwrap());
    assert!(
        l[1].try_acquire("long", ttl).await.unwrap().is_ok(),
        "released"
    );
    // With a cap, the watchdog stops renewing and reports the loss once the lease ran out.
    let l2 = l[0].try_acquire("capped", ttl).await.unwrap().unwrap();
    let mut capped = l[0].guard(l2, Some(ttl));
    tokio::time::timeout(ttl * 10, capped.lost())
        .await
        .expect("the capped lease is reported lost");
    // "Lost" is said at the holder's conservative estimate of the expiry (renewal sent + ttl);
    // Redis lets the key go a moment later.
    assert!(l[1].acquire("capped", ttl, ttl).await.unwrap().is_ok());
}

async fn scripts_flushed(config: &RedisConfig, urls: &[String]) {
    let l = locks(config, 1).remove(0);
    for url in urls {
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut c).unwrap();
    }
    let lease = l
        .try_acquire("reload", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert!(l.release(&lease).await.unwrap());
}

/// Fencing tokens above 2^53 come back exactly (a Lua number, a double, would round them): the
/// fencing counter is set to 2^53, then to i64::MAX - 1, directly on its node.
async fn fencing_tokens_are_exact_near_the_64_bit_limits(config: &RedisConfig, urls: &[String]) {
    let l = locks(config, 1).remove(0);
    let ttl = Duration::from_secs(5);
    let lease = l.try_acquire("exact", ttl).await.unwrap().unwrap();
    assert!(l.release(&lease).await.unwrap());
    for start in [1i64 << 53, i64::MAX - 1] {
        let mut set = 0;
        for url in urls {
            let mut c = redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*lock:exact:fence:*")
                .query(&mut c)
                .unwrap();
            for key in keys {
                let _: () = redis::cmd("SET").arg(key).arg(start).query(&mut c).unwrap();
                set += 1;
            }
        }
        assert_eq!(set, 1, "one fencing counter");
        let lease = l.try_acquire("exact", ttl).await.unwrap().unwrap();
        assert_eq!(lease.fence, start as u64 + 1);
        assert!(l.release(&lease).await.unwrap());
    }
}

/// Redis restarted (no persistence) under a held guard: the lease is gone, the guard says so, and
/// the next acquire works on the new server (connection re-made, scripts reloaded after NOSCRIPT).
/// The fencing counter was lost with the data, yet the next token is larger than the lost ones.
async fn restart_loses_the_lease(redis: &mut LocalRedis, config: &RedisConfig) {
    let l = locks(config, 1).remove(0);
    let ttl = Duration::from_millis(600);
    let lease = l.try_acquire("restart", ttl).await.unwrap().unwrap();
    let before = lease.clone();
    let mut guard = l.guard(lease, None);
    redis.stop();
    redis.restart().unwrap();
    tokio::time::timeout(ttl * 10, guard.lost())
        .await
        .expect("the guard reports the lease lost");
    let deadline = Instant::now() + Duration::from_secs(10);
    let lease = loop {
        match l.try_acquire("restart", ttl).await {
            Ok(Ok(lease)) => break lease,
            Ok(Err(busy)) => panic!("the restarted server holds no lock: {busy:?}"),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("no acquire after the restart: {e}"),
        }
    };
    // The fencing counter went with the data, and still the next token is larger than the last
    // one the lost server handed out: it follows Redis's clock (microseconds).
    assert!(
        lease.fence > before.fence,
        "fence {} after a restart, {} before",
        lease.fence,
        before.fence
    );
    assert!(
        l.extend(&lease, ttl).await.unwrap(),
        "extend after the restart"
    );
    assert!(l.release(&lease).await.unwrap());
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// A stalled server (SIGSTOP: the connection stays open, nothing answers) under a held guard: the
/// lease is reported lost when it runs out, not after the client's 5 s response timeout.
async fn stalled_server_loses_the_lease(redis: &LocalRedis, config: &RedisConfig) {
    let l = locks(config, 1).remove(0);
    let ttl = Duration::from_millis(600);
    let lease = l.try_acquire("stall", ttl).await.unwrap().unwrap();
    let mut guard = l.guard(lease, None);
    let pid = redis.pid().unwrap();
    signal(pid, "-STOP");
    let stalled = Instant::now();
    let reported = tokio::time::timeout(ttl * 3, guard.lost()).await;
    let after = stalled.elapsed();
    signal(pid, "-CONT");
    assert!(reported.is_ok(), "no loss reported {after:?} into a stall");
    // At the lease's end (at most one ttl after the stall began, plus scheduling), and well
    // before the 5 s response timeout that bounded it before.
    assert!(
        after < ttl + Duration::from_secs(1),
        "loss reported at the lease's end, not at the response timeout: {after:?}"
    );
}

#[test]
fn zero_ttl_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let redis = LocalRedis::start(&[]).unwrap();
        let config = RedisConfig {
            url: redis.url(),
            ..RedisConfig::default()
        };
        let l = locks(&config, 1).remove(0);
        assert!(l.try_acquire("zero", Duration::ZERO).await.is_err());
        let lease = l
            .try_acquire("zero", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        // PEXPIRE 0 would delete the lock: an extend to 0 is refused and the lease stays.
        assert!(l.extend(&lease, Duration::ZERO).await.is_err());
        assert!(l
            .try_acquire("zero", Duration::from_secs(5))
            .await
            .unwrap()
            .is_err());
        assert!(l.release(&lease).await.unwrap());
    });
}

/// Lock names come from callers: a long one is refused, and a fencing counter expires (30 days
/// after its last lease, moved by acquire and extend) instead of staying forever per name.
#[test]
fn names_are_capped_and_fencing_counters_expire() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let redis = LocalRedis::start(&[]).unwrap();
        let config = RedisConfig {
            url: redis.url(),
            ..RedisConfig::default()
        };
        let l = locks(&config, 1).remove(0);
        let long = "n".repeat(tally_counters::lock::MAX_NAME_BYTES + 1);
        let refused = l.try_acquire(&long, Duration::from_secs(5)).await;
        assert!(
            matches!(
                refused,
                Err(tally_counters::request::RequestError::InvalidField { field: "name", .. })
            ),
            "{refused:?}"
        );
        let ttl = Duration::from_secs(5);
        let lease = l.try_acquire("once-used", ttl).await.unwrap().unwrap();
        let mut c = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let fence_pttl = |c: &mut redis::Connection| -> i64 {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*lock:once-used:fence:*")
                .query(c)
                .unwrap();
            assert_eq!(keys.len(), 1, "{keys:?}");
            redis::cmd("PTTL").arg(&keys[0]).query(c).unwrap()
        };
        let idle = tally_counters::lock::FENCE_IDLE.as_millis() as i64;
        let pttl = fence_pttl(&mut c);
        assert!(pttl > idle - 60_000 && pttl <= idle + 5_000, "{pttl}");
        // An extend to a day moves the counter's expiry past the new lease's end.
        assert!(l.extend(&lease, Duration::from_secs(86_400)).await.unwrap());
        let pttl = fence_pttl(&mut c);
        assert!(pttl > idle + 86_000_000, "{pttl}");
        assert!(l.release(&lease).await.unwrap());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let config = RedisConfig {
        url: redis.url(),
        ..RedisConfig::default()
    };
    contenders_never_overlap(&config).await;
    stale_holder_cannot_touch_the_next_lease(&config).await;
    watchdog_keeps_a_long_job(&config).await;
    scripts_flushed(&config, &[redis.url()]).await;
    fencing_tokens_are_exact_near_the_64_bit_limits(&config, &[redis.url()]).await;
    stalled_server_loses_the_lease(&redis, &config).await;
    restart_loses_the_lease(&mut redis, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    let cluster = LocalCluster::start(3, 0).unwrap();
    let config = RedisConfig {
        mode: RedisMode::Cluster,
        nodes: cluster.urls(),
        ..RedisConfig::default()
    };
    contenders_never_overlap(&config).await;
    stale_holder_cannot_touch_the_next_lease(&config).await;
    watchdog_keeps_a_long_job(&config).await;
    scripts_flushed(&config, &cluster.urls()).await;
    fencing_tokens_are_exact_near_the_64_bit_limits(&config, &cluster.urls()).await;
}

/// The whole process paused past the ttl (here: the runtime's only thread blocked, as in a long
/// GC or SIGSTOP): on resume the holder is told at once, before the watchdog has run again.
#[test]
fn paused_holder_is_told_on_resume() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let redis = LocalRedis::start(&[]).unwrap();
        let config = RedisConfig {
            url: redis.url(),
            ..RedisConfig::default()
        };
        let l = locks(&config, 1).remove(0);
        let ttl = Duration::from_millis(300);
        let lease = l.try_acquire("paused", ttl).await.unwrap().unwrap();
        let guard = l.guard(lease, None);
        assert!(!guard.is_lost());
        std::thread::sleep(ttl * 2);
        assert!(guard.is_lost(), "told on resume, before any renewal ran");
        assert!(!guard.release().await.unwrap(), "the lease had run out");
    });
}
