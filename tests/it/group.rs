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
