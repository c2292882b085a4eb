//! Topic patterns (`[[kafka.topics]]` with `pattern`): a topic that matches is read with the
//! pattern's decoding, one created while tally runs is picked up at the next listing, and a
//! topic that does not match — or matches but is tally's own dead-letter topic — is not read.
//! Every count is compared with what was produced; `tally state` lists the matched topics'
//! fences.

use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use crate::common::{hourly, wait_for, Harness};

const PATTERN: &str = "tpat-orders-.*";

/// `n` events of `app` to `topic`, spread over `partitions`, in the current hour.
fn produce(bootstrap: &str, topic: &str, partitions: i32, n: usize, app: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    for i in 0..n {
        let payload = format!(r#"{{"order":{{"app":"{app}"}},"device_id":"d{}"}}"#, i % 3);
        let rec = BaseRecord::<(), str>::to(topic)
            .partition(i as i32 % partitions)
            .payload(&payload)
            .timestamp(now);
        p.send(rec).map_err(|(e, _)| e).unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_reads_matching_topics_and_those_created_later() {
    let h = Harness::new("tpat-orders-eu", 2);
    let bootstrap = h.mock.bootstrap_servers();
    h.mock.create_topic("tpat-other", 2, 1).unwrap();
    h.mock.create_topic("tpat-orders-dlq", 1, 1).unwrap();
    produce(&bootstrap, "tpat-orders-eu", 2, 100, "eu");
    produce(&bootstrap, "tpat-other", 2, 40, "other");
    produce(&bootstrap, "tpat-orders-dlq", 1, 30, "dlq");

    let mut config = h.config("g-tpat", hourly("tpat"));
    let mut decode = tally::config::DecodeConfig::default();
    decode.fields.insert("app_id".into(), "order.app".into());
    // It matches the pattern, and is where this pattern's bad events go: never read.
    decode.dead_letter_topic = Some("tpat-orders-dlq".into());
    config.kafka.topics = vec![tally::config::TopicConfig {
        name: String::new(),
        pattern: Some(PATTERN.into()),
        decode: Some(decode),
    }];
    config.kafka.topic = tally::config::KafkaConfig::default().topic;
    config.kafka.consumers = tally::config::Consumers::Count(1);
    config.kafka.topics_refresh = Duration::from_millis(200);
    config.validate().expect("valid");

    let running = h.start(config.clone());
    let m = running.metrics.clone();
    let mut conn = h.conn();
    let mut applied = |topic: &str, p: i32| -> Option<i64> {
        redis::cmd("GET")
            .arg(format!("tally:applied:g-tpat:{topic}:{p}:0"))
            .query(&mut conn)
            .unwrap()
    };
    wait_for(
        "the matching topic applied",
        Duration::from_secs(30),
        || (0..2).all(|p| applied("tpat-orders-eu", p) == Some(50)),
    )
    .await;
    let reading = r#"tally_pattern_topics{pattern="tpat-orders-.*",state="reading"}"#;
    let gauge = |state: &str| {
        m.consumer
            .patterns
            .with_label_values(&[PATTERN, state])
            .get()
    };
    assert_eq!(gauge("reading"), 1, "{reading}");

    // Created while tally runs: read within a listing or two.
    h.mock.create_topic("tpat-orders-us", 3, 1).unwrap();
    produce(&bootstrap, "tpat-orders-us", 3, 60, "us");
    wait_for("the new topic applied", Duration::from_secs(30), || {
        (0..3).all(|p| applied("tpat-orders-us", p) == Some(20))
    })
    .await;
    assert_eq!(gauge("reading"), 2);
    assert_eq!(gauge("over_limit"), 0);

    // Not matched, or tally's own dead-letter topic: no fence, no count.
    for (topic, partitions) in [("tpat-other", 2), ("tpat-orders-dlq", 1)] {
        for p in 0..partitions {
            assert_eq!(applied(topic, p), None, "{topic} is not read");
        }
    }
    let rows = tally::stream::state::inspect(&config, &[0]).await.unwrap();
    let mut shown: Vec<(String, i32)> = rows
        .iter()
        .map(|r| (r.topic.clone(), r.partition))
        .collect();
    shown.sort();
    let want: Vec<(String, i32)> = [("tpat-orders-eu", 0), ("tpat-orders-eu", 1)]
        .into_iter()
        .chain((0..3).map(|p| ("tpat-orders-us", p)))
        .map(|(t, p)| (t.to_string(), p))
        .collect();
    assert_eq!(shown, want, "tally state lists the matched topics' fences");
    running.stop().await;

    let got = h.dump("tpat:*");
    let per_app = |app: &str| -> i64 {
        got.iter()
            .filter(|(k, _)| k.starts_with(&format!("tpat:{app}:")))
            .map(|(_, v)| v)
            .sum()
    };
    assert_eq!((per_app("eu"), per_app("us")), (100, 60));
    assert_eq!(
        got.values().sum::<i64>(),
        160,
        "nothing else counted: {got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_past_the_limit_are_not_read_and_say_so() {
    let h = Harness::new("tlim-a", 1);
    let bootstrap = h.mock.bootstrap_servers();
    h.mock.create_topic("tlim-b", 1, 1).unwrap();
    produce(&bootstrap, "tlim-a", 1, 10, "a");
    produce(&bootstrap, "tlim-b", 1, 10, "b");
    let mut config = h.config("g-tlim", hourly("tlim"));
    let mut decode = tally::config::DecodeConfig::default();
    decode.fields.insert("app_id".into(), "order.app".into());
    config.kafka.topics = vec![tally::config::TopicConfig {
        name: String::new(),
        pattern: Some("tlim-.".into()),
        decode: Some(decode),
    }];
    config.kafka.topic = tally::config::KafkaConfig::default().topic;
    config.kafka.consumers = tally::config::Consumers::Count(1);
    config.kafka.topics_refresh = Duration::from_millis(200);
    config.kafka.max_pattern_topics = 1;
    config.validate().expect("valid");
    let running = h.start(config);
    let m = running.metrics.clone();
    let gauge = |state: &str| {
        m.consumer
            .patterns
            .with_label_values(&["tlim-.", state])
            .get()
    };
    wait_for(
        "one read, one over the limit",
        Duration::from_secs(30),
        || gauge("reading") == 1 && gauge("over_limit") == 1,
    )
    .await;
    wait_for("the first applied", Duration::from_secs(30), || {
        h.dump("tlim:*").values().sum::<i64>() == 10
    })
    .await;
    running.stop().await;
    // Names are taken in order: `tlim-a` is read, `tlim-b` waits for room.
    let got = h.dump("tlim:*");
    assert!(got.keys().all(|k| k.starts_with("tlim:a:")), "{got:?}");
}
