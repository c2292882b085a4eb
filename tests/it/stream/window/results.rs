//! Window results downstream, end to end: tally runs as processes (replicas, kill -9 at random
//! moments, the publishing leader included) against a broker process, librdkafka's mock and
//! tansu, one scenario for both; the output topic is read back with a `read_committed` consumer
//! and every (window, key) is compared with the truth computed here from the produced events.
//! One input partition never gets a message (idle).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::TimeZone;
use rand::{RngExt, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::tansu::Tansu;
use tally_testkit::wait::wait_until;

use crate::common::process::{kafka_toml, BrokerProcess, TallyProcess};
use crate::stream::window::records::{
    check_records, check_tops, one_final, summarize, wait_output,
};

/// Input partitions; the last one never gets a message.
pub(crate) const PARTITIONS: i32 = 4;
pub(crate) const MIN: i64 = 60_000;

/// Members a leaderboard record lists.
pub(crate) const TOP: usize = 3;

/// Four counters (a count, a sum, an exact distinct count, a leaderboard of devices per app) with
/// an output to `out`, published `when` (`final` or `updates`).
pub(crate) fn config(bootstrap: &str, redis: &str, topic: &str, out: &str, when: &str) -> String {
    let output = format!(r#"output = {{ topic = "{out}", when = "{when}", idle_timeout = "2s" }}"#);
    let kafka = kafka_toml(bootstrap, topic, "g-win");
    format!(
        r#"{kafka}
[redis]
url = "{redis}"
[flush]
interval = "50ms"
[jobs.publish]
interval = "100ms"
lease = "1s"
[decode]
time_field = "ts"

[[counters]]
name = "views"
dimensions = ["app"]
key = "win:views:{{app}}:{{yyyyMMddHHmm}}"
window = "1m"
retention = "1d"
{output}

[[counters]]
name = "bytes"
dimensions = ["app", "dev"]
key = "win:bytes:{{app}}:{{dev}}:{{yyyyMMddHHmm}}"
window = "1m"
retention = "1d"
value_field = "bytes"
{output}

[[counters]]
name = "users"
kind = "distinct"
distinct = "exact"
member = "dev"
dimensions = ["app"]
key = "win:users:{{app}}:{{yyyyMMddHHmm}}"
window = "1m"
retention = "1d"
{output}

[[counters]]
name = "devs"
kind = "leaderboard"
member = "dev"
dimensions = ["app"]
key = "win:devs:{{app}}:{{yyyyMMddHHmm}}"
window = "1m"
retention = "1d"
output = {{ topic = "{out}", when = "{when}", idle_timeout = "2s", top = {TOP} }}
"#
    )
}

/// One produced event.
#[derive(Clone)]
pub(crate) struct Ev {
    partition: i32,
    app: String,
    dev: String,
    ts: i64,
    bytes: i64,
}

impl Ev {
    fn payload(&self) -> String {
        format!(
            r#"{{"app":"{}","dev":"{}","ts":{},"bytes":{}}}"#,
            self.app, self.dev, self.ts, self.bytes
        )
    }
}

/// `n` events in minutes `windows` after `base`, over the active partitions.
pub(crate) fn events(base: i64, windows: std::ops::Range<i64>, n: u64, seed: u64) -> Vec<Ev> {
    let span = windows.end - windows.start;
    (0..n)
        .map(|i| {
            let j = i + seed;
            Ev {
                partition: (j % (PARTITIONS as u64 - 1)) as i32,
                app: format!("a{}", j % 5),
                dev: format!("d{}", (j * 7) % 400),
                ts: base + (windows.start + (i as i64 * span) / n as i64) * MIN + (j as i64 % 997),
                bytes: (j % 10 + 1) as i64,
            }
        })
        .collect()
}

pub(crate) fn produce(bootstrap: &str, topic: &str, events: &[Ev]) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for e in events {
        let payload = e.payload();
        let mut rec = BaseRecord::<(), str>::to(topic)
            .partition(e.partition)
            .payload(&payload);
        while let Err((_, r)) = producer.send(rec) {
            std::thread::sleep(Duration::from_millis(5));
            rec = r;
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

pub(crate) fn minute_text(ts: i64) -> String {
    chrono::Utc
        .timestamp_millis_opt(ts)
        .unwrap()
        .format("%Y%m%d%H%M")
        .to_string()
}

/// The truth per record key (the counter key), for windows ending at or before `closed_end`.
pub(crate) fn truth(events: &[Ev], closed_end: i64) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let mut users: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for e in events {
        let start = e.ts - e.ts.rem_euclid(MIN);
        if start + MIN > closed_end {
            continue;
        }
        let t = minute_text(e.ts);
        *out.entry(format!("win:views:{}:{t}", e.app)).or_insert(0) += 1;
        *out.entry(format!("win:bytes:{}:{}:{t}", e.app, e.dev))
            .or_insert(0) += e.bytes;
        users
            .entry(format!("win:users:{}:{t}", e.app))
            .or_default()
            .insert(&e.dev);
    }
    for (k, set) in users {
        // The leaderboard of devices per app has as many members as the app has users.
        out.insert(k.replace("win:users:", "win:devs:"), set.len() as i64);
        out.insert(k, set.len() as i64);
    }
    out
}

/// The truth of the leaderboard's `top` per record key (its best [`TOP`] devices per app and
/// minute, as Redis ranks them: score descending, then member descending), for windows ending at
/// or before `closed_end`.
pub(crate) fn tops(events: &[Ev], closed_end: i64) -> BTreeMap<String, Value> {
    let mut scores: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
    for e in events {
        let start = e.ts - e.ts.rem_euclid(MIN);
        if start + MIN <= closed_end {
            let key = format!("win:devs:{}:{}", e.app, minute_text(e.ts));
            *scores.entry(key).or_default().entry(&e.dev).or_insert(0) += 1;
        }
    }
    scores
        .into_iter()
        .map(|(key, members)| {
            let mut ranked: Vec<(&str, i64)> = members.into_iter().collect();
            ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(a.0)));
            let top: Vec<Value> = ranked
                .into_iter()
                .take(TOP)
                .map(|(m, s)| serde_json::json!({"member": m, "score": s}))
                .collect();
            (key, Value::Array(top))
        })
        .collect()
}

/// Every record of the output topic so far (key, JSON value), in order.
pub(crate) fn read_output(bootstrap: &str, out: &str) -> Vec<(String, Value)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "win-reader")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let (_, high) = c.fetch_watermarks(out, 0, Duration::from_secs(10)).unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(out, 0, Offset::Beginning).unwrap();
    c.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (got.len() as i64) < high && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let mut value: Value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap();
            // The record's Kafka timestamp, beside its fields, for the checks.
            value["_kafka_timestamp"] = m.timestamp().to_millis().into();
            got.push((key, value));
        }
    }
    got
}

