//! Against a second Kafka implementation: tansu (SQLite storage, SASL/SCRAM), a separate
//! process that keeps its data through a kill -9. Exact counts through tally's crash loop and
//! the broker's own crashes; SCRAM-SHA-512 credentials from `[kafka.properties]`; a wrong
//! password named in the log and by `/health/ready`.
//!
//! The before-log-start case (retention removed events before tally read them) is not tested
//! here: tansu 0.6's SQLite engine answers DeleteRecords with a panic (`todo!()`), and its
//! retention deletes records without moving the partition's log start offset, so a consumer is
//! never told that offsets are gone (see README, "Kafka implementations").

use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::tansu::Tansu;
use tally_testkit::wait::wait_until;

use crate::common::process::TallyProcess;
use crate::common::stream::Stream;
use crate::stream::exactly_once::{config, finish_and_compare, PARTITIONS};

/// The producer retries across broker crashes: without idempotence a retried batch could be
/// stored twice and the truth would not be the produced events.
const IDEMPOTENT: (&str, &str) = ("enable.idempotence", "true");

/// End offsets of every partition, as the broker reports them.
fn end_offsets(bootstrap: &str, topic: &str, properties: &[(&str, &str)]) -> Vec<i64> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("group.id", "tansu-watermarks");
    for (k, v) in properties {
        cfg.set(*k, *v);
    }
    let c: BaseConsumer = cfg.create().unwrap();
    (0..PARTITIONS)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

#[test]
fn crash_loop_and_broker_restarts_count_exactly() {
    let topic = "tansu-crash";
    let mut broker = Tansu::start().unwrap();
    broker.create_topic(topic, PARTITIONS).unwrap();
    let redis = LocalRedis::start(&[]).unwrap();
    let cfg = config(&broker.bootstrap(), &redis.url(), "g-tansu", topic);
    let stream = Stream {
        n: 30_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce_with(&broker.bootstrap(), topic, 500, &[IDEMPOTENT]);

    let seed: u64 = rand::random();
    eprintln!("tansu crash loop seed {seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let (mut kills, mut broker_kills, mut resumed) = (0, 0, 0);
    while kills < 10 || broker_kills < 3 || !producer.is_finished() {
        let mut t = TallyProcess::start(&cfg, "tansu-crash");
        t.wait_working();
        if kills % 3 == 1 {
            // The broker dies under a working tally and comes back with its data.
            broker.kill9();
            std::thread::sleep(Duration::from_millis(rng.random_range(100..2000)));
            broker.restart().unwrap();
            broker_kills += 1;
            // The same tally process consumes again once the broker is back (while events
            // are still produced: the later cycles may find nothing left to read).
            let consumed = t.metric("tally_messages_consumed_total").unwrap_or(0.0);
            if t.wait_metric(
                "tally_messages_consumed_total",
                consumed + 1.0,
                Duration::from_secs(30),
            ) {
                resumed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
        t.kill9();
        kills += 1;
    }
    let produced = producer.join().unwrap();
    assert_eq!(
        end_offsets(&broker.bootstrap(), topic, &[]),
        produced,
        "the broker holds exactly the produced events"
    );
    let (keys, mismatches) =
        finish_and_compare(&cfg, &redis.url(), "g-tansu", topic, &produced, &stream);
    eprintln!(
        "tansu: {kills} SIGKILLs of tally, {broker_kills} SIGKILL+restart of the broker ({resumed} followed by tally consuming again without a restart), {} events, {keys} keys compared, {mismatches} mismatches",
        stream.n
    );
    assert_eq!(mismatches, 0);
    assert!(resumed >= 1, "tally never resumed after a broker restart");
}

/// `config` with SCRAM-SHA-512 credentials in `[kafka.properties]`.
fn with_credentials(cfg: &str, user: &str, password: &str) -> String {
    let sasl = format!(
        "[kafka.properties]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanisms\" = \"SCRAM-SHA-512\"\n\"sasl.username\" = \"{user}\"\n\"sasl.password\" = \"{password}\"\n"
    );
    let out = cfg.replacen("[kafka.properties]\n", &sasl, 1);
    assert_ne!(out, cfg);
    out
}

#[test]
fn sasl_scram_sha_512_counts_exactly_and_a_wrong_password_is_named() {
    let topic = "tansu-sasl";
    let (user, password) = ("tally", "correct-horse-battery");
    let mut broker = Tansu::start().unwrap();
    broker.create_topic(topic, PARTITIONS).unwrap();
    broker.create_user(user, password).unwrap();
    broker.require_authentication().unwrap();
    let sasl = [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "SCRAM-SHA-512"),
        ("sasl.username", user),
        ("sasl.password", password),
    ];
    let redis = LocalRedis::start(&[]).unwrap();
    let plain = config(&broker.bootstrap(), &redis.url(), "g-sasl", topic);
    let cfg = with_credentials(&plain, user, password);
    let stream = Stream {
        n: 1_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce_with(&broker.bootstrap(), topic, 10_000, &sasl);
    let produced = producer.join().unwrap();
    assert_eq!(end_offsets(&broker.bootstrap(), topic, &sasl), produced);
    let (keys, mismatches) =
        finish_and_compare(&cfg, &redis.url(), "g-sasl", topic, &produced, &stream);
    eprintln!(
        "tansu SASL/SCRAM-SHA-512: {} events, {keys} keys compared, {mismatches} mismatches",
        stream.n
    );
    assert_eq!(mismatches, 0);

    // The same user with a wrong password: not ready, and both readiness and the log say why.
    let wrong_password = "wrong-horse-battery";
    let wrong = TallyProcess::start(
        &with_credentials(&plain, user, wrong_password),
        "tansu-wrong",
    );
    let mut last = None;
    let named = wait_until(Duration::from_secs(30), || {
        last = tally_testkit::http::get(wrong.port, "/health/ready");
        last.as_ref()
            .is_some_and(|(status, body)| *status == 503 && body.contains("authentication"))
    });
    assert!(
        named,
        "readiness names the failed authentication: {last:?}\n{}",
        wrong.log()
    );
    let log = wrong.log();
    assert!(
        log.contains("kafka authentication failed"),
        "the log names the failed authentication:\n{log}"
    );
    assert!(
        !log.contains(wrong_password) && !last.unwrap().1.contains(wrong_password),
        "the password is never printed"
    );
}
