//! Window publishing that cannot happen is seen at once. `jobs.publish.create_topics` on a
//! broker without CreateTopics (librdkafka's mock cluster): the output topic can never be
//! created. The publisher says so at ERROR within seconds, with Kafka's reason, once and not at
//! every pass; and `tally_publish_behind_seconds` measures the windows that wait from the first
//! closable one on and grows with the watermark, so that the alert on it
//! (`TallyWindowPublishingBehind`, whose rule tests are in deploy/prometheus/alerts_test.yml)
//! fires. Creating topics where the broker can is tested on tansu (`window/topics.rs`).

use std::time::{Duration, Instant};

use tally_testkit::local_redis::LocalRedis;
use tally_testkit::wait::wait_until;

use crate::common::process::{BrokerProcess, TallyProcess};
use crate::stream::window::results::{config, events, produce, MIN, PARTITIONS};

const OUT: &str = "behind-out";

/// The ERROR lines of `log` about the output topic.
fn topic_errors(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("ERROR") && l.contains(&format!("cannot create topic {OUT}")))
        .count()
}

#[test]
fn an_output_topic_that_cannot_be_created_is_an_error_and_its_windows_fall_behind() {
    let topic = "behind-in";
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    let redis = LocalRedis::start(&[]).unwrap();
    let cfg = config(&broker.bootstrap, &redis.url(), topic, OUT, "final")
        .replace("[jobs.publish]\n", "[jobs.publish]\ncreate_topics = true\n");
    assert!(cfg.contains("create_topics"));
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 60 * MIN;
    // Minutes 0..3, the last event less than a second into minute 2: minutes 0 and 1 close once
    // the partitions are idle (2 s), and the oldest has waited 60 s of event time.
    produce(&broker.bootstrap, topic, &events(base, 0..3, 600, 3));
    let started = Instant::now();
    let tally = TallyProcess::start(&cfg, "win-behind");
    let behind = |at_least: f64| {
        wait_until(Duration::from_secs(30), || {
            tally
                .metric(r#"tally_publish_behind_seconds{counter="views"}"#)
                .is_some_and(|v| v >= at_least)
        })
    };
    assert!(
        behind(60.0),
        "minute 0 waits to be published 60 s of event time after its end; behind = {:?}\n{}",
        tally.metric(r#"tally_publish_behind_seconds{counter="views"}"#),
        tally.log()
    );
    let errored = wait_until(Duration::from_secs(30), || topic_errors(&tally.log()) >= 1);
    assert!(
        errored,
        "an ERROR names the topic and the reason\n{}",
        tally.log()
    );
    eprintln!(
        "behind: ERROR and behind >= 60 s within {:?} of the start",
        started.elapsed()
    );
    // One unanswered creation (10 s) after tally's start, not librdkafka's default timeouts of
    // a minute and more.
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "at once: {:?}",
        started.elapsed()
    );

    // Minute 5: the watermark moves on, nothing is published, the oldest window waits longer.
    produce(&broker.bootstrap, topic, &events(base, 5..6, 60, 11));
    assert!(
        behind(240.0),
        "behind grows with the watermark: {:?}\n{}",
        tally.metric(r#"tally_publish_behind_seconds{counter="views"}"#),
        tally.log()
    );
    // A pass every 100 ms meets the error each time; the log says it once per 10 s.
    let log = tally.log();
    let lines = topic_errors(&log);
    let allowed = 1 + started.elapsed().as_secs() as usize / 10;
    assert!(
        lines <= allowed,
        "{lines} ERROR lines in {:?}, at most {allowed}\n{log}",
        started.elapsed()
    );
    assert_eq!(
        tally.metric(r#"tally_publish_windows_total{counter="views"}"#),
        Some(0.0),
        "nothing was published"
    );
}
