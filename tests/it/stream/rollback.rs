//! The stream path through a failover with replication lag: Redis acknowledges flushes that
//! never reach the replica, the primary dies, the replica is promoted at its address, and the
//! counts, the applied offsets and the state marker go back together. No event is produced
//! after the failover, so no flush would ever find the hole (a fence conflict): the fence check
//! must (after the sink's reconnection, or within `recovery.fence_check_interval`). The sink
//! applies the lost flushes again from memory (`recovery.reapply_keys`); without them kept, the
//! partitions are replayed from Kafka. Either way without a restart, and every key is compared
//! with the truth.

use std::time::{Duration, Instant};

use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::replica::{cut_replica, fail_over_with_lag, port_of, wait_synced};
use crate::common::{accuracy, hourly, produce_batch, total, Harness, Running};

/// Well past a check interval (10 s), the measured bound asserted below.
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_lag_is_applied_again_from_memory_without_new_events() {
    failover_with_lag_and_no_event_after(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_lag_is_replayed_without_new_events_or_a_restart() {
    failover_with_lag_and_no_event_after(false).await;
}

/// The scenario, with the lost flushes kept in memory (`reapply`) or replayed from Kafka.
async fn failover_with_lag_and_no_event_after(reapply: bool) {
    let name = if reapply { "reapply" } else { "rollback" };
    let mut h = Harness::new(name, 2);
    let g = &format!("g-{name}");
    let p = port_of(&h.redis);
    let replica = LocalRedis::start_on(
        free_port().unwrap(),
        &["--replicaof", "127.0.0.1", &p.to_string()],
    )
    .unwrap();
    let r = port_of(&replica);
    // The default interval: the reconnection is what must trigger the check.
    let mut config = h.config(g, hourly("rb"));
    assert_eq!(
        config.recovery.fence_check_interval,
        Duration::from_secs(10)
    );
    assert!(config.recovery.reapply_keys > 0, "kept by default");
    if !reapply {
        config.recovery.reapply_keys = 0;
    }
    let running = h.start(config);

    produce_batch(&mut h, 0, 200);
    h.wait_applied(g, WAIT).await;
    tokio::task::spawn_blocking(move || wait_synced(p, r))
        .await
        .unwrap();
    assert_eq!(total(&h, "rb:*"), 200);

    // The replica is cut off; 300 more events land on the primary alone.
    cut_replica(p, &replica);
    produce_batch(&mut h, 200, 300);
    h.wait_applied(g, WAIT).await;
    let truth = h.dump("rb:*");
    assert_eq!(truth.values().sum::<i64>(), 500);
    let applied_before: Vec<_> = (0..2).map(|part| h.applied(g, part)).collect();

    let mut primary = std::mem::replace(&mut h.redis, LocalRedis::start(&[]).unwrap());
    let (new, replica) =
        tokio::task::spawn_blocking(move || (fail_over_with_lag(&mut primary, &replica), replica))
            .await
            .unwrap();
    h.redis = new;
    let promoted = Instant::now();
    let counted_after_promotion = total(&h, "rb:*");
    let rolled_back: Vec<_> = (0..2).map(|part| h.applied(g, part)).collect();
    println!(
        "after the promotion: {counted_after_promotion} of 500 counted, applied {rolled_back:?} (before: {applied_before:?})"
    );

    // No event is produced from now on.
    exact_again(&h, g, &applied_before, promoted + WAIT).await;
    let took = promoted.elapsed();
    println!("exact again {took:?} after the promotion");
    assert!(
        counted_after_promotion < 500,
        "the failover did not lose the unreplicated flushes ({counted_after_promotion}): the scenario did not happen"
    );
    recovered_as_configured(&running, reapply);
    // Within the sink's reconnection (a second), not the check interval.
    assert!(
        took < Duration::from_secs(5),
        "exact only {took:?} after the promotion"
    );
    // Nothing doubles later (a second check finds the fences as they landed).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        h.dump("rb:*"),
        truth,
        "every key as acknowledged before the failover"
    );
    accuracy(
        "stream counts (no event after the failover)",
        "primary failover with replication lag",
        if reapply {
            "none (applied again from memory)"
        } else {
            "none (replayed from Kafka)"
        },
        format!("{} keys exact {took:.1?} after the promotion", truth.len()),
        "every key",
        0,
        0,
    );
    drop(replica);
    running.stop().await;
}

/// Until every key is counted again (500) and the applied offsets are those before the
/// failover, by `deadline`.
async fn exact_again(h: &Harness, g: &str, applied_before: &[Option<i64>], deadline: Instant) {
    loop {
        let applied: Vec<_> = (0..2).map(|part| h.applied(g, part)).collect();
        if total(h, "rb:*") == 500 && applied == applied_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rolled-back partitions were never replayed: {} of 500 counted, applied {applied:?}, expected {applied_before:?}",
            total(h, "rb:*")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The lost flushes went in again from memory (`reapply`: nothing left to replay), or the
/// fence check found the rollback and replayed it (nothing kept).
fn recovered_as_configured(running: &Running, reapply: bool) {
    let rollbacks: u64 = ["behind", "ahead", "lost"]
        .iter()
        .map(|found| {
            running
                .metrics
                .recovery
                .state_rollbacks
                .with_label_values(&[found])
                .get()
        })
        .sum();
    let reapplied = running.metrics.recovery.reapplied_ranges.get();
    if reapply {
        // Both partitions' lost flushes went in again from memory: nothing to replay.
        assert!(
            reapplied >= 2,
            "the lost ranges are applied again ({reapplied})"
        );
        assert_eq!(rollbacks, 0, "nothing left for the fence check to replay");
    } else {
        assert!(rollbacks >= 1, "the rollback is counted");
        assert_eq!(reapplied, 0, "nothing kept");
    }
}
