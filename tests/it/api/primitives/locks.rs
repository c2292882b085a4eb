//! Locks held by real `tally lock` processes: one frozen with SIGSTOP past its ttl loses the
//! lock, is told so when it resumes, and its release deletes nothing; one killed with SIGKILL
//! leaves a lock that expires.

use std::time::Duration;

use tally_testkit::local_redis::LocalRedis;

use crate::common::lock_process::{locks, LockProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_the_lock_and_its_release_deletes_nothing() {
    let redis = LocalRedis::start(&[]).unwrap();
    let holder = LockProcess::start(
        &redis,
        &["--name", "batch", "--ttl", "600ms", "--hold", "30s"],
    );
    let first = holder.next();
    assert_eq!(first["acquired"], true, "{first}");
    let locks = locks(&redis);
    let ttl = Duration::from_millis(600);
    assert!(
        locks.try_acquire("batch", ttl).await.unwrap().is_err(),
        "held and renewed"
    );

    holder.signal(libc::SIGSTOP);
    // Frozen, its watchdog cannot renew: the lease runs out and another process takes it.
    let taken = locks
        .acquire("batch", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the frozen holder's lease expires");
    assert!(
        taken.fence > first["fence"].as_u64().unwrap(),
        "fencing tokens increase"
    );
    holder.signal(libc::SIGCONT);

    assert_eq!(
        holder.next(),
        serde_json::json!({ "lost": true }),
        "told on resume"
    );
    assert_eq!(holder.next(), serde_json::json!({ "released": false }));
    assert!(
        locks.try_acquire("batch", ttl).await.unwrap().is_err(),
        "the stale release did not delete the new holder's lock"
    );
    assert!(locks.release(&taken).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_lock_expires() {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut holder = LockProcess::start(
        &redis,
        &["--name", "cron", "--ttl", "800ms", "--hold", "60s"],
    );
    assert_eq!(holder.next()["acquired"], true);
    holder.kill9();
    let locks = locks(&redis);
    let started = std::time::Instant::now();
    let lease = locks
        .acquire("cron", Duration::from_secs(5), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("acquired once the dead holder's lease ran out");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(lease.fence >= 2);
}
