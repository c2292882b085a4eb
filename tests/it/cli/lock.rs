//! `tally lock`'s contract with scripts: a hold ends on SIGTERM or SIGINT with a release and
//! exit 0; a lock held elsewhere exits 75 (not acquired), a lease lost while held exits 69, so
//! `tally lock … && job` runs the job only when this process got the lock.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::lock_process::{locks, LockProcess};

use serde_json::json;
use tally_counters::lock::Lease;
use tally_testkit::local_redis::LocalRedis;

/// `tally lock`'s exit code when another holder has the lock (EX_TEMPFAIL).
const NOT_ACQUIRED: i32 = 75;
/// `tally lock`'s exit code when the lease was lost while held (EX_UNAVAILABLE).
const LOST: i32 = 69;

/// Hold a 5 s lease for up to 30 s, send `sig` once it is held: the hold ends within 1 s,
/// released (without the release the lease would stay for 5 s), with exit code 0.
async fn a_signal_ends_the_hold_with_a_release(sig: i32) {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut holder = LockProcess::start(&redis, &["--name", "x", "--ttl", "5s", "--hold", "30s"]);
    assert_eq!(holder.next()["acquired"], true);
    holder.signal(sig);
    let signalled = Instant::now();
    let status = holder.exit_within(Duration::from_secs(5));
    assert!(
        signalled.elapsed() < Duration::from_secs(1),
        "exited {:?} after the signal",
        signalled.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(holder.next(), json!({ "released": true }));
    let lease = locks(&redis)
        .try_acquire("x", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the lock key is gone: free at once");
    assert!(lease.fence >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_hold_with_a_release_and_exit_0() {
    a_signal_ends_the_hold_with_a_release(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_ends_a_hold_with_a_release_and_exit_0() {
    a_signal_ends_the_hold_with_a_release(libc::SIGINT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_elsewhere_exits_not_acquired() {
    let redis = LocalRedis::start(&[]).unwrap();
    let holder = LockProcess::start(&redis, &["--name", "x", "--ttl", "5s", "--hold", "30s"]);
    assert_eq!(holder.next()["acquired"], true);
    let mut second = LockProcess::start(&redis, &["--name", "x"]);
    assert_eq!(second.next()["acquired"], false);
    let status = second.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(NOT_ACQUIRED), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_while_held_exits_lost() {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut holder =
        LockProcess::start(&redis, &["--name", "x", "--ttl", "900ms", "--hold", "30s"]);
    let first = holder.next();
    assert_eq!(first["acquired"], true, "{first}");
    // Someone with the token deletes the lock key: the next renewal finds it gone.
    let locks = locks(&redis);
    let token = first["token"].as_str().unwrap();
    assert!(locks
        .release(&Lease::known(&locks, "x", token))
        .await
        .unwrap());
    assert_eq!(holder.next(), json!({ "lost": true }));
    let status = holder.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(LOST), "{status:?}");
}

#[test]
fn lock_help_shows_an_example_and_the_exit_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["lock", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Examples:\n  #"), "{help}");
    for code in [NOT_ACQUIRED, LOST] {
        assert!(help.contains(&format!("\n  {code}  ")), "{code} in: {help}");
    }
}
