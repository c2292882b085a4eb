//! The reconciler recounts a closed window from Kafka, finds Redis equal to it, and reports a
//! wrong count injected into Redis (naming nothing it cannot prove, fixing nothing).

use std::time::Duration;

use crate::common::{hourly, wait_for, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_wrong_count_is_reported_and_left_alone() {
    let mut h = Harness::new("recon", 2);
    let now = chrono::Utc::now().timestamp_millis();
    let last_hour = (now / 3_600_000 - 1) * 3_600_000 + 1_000;
    for i in 0..600u32 {
        let payload = format!(r#"{{"app_id":"a{}","device_id":"d{}"}}"#, i % 3, i % 7);
        h.produce(
            (i % 2) as i32,
            payload.as_bytes(),
            Some(last_hour + i64::from(i)),
        );
    }
    h.flush_producer();
    let mut config = h.config("g-recon", hourly("rc"));
    // Count everything first: a pass whose snapshot of the applied offsets is taken while the
    // stream still applies would find Redis ahead of its recount (with a grace of zero).
    let counting = h.start(config.clone());
    h.wait_applied("g-recon", Duration::from_secs(60)).await;
    counting.stop().await;
    config.jobs.reconcile.enabled = true;
    config.jobs.reconcile.interval = Duration::from_millis(200);
    config.jobs.reconcile.grace = Duration::ZERO;
    config.jobs.reconcile.lease = Duration::from_secs(2);
    let running = h.start(config);
    let m = running.metrics.clone();
    let checked = || m.jobs.reconciled.with_label_values(&["flow"]).get();
    let mismatches = || m.jobs.mismatches.with_label_values(&["flow"]).get();
    let before = checked();
    wait_for(
        "a pass over the applied events",
        Duration::from_secs(30),
        || checked() >= before + 21,
    )
    .await;
    assert_eq!(mismatches(), 0, "redis equals the recount");

    let keys = h.dump("rc:*");
    assert_eq!(keys.values().sum::<i64>(), 600);
    let (key, value) = keys.iter().next().unwrap();
    let mut conn = h.conn();
    let _: i64 = redis::cmd("INCRBY")
        .arg(key)
        .arg(5)
        .query(&mut conn)
        .unwrap();
    wait_for("the wrong count reported", Duration::from_secs(30), || {
        mismatches() >= 1
    })
    .await;
    let now_value: i64 = redis::cmd("GET").arg(key).query(&mut conn).unwrap();
    assert_eq!(now_value, value + 5, "reported, not fixed");
    running.stop().await;
}
