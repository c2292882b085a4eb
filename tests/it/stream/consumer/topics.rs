//! Several topics in one process (`[[kafka.topics]]`): two topics with different partition
//! counts and field layouts (flat JSON per `[decode]`, nested JSON with its own decoding), and
//! counters reading one, the other, or both. Every key is compared with a ground truth computed
//! from what was produced, through a SIGKILL crash loop; `tally state` lists both topics' fences;
//! `tally check` refuses a counter naming a topic that is not read.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use rand::{RngExt, SeedableRng};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::ClientConfig;
use tally_testkit::local_redis::LocalRedis;

use crate::common::process::{redis_flush_toml, BrokerProcess, TallyProcess};
use crate::common::topics::{self, dump, mismatches, no_skips, tally_cli, Record};

const FLAT: &str = "tp-flat";
const FLAT_PARTITIONS: i32 = 3;
const NESTED: &str = "tp-nested";
const NESTED_PARTITIONS: i32 = 5;
const HOUR: i64 = 3_600_000;

/// `by_app` and `bytes` read both topics, `by_page` only the flat one, `by_user` only the
/// nested one: a nested event has no `page`, a flat one no `user`.
fn config(bootstrap: &str, redis: &str, group: &str) -> String {
    let redis_flush = redis_flush_toml(redis);
    format!(
        r#"
[kafka]
brokers = "{bootstrap}"
group_id = "{group}"
consumers = 1
[kafka.properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "300"

[[kafka.topics]]
name = "{FLAT}"

[[kafka.topics]]
name = "{NESTED}"
[kafka.topics.decode]
time_field = "ts"
[kafka.topics.decode.fields]
app = "req.app"
n = "req.bytes"
user = "client.user"

[decode]
time_field = "ts"

{redis_flush}
[[counters]]
name = "by_app"
dimensions = ["app"]
key = "tp:app:{{app}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"

[[counters]]
name = "bytes"
dimensions = ["app"]
value_field = "n"
key = "tp:bytes:{{app}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"

[[counters]]
name = "by_page"
dimensions = ["page"]
topics = ["{FLAT}"]
key = "tp:page:{{page}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"

[[counters]]
name = "by_user"
dimensions = ["user"]
topics = ["{NESTED}"]
key = "tp:user:{{user}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"
"#
    )
}

/// One produced event and what it adds.
struct Event {
    topic: &'static str,
    partition: i32,
    payload: String,
    app: String,
    /// `page` (flat) or `user` (nested).
    other: String,
    n: i64,
    ts: i64,
}

/// Event `i` of the stream: even ones to the flat topic, odd ones to the nested one.
fn event(i: u64, now_ms: i64) -> Event {
    let i = i as i64;
    let app = format!("a{}", i % 5);
    let n = i % 17 + 1;
    let ts = now_ms - (i % 2) * HOUR - (i * 7_919) % HOUR;
    if i % 2 == 0 {
        let page = format!("p{}", i % 11);
        Event {
            topic: FLAT,
            partition: ((i / 2) % i64::from(FLAT_PARTITIONS)) as i32,
            payload: format!(r#"{{"app":"{app}","page":"{page}","n":{n},"ts":{ts}}}"#),
            app,
            other: page,
            n,
            ts,
        }
    } else {
        let user = format!("u{}", i % 13);
        Event {
            topic: NESTED,
            partition: ((i / 2) % i64::from(NESTED_PARTITIONS)) as i32,
            payload: format!(
                r#"{{"req":{{"app":"{app}","bytes":{n}}},"client":{{"user":"{user}"}},"ts":{ts}}}"#
            ),
            app,
            other: user,
            n,
            ts,
        }
    }
}

/// Every key the first `n` events write, with its value, computed without tally's code.
fn truth(n: u64, now_ms: i64) -> BTreeMap<String, i64> {
    let mut want = BTreeMap::new();
    for i in 0..n {
        let e = event(i, now_ms);
        let hour = Utc.timestamp_millis_opt(e.ts).unwrap().format("%Y%m%d%H");
        *want.entry(format!("tp:app:{}:{hour}", e.app)).or_insert(0) += 1;
        *want
            .entry(format!("tp:bytes:{}:{hour}", e.app))
            .or_insert(0) += e.n;
        let other = match e.topic {
            FLAT => format!("tp:page:{}:{hour}", e.other),
            _ => format!("tp:user:{}:{hour}", e.other),
        };
        *want.entry(other).or_insert(0) += 1;
    }
    want
}

/// Per (topic, partition): how many events the first `n` put there (= its end offset).
fn produced(n: u64, now_ms: i64) -> BTreeMap<(&'static str, i32), i64> {
    let mut ends = BTreeMap::new();
    for t in 0..FLAT_PARTITIONS {
        ends.insert((FLAT, t), 0);
    }
    for t in 0..NESTED_PARTITIONS {
        ends.insert((NESTED, t), 0);
    }
    for i in 0..n {
        let e = event(i, now_ms);
        *ends.get_mut(&(e.topic, e.partition)).unwrap() += 1;
    }
    ends
}

#[test]
fn two_topics_count_exactly_through_a_sigkill_crash_loop() {
    const N: u64 = 30_000;
    let broker = BrokerProcess::start(&[(FLAT, FLAT_PARTITIONS), (NESTED, NESTED_PARTITIONS)]);
    let redis = LocalRedis::start(&[]).unwrap();
    let group = "g-topics";
    let cfg = config(&broker.bootstrap, &redis.url(), group);
    let now_ms = chrono::Utc::now().timestamp_millis();
    let (producer, sent) = topics::produce(&broker.bootstrap, 0..N, 3_000, move |i| {
        let e = event(i, now_ms);
        Record {
            topic: e.topic.into(),
            partition: e.partition,
            payload: e.payload.into_bytes(),
        }
    });

    let seed: u64 = rand::random();
    eprintln!("topics crash loop seed {seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut kills = 0;
    while kills < 5 || !producer.is_finished() {
        let mut t = TallyProcess::start(&cfg, "topics");
        let consuming = t.wait_working();
        std::thread::sleep(Duration::from_millis(rng.random_range(100..1200)));
        if consuming {
            no_skips(&t, &[]);
        }
        t.kill9();
        kills += 1;
    }
    producer.join().unwrap();
    assert_eq!(sent.load(Ordering::Relaxed), N);

    // A last replica catches up, then drains on SIGTERM.
    let mut last = TallyProcess::start(&cfg, "topics-final");
    let mut conn = topics::redis_conn(&redis.url());
    let want_ends = produced(N, now_ms);
    topics::catch_up(&last, &mut conn, group, &want_ends);
    last.drain();

    let want = truth(N, now_ms);
    let got = dump(&mut conn, "tp:*");
    let wrong = mismatches(&got, &want);
    eprintln!(
        "topics crash loop: {kills} SIGKILLs, {N} events over 2 topics, {} keys, {wrong} wrong",
        want.len()
    );
    assert_eq!(wrong, 0);
    for prefix in ["tp:app:", "tp:bytes:", "tp:page:", "tp:user:"] {
        assert!(want.keys().any(|k| k.starts_with(prefix)), "{prefix}");
    }

    // `tally state` shows the fences of both topics, every partition of each (one fence lost:
    // the state marker still holds its copy).
    let lost = format!("tally:applied:{group}:{NESTED}:4:0");
    let _: () = redis::cmd("DEL").arg(&lost).query(&mut conn).unwrap();
    let (shown, stderr, status) = tally_cli(&cfg, &["state"]);
    assert!(status.success(), "{stderr}");
    for ((topic, p), end) in &want_ends {
        let row = match (*topic, *p) {
            (NESTED, 4) => format!("{topic}\t{p}\t0\t-\t{end}\tmissing"),
            _ => format!("{topic}\t{p}\t0\t{end}\t{end}\tok"),
        };
        assert!(shown.contains(&row), "no row `{row}` in:\n{shown}");
    }
    // With several topics, a repair must say which topic it means.
    let (_, stderr, status) = tally_cli(&cfg, &["state", "repair", "--partition", "0"]);
    assert!(!status.success());
    assert!(stderr.contains("--topic"), "{stderr}");
    let (out, stderr, status) = tally_cli(
        &cfg,
        &["state", "repair", "--topic", NESTED, "--partition", "4"],
    );
    assert!(status.success(), "{stderr}");
    let end = want_ends[&(NESTED, 4)];
    assert!(
        out.contains(&format!("applied offset set to {end}")),
        "{out}"
    );
}

#[test]
fn tally_check_refuses_a_counter_reading_a_topic_that_is_not_read() {
    let cfg = config("127.0.0.1:9", "redis://127.0.0.1:9", "g-check");
    let (_, stderr, status) = tally_cli(&cfg, &["check"]);
    assert!(status.success(), "the test's own config is valid: {stderr}");

    let unknown = cfg.replace(&format!("topics = [\"{NESTED}\"]"), "topics = [\"clicks\"]");
    let (_, stderr, status) = tally_cli(&unknown, &["check"]);
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("counters[3].topics") && stderr.contains("`clicks` is not a topic"),
        "{stderr}"
    );

    // A topic's own decoding is checked like [decode], its errors named after where it is.
    let bad = cfg.replace(
        "[kafka.topics.decode]\n",
        "[kafka.topics.decode]\nformat = \"avro\"\n",
    );
    let (_, stderr, status) = tally_cli(&bad, &["check"]);
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("kafka.topics[1].decode.format"), "{stderr}");

    let twice = cfg.replace(
        &format!("name = \"{NESTED}\""),
        &format!("name = \"{FLAT}\""),
    );
    let (_, stderr, status) = tally_cli(&twice, &["check"]);
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("kafka.topics[1].name"), "{stderr}");

    let both = cfg.replace("consumers = 1\n", "consumers = 1\ntopic = \"other\"\n");
    let (_, stderr, status) = tally_cli(&both, &["check"]);
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("kafka.topic"), "{stderr}");
}