const TOPIC: &str = "win-in";
const OUT: &str = "win-out";

#[test]
fn closed_windows_are_published_once_with_their_truth_through_kills_and_late_data() {
    let broker = BrokerProcess::start(&[(TOPIC, PARTITIONS), (OUT, 1)]);
    scenario(&broker.bootstrap);
}

/// The same on tansu, a broker that writes what librdkafka's mock does not check: its log is
/// on disk, and a `read_committed` consumer reads what a real broker would hand it.
#[test]
fn closed_windows_are_published_once_on_tansu() {
    let broker = Tansu::start().unwrap();
    broker.create_topic(TOPIC, PARTITIONS).unwrap();
    broker.create_topic(OUT, 1).unwrap();
    scenario(&broker.bootstrap());
}

/// Minutes 0..4 produced, 10 kill -9 of tally (the publisher mid-publish among them, a second
/// replica every other round), late events into the closed minutes right after the first kill
/// mid-publish; every key of the closed windows has one final record, its value between the
/// truths before and after the late events; then more late events and a window close: the last
/// record of every key is the new truth.
fn scenario(bootstrap: &str) {
    let (topic, out) = (TOPIC, OUT);
    let redis = LocalRedis::start(&[]).unwrap();
    let cfg = config(bootstrap, &redis.url(), topic, out, "final");
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 60 * MIN;

    // Minutes 0..4: the watermark ends in minute 3, so minutes 0..3 close and minute 3 stays open.
    let mut all = events(base, 0..4, 12_000, 0);
    produce(bootstrap, topic, &all);
    let late_mid_publish = crash_loop(bootstrap, &cfg, &redis, base);

    let mut last = TallyProcess::start(&cfg, "win-final");
    each_closed_key_has_one_final_record(bootstrap, &last, &mut all, late_mid_publish, base);
    late_changes_come_as_corrections(bootstrap, &last, &mut all, base);
    let status = last.terminate(Duration::from_secs(30));
    assert!(status.success());
}

