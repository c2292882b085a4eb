//! `jobs.publish.create_topics`: the output topic and the late topic do not exist, and the
//! publisher creates them with the configured partitions before it publishes. On tansu (librdkafka's mock broker has
//! no CreateTopics), which creates no topic by itself: without the setting the topic never
//! appears and no window result is ever stored.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::tansu::Tansu;
use tally_testkit::wait::wait_until;

use crate::common::process::TallyProcess;
use crate::stream::window::results::{config, events, produce, MIN, PARTITIONS};
use crate::stream::window::retry::read;

/// The partitions of `topic`, or None while the broker does not know it.
fn partitions(bootstrap: &str, topic: &str) -> Option<usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap();
    let meta = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let t = meta.topics().iter().find(|t| t.name() == topic)?;
    (t.error().is_none() && !t.partitions().is_empty()).then(|| t.partitions().len())
}

const LATE: &str = "topics-late";

#[test]
fn a_missing_output_topic_is_created_with_the_configured_partitions() {
    let (topic, out) = ("topics-in", "topics-out");
    let broker = Tansu::start().unwrap();
    broker.create_topic(topic, PARTITIONS).unwrap();
    let bootstrap = broker.bootstrap();
    for missing in [out, LATE] {
        assert_eq!(
            partitions(&bootstrap, missing),
            None,
            "{missing} is missing"
        );
    }
    let redis = LocalRedis::start(&[]).unwrap();
    // The late topic of `late = "drop"` is created too.
    let cfg = config(&bootstrap, &redis.url(), topic, out, "final")
        .replace(
            "[jobs.publish]\n",
            "[jobs.publish]\ncreate_topics = true\ntopic_partitions = 3\ntopic_replication = 1\n\
             topic_config = { \"cleanup.policy\" = \"compact\" }\n",
        )
        .replace(
            r#"idle_timeout = "2s" }"#,
            &format!(r#"idle_timeout = "2s", late = "drop", late_topic = "{LATE}" }}"#),
        );
    assert!(cfg.contains(LATE), "{cfg}");
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 60 * MIN;
    // Minutes 0..3: minutes 0 and 1 close.
    produce(&bootstrap, topic, &events(base, 0..3, 600, 3));
    let mut tally = TallyProcess::start(&cfg, "win-topics");

    let created = wait_until(Duration::from_secs(60), || {
        partitions(&bootstrap, out).is_some()
    });
    assert!(
        created,
        "the output topic was never created\n{}",
        tally.log()
    );
    assert_eq!(partitions(&bootstrap, out), Some(3));
    assert_eq!(partitions(&bootstrap, LATE), Some(3), "the late topic");
    // Window results land on every partition created (dozens of keys over 3).
    let mut used = BTreeSet::new();
    let published = wait_until(Duration::from_secs(60), || {
        used = read(&bootstrap, out, &[0, 1, 2])
            .iter()
            .map(|(p, _, _)| *p)
            .collect();
        used.len() == 3
    });
    assert!(published, "records on partitions {used:?}\n{}", tally.log());
    // Up (partitions owned, handlers installed) before SIGTERM, which then means "drain".
    assert!(tally.wait_metric("tally_assigned_partitions", 1.0, Duration::from_secs(60)));
    let status = tally.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", tally.log());
}
