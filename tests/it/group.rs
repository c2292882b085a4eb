//! Two replicas in one consumer group split the partitions and together count everything once.

use std::time::Duration;

use crate::common::{counter, wait_for, Harness};
use chrono::Utc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_split_partitions_and_count_everything() {
    let mut h = Harness::new("group", 6);
    let counters = vec![counter(
        "flow",
        &["app_id"],
        "grp:{app_id}:{yyyyMMddHH}",
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(86_400),
    )];
    let config = h.config("g-group", counters);
    let a = h.start(config.clone());
    let b = h.start(config);
    let (ma, mb) = (a.metrics.clone(), b.metrics.clone());
    wait_for(
        "both replicas own partitions",
        Duration::from_secs(60),
        || {
            ma.consumer.assigned_partitions.get() > 0
                && mb.consumer.assigned_partitions.get() > 0
                && ma.consumer.assigned_partitions.get() + mb.consumer.assigned_partitions.get()
                    == 6
        },
    )
    .await;

    let now = Utc::now().timestamp_millis();
    for i in 0..6_000 {
        h.produce(
            i % 6,
            format!(r#"{{"app_id":"a{}"}}"#, i % 10).as_bytes(),
            Some(now),
        );
    }
    h.flush_producer();
    h.wait_applied("g-group", Duration::from_secs(60)).await;
    let (ca, cb) = (
        ma.consumer.messages_consumed.get(),
        mb.consumer.messages_consumed.get(),
    );
    a.stop().await;
    b.stop().await;
    assert!(ca > 0 && cb > 0, "both consumed: {ca} + {cb}");
    let keys = h.dump("grp:*");
    assert_eq!(keys.len(), 10);
    assert!(keys.values().all(|&v| v == 600), "{keys:?}");
}

/// `tally_rebalanced_partitions_total{kind}` of one process.
fn moved(m: &tally::ops::metrics::Metrics, kind: &str) -> u64 {
    m.consumer
        .rebalanced_partitions
        .with_label_values(&[kind])
        .get()
}

fn flow(prefix: &str) -> Vec<tally::config::CounterConfig> {
    vec![counter(
        "flow",
        &["app_id"],
        &format!("{prefix}:{{app_id}}:{{yyyyMMddHH}}"),
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(86_400),
    )]
}

/// The lanes of one process join the group together: the first generation gives every lane its
/// share, and no lane gives up a partition it had opened (before, each lane joined when it was
/// built, and one joining after the first generation revoked the partitions of the others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lanes_of_a_process_join_in_one_generation() {
    let mut h = Harness::new("lanes-start", 8);
    let mut config = h.config("g-lanes-start", flow("lst"));
    config.kafka.consumers = tally::config::Consumers::Count(4);
    let a = h.start(config);
    let m = a.metrics.clone();
    wait_for("every partition assigned", Duration::from_secs(60), || {
        m.consumer.assigned_partitions.get() == 8
    })
    .await;
    let now = Utc::now().timestamp_millis();
    for i in 0..4_000 {
        h.produce(
            i % 8,
            format!(r#"{{"app_id":"a{}"}}"#, i % 10).as_bytes(),
            Some(now),
        );
    }
    h.flush_producer();
    h.wait_applied("g-lanes-start", Duration::from_secs(60))
        .await;
    let (assigned, revoked) = (moved(&m, "assign"), moved(&m, "revoke"));
    a.stop().await;
    assert_eq!(revoked, 0, "a lane gave up partitions at start");
    assert_eq!(assigned, 8, "each partition assigned once");
    let keys = h.dump("lst:*");
    assert_eq!(keys.len(), 10);
    assert!(keys.values().all(|&v| v == 400), "{keys:?}");
}

/// A replica joining a running one takes only its share: the running replica gives up the
/// partitions that move, keeps counting the others through the rebalance (incremental,
/// cooperative-sticky), and is never handed back what it kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_moves_only_its_share() {
    let mut h = Harness::new("lanes-join", 8);
    let mut config = h.config("g-lanes-join", flow("ljn"));
    config.kafka.consumers = tally::config::Consumers::Count(1);
    let a = h.start(config.clone());
    let ma = a.metrics.clone();
    wait_for(
        "the first replica owns every partition",
        Duration::from_secs(60),
        || ma.consumer.assigned_partitions.get() == 8,
    )
    .await;
    let now = Utc::now().timestamp_millis();
    for i in 0..2_000 {
        h.produce(
            i % 8,
            format!(r#"{{"app_id":"a{}"}}"#, i % 10).as_bytes(),
            Some(now),
        );
    }
    h.flush_producer();
    h.wait_applied("g-lanes-join", Duration::from_secs(60))
        .await;
    let b = h.start(config);
    let mb = b.metrics.clone();
    wait_for(
        "the replicas split the partitions",
        Duration::from_secs(60),
        || {
            ma.consumer.assigned_partitions.get() + mb.consumer.assigned_partitions.get() == 8
                && mb.consumer.assigned_partitions.get() > 0
        },
    )
    .await;
    let kept = ma.consumer.assigned_partitions.get() as u64;
    for i in 0..2_000 {
        h.produce(
            i % 8,
            format!(r#"{{"app_id":"a{}"}}"#, i % 10).as_bytes(),
            Some(now),
        );
    }
    h.flush_producer();
    h.wait_applied("g-lanes-join", Duration::from_secs(60))
        .await;
    let (assigned, revoked) = (moved(&ma, "assign"), moved(&ma, "revoke"));
    a.stop().await;
    b.stop().await;
    assert_eq!(
        revoked,
        8 - kept,
        "the first replica gave up only what moved"
    );
    assert_eq!(assigned, 8, "what it kept was never assigned again");
    let keys = h.dump("ljn:*");
    assert_eq!(keys.len(), 10);
    assert!(keys.values().all(|&v| v == 400), "{keys:?}");
}