/// 10 kill -9 of tally (the publisher mid-publish among them, a second replica every other
/// round); late events into the closed minutes right after the first kill mid-publish, which
/// are returned.
fn crash_loop(bootstrap: &str, cfg: &str, redis: &LocalRedis, base: i64) -> Vec<Ev> {
    let topic = TOPIC;
    let seed: u64 = rand::random();
    eprintln!("window results seed {seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut kills = 0;
    let mut leader_kills = 0;
    let mut mid_publish = 0;
    let mut late_mid_publish: Vec<Ev> = Vec::new();
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    while kills < 10 {
        let a = TallyProcess::start(cfg, "win-a");
        // Every other round a second replica: the partitions are shared, then rebalanced.
        let b = (kills % 2 == 1).then(|| TallyProcess::start(cfg, "win-b"));
        assert!(a.wait_metric("tally_assigned_partitions", 1.0, Duration::from_secs(60)));
        let progress = |conn: &mut redis::Connection, counter: &str| -> Option<i64> {
            redis::cmd("GET")
                .arg(format!("tally:published:g-win:win-in:{counter}"))
                .query(conn)
                .unwrap()
        };
        if mid_publish == 0 && kills < 6 {
            // The publishing leader mid-publish: right after Kafka acknowledged the first window
            // of the first counter (recorded in Redis), whichever replica leads. The first
            // windows close only once the idle partition counts as idle, and a broker under load
            // is slow to acknowledge: wait for it, polling Redis, not for a fixed time.
            wait_until(Duration::from_secs(30), || {
                progress(&mut conn, "views").is_some()
            });
        } else {
            std::thread::sleep(Duration::from_millis(rng.random_range(0..1200)));
        }
        let leading = a.metric(r#"tally_job_leader{task="publish"}"#) == Some(1.0)
            || b.as_ref()
                .and_then(|b| b.metric(r#"tally_job_leader{task="publish"}"#))
                == Some(1.0);
        leader_kills += usize::from(leading);
        drop(b);
        drop(a);
        kills += 1;
        // Some windows acknowledged, not all: the kill interrupted the publisher's work.
        let done = ["views", "bytes", "users", "devs"].map(|c| progress(&mut conn, c));
        let started = done.iter().any(Option::is_some);
        let unfinished = done.iter().any(|p| p.is_none_or(|p| p < base + 3 * MIN));
        mid_publish += usize::from(started && unfinished);
        if started && unfinished && late_mid_publish.is_empty() {
            // Late events into the closed minutes while windows are half published: their
            // retries must produce the first attempt's records, the change comes as corrections.
            late_mid_publish = events(base, 0..3, 300, 11);
            produce(bootstrap, topic, &late_mid_publish);
        }
    }
    eprintln!(
        "{kills} kill -9, {leader_kills} with the publisher leading, {mid_publish} mid-publish"
    );
    assert!(mid_publish > 0, "no kill hit the publisher mid-publish");
    late_mid_publish
}

/// Every key of the closed windows has one final record, its value between the truths before
/// and after the late events that landed mid-publish (`late`, added to `all`).
fn each_closed_key_has_one_final_record(
    bootstrap: &str,
    last: &TallyProcess,
    all: &mut Vec<Ev>,
    late: Vec<Ev>,
    base: i64,
) {
    let closed = base + 3 * MIN;
    let before = truth(all, closed);
    all.extend(late);
    let want = truth(all, closed);
    let records = wait_output(bootstrap, OUT, |s| {
        want.keys()
            .all(|k| s.get(k).is_some_and(|(f, _)| !f.is_empty()))
    });
    check_records(&records);
    one_final(&records);
    let seen = summarize(&records);
    for (k, v) in &want {
        // Taken before, during or after the late events landed: between the two truths.
        let finals = seen.get(k).map(|s| s.0.clone()).unwrap_or_default();
        assert!(
            finals.len() == 1 && finals.iter().all(|f| (before[k]..=*v).contains(f)),
            "{k}: one final value, between {} and {v}: {finals:?}\n{}",
            before[k],
            last.log()
        );
    }
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "only the closed windows (minutes 0 to 2) are published"
    );
}

/// More late events and a window close: the last record of every key is the new truth, the
/// changed ones corrected; the open minute stays unpublished.
fn late_changes_come_as_corrections(
    bootstrap: &str,
    last: &TallyProcess,
    all: &mut Vec<Ev>,
    base: i64,
) {
    // Late events into minute 1 (within retention), then events in minute 5 on every active
    // partition: minutes 3 and 4 close, and minute 1's changed keys are corrected.
    let late = events(base, 1..2, 300, 7);
    let mut closer = events(base, 5..6, 3, 0);
    let mut next = late.clone();
    next.append(&mut closer);
    produce(bootstrap, TOPIC, &next);
    all.extend(next);
    let want = truth(all, base + 5 * MIN);
    let records = wait_output(bootstrap, OUT, |s| {
        want.iter()
            .all(|(k, v)| s.get(k).is_some_and(|(_, last)| last == v))
    });
    check_records(&records);
    one_final(&records);
    let seen = summarize(&records);
    let mut corrected = 0;
    for (k, v) in &want {
        let (finals, last_value) = seen.get(k).cloned().unwrap_or_default();
        assert_eq!(last_value, *v, "{k}: the last record is the new truth");
        if finals.len() != 1 || !finals.contains(v) {
            corrected += 1;
        }
    }
    let corrections = records
        .iter()
        .filter(|(_, v)| v["correction"] == Value::Bool(true))
        .count();
    assert!(
        corrected > 0 && corrections >= corrected,
        "{corrected} {corrections}"
    );
    assert!(
        last.metric(r#"tally_publish_corrections_total{counter="bytes"}"#)
            .is_some_and(|v| v > 0.0)
            || corrections > 0
    );
    assert!(
        seen.keys().all(|k| want.contains_key(k)),
        "minute 5 stays open"
    );
    check_tops(&records, &tops(all, base + 5 * MIN));
}