/// The reconciler recounts every topic: with two topics feeding one counter, a recount of the
/// first alone would find Redis ahead on every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_recounts_every_topic() {
    use crate::common::{hourly, wait_for, Harness};
    let mut h = Harness::new("rt-a", 2);
    h.mock.create_topic("rt-b", 3, 1).unwrap();
    let b: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", h.mock.bootstrap_servers())
        .create()
        .unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let last_hour = (now / HOUR - 1) * HOUR + 1_000;
    for i in 0..300u32 {
        let payload = format!(r#"{{"app_id":"a{}","device_id":"d{}"}}"#, i % 3, i % 7);
        let ts = Some(last_hour + i64::from(i));
        h.produce((i % 2) as i32, payload.as_bytes(), ts);
        let rec = BaseRecord::<(), str>::to("rt-b")
            .partition((i % 3) as i32)
            .payload(&payload)
            .timestamp(last_hour + i64::from(i));
        b.send(rec).map_err(|(e, _)| e).unwrap();
    }
    h.flush_producer();
    b.flush(Duration::from_secs(30)).unwrap();
    let mut config = h.config("g-rt", hourly("rt"));
    config.kafka.topics = ["rt-a", "rt-b"]
        .map(|name| tally::config::TopicConfig {
            name: name.into(),
            pattern: None,
            decode: None,
        })
        .to_vec();
    config.validate().unwrap();
    let counting = h.start(config.clone());
    let mut conn = h.conn();
    let want: Vec<(&str, i32, i64)> = (0..2)
        .map(|p| ("rt-a", p, 150))
        .chain((0..3).map(|p| ("rt-b", p, 100)))
        .collect();
    wait_for("both topics applied", Duration::from_secs(60), || {
        want.iter().all(|(t, p, end)| {
            let fence: Option<i64> = redis::cmd("GET")
                .arg(format!("tally:applied:g-rt:{t}:{p}:0"))
                .query(&mut conn)
                .unwrap();
            fence == Some(*end)
        })
    })
    .await;
    counting.stop().await;
    assert_eq!(h.dump("rt:*").values().sum::<i64>(), 600);

    config.jobs.reconcile.enabled = true;
    config.jobs.reconcile.interval = Duration::from_millis(200);
    config.jobs.reconcile.grace = Duration::ZERO;
    config.jobs.reconcile.lease = Duration::from_secs(2);
    let running = h.start(config);
    let m = running.metrics.clone();
    let checked = || m.jobs.reconciled.with_label_values(&["flow"]).get();
    let before = checked();
    wait_for("a pass over both topics", Duration::from_secs(30), || {
        checked() >= before + 21
    })
    .await;
    let mismatches = m.jobs.mismatches.with_label_values(&["flow"]).get();
    assert_eq!(mismatches, 0, "redis equals the recount of both topics");
    running.stop().await;
}
