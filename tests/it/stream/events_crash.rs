//! Events as users have them, through a SIGKILL crash loop: one `tally run` reads three topics
//! at once — Avro in the Confluent wire format with two schema versions interleaved, Protobuf
//! with two versions importing a referenced schema (both through the schema registry
//! stand-in), and nested JSON whose counter has a CEL filter and a derived dimension — and is
//! killed 20 times (a third of them inside a held flush) while events are produced.
//! Afterwards every key equals a ground truth computed from what was produced, nothing was
//! skipped but what the filter excluded, and the final process counted exactly the filtered
//! events the truth says it read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{TimeZone, Utc};
use rand::SeedableRng;
use serde_json::json;
use tally_testkit::local_redis::LocalRedis;

use crate::common::process::{kill_somewhere, redis_flush_toml, BrokerProcess, TallyProcess};
use crate::common::registry::Registry;
use crate::common::schemas::{self, avro_v1, avro_v2, PROTO_COMMON, PROTO_V1, PROTO_V2};
use crate::common::topics::{self, applied, dump, mismatches, no_skips, Record};

const AVRO: &str = "ec-avro";
const PROTO: &str = "ec-proto";
const JSON: &str = "ec-json";
const PARTITIONS: [(&str, i32); 3] = [(AVRO, 3), (PROTO, 2), (JSON, 2)];
const HOUR: i64 = 3_600_000;
const FILTERED: &str = r#"tally_events_skipped_total{counter="json_errors",reason="filtered"}"#;

/// `routes` and `methods` count every topic; `json_errors` only the JSON topic, the events
/// its filter keeps, by route and a status class derived from the status.
fn config(bootstrap: &str, redis: &str, registry: &str, group: &str) -> String {
    let registry = format!(r#"{{ url = "{registry}", username = "tally", password = "s3cret" }}"#);
    let redis_flush = redis_flush_toml(redis);
    format!(
        r#"
[kafka]
brokers = "{bootstrap}"
group_id = "{group}"
consumers = 1
[kafka.properties]
"session.timeout.ms" = "1500"
"heartbeat.interval.ms" = "150"

[[kafka.topics]]
name = "{AVRO}"
[kafka.topics.decode]
format = "avro"
schema_registry = {registry}
time_field = "at"
fields = {{ method = "http.method" }}

[[kafka.topics]]
name = "{PROTO}"
[kafka.topics.decode]
format = "protobuf"
schema_registry = {registry}
time_field = "at"
fields = {{ method = "http.method" }}

[[kafka.topics]]
name = "{JSON}"
[kafka.topics.decode]
time_field = "ts"
fields = {{ route = "req.route", method = "req.method", status = "req.status" }}
derive = {{ class = 'string(status / 100) + "xx"' }}

{redis_flush}
[[counters]]
name = "routes"
dimensions = ["route"]
key = "ec:r:{{route}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"

[[counters]]
name = "methods"
dimensions = ["method"]
key = "ec:m:{{method}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"

[[counters]]
name = "json_errors"
topics = ["{JSON}"]
dimensions = ["route", "class"]
filter = 'status >= 400 && method != "GET"'
key = "ec:e:{{route}}:{{class}}:{{yyyyMMddHH}}"
window = "1h"
retention = "1d"
"#
    )
}

/// Event `i` of the stream: topic `i % 3`; within a topic, every field varies independently of
/// the partition and the schema version, and times spread over two hours.
struct Event {
    topic: &'static str,
    partition: i32,
    /// Its offset in its partition.
    offset: i64,
    /// Schema version 1 or 2 (Avro, Protobuf).
    version: u8,
    route: String,
    method: &'static str,
    status: i64,
    ts: i64,
}

impl Event {
    /// Whether the JSON counter's filter keeps it.
    fn kept(&self) -> bool {
        self.status >= 400 && self.method != "GET"
    }

    /// What the Python writers take (Avro, Protobuf), or the JSON payload.
    fn item(&self) -> serde_json::Value {
        let (route, method, status, at) = (&self.route, self.method, self.status, self.ts);
        match (self.topic, self.version) {
            (AVRO, 1) => json!({"id": 1, "schema": avro_v1(), "record":
                {"route": route, "status": status, "http": {"method": method}, "at": at}}),
            (AVRO, _) => json!({"id": 2, "schema": avro_v2(), "record":
                {"tenant": "t", "http": {"method": method, "path": null}, "route": route,
                 "region": null, "at": at * 1000 + 999, "status": status}}),
            (PROTO, 1) => json!({"schema": "v1", "id": 3, "message": "shop.Request",
                "indexes": [0], "record":
                {"route": route, "status": status, "http": {"method": method}, "at": at}}),
            (PROTO, _) => json!({"schema": "v2", "id": 4, "message": "shop.Request",
                "indexes": [1], "record":
                {"tenant": "t", "http": {"method": method, "path": "/x"}, "route": route,
                 "status": status, "at": at, "client": {"region": "eu"},
                 "items": [{"sku": "a"}]}}),
            _ => json!({"req": {"route": route, "method": method, "status": status},
                "client": {"app": "x"}, "ts": at}),
        }
    }
}

/// The first `n` events, and the record each is produced as.
fn stream(n: u64, now_ms: i64) -> (Vec<Event>, Vec<Record>) {
    let mut offsets: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    let events: Vec<Event> = (0..n as i64)
        .map(|i| {
            let (topic, partitions) = PARTITIONS[(i % 3) as usize];
            let k = i / 3;
            let partition = (k % i64::from(partitions)) as i32;
            let offset = offsets.entry((topic, partition)).or_default();
            *offset += 1;
            Event {
                topic,
                partition,
                offset: *offset - 1,
                version: 1 + ((k / 3) % 2) as u8,
                route: format!("/r{}", k % 4),
                method: ["GET", "POST", "PUT"][(k % 3) as usize],
                status: [200, 404, 500, 503][((k / 3) % 4) as usize],
                ts: now_ms - (k * 7_919) % (2 * HOUR),
            }
        })
        .collect();
    let of = |topic: &str| -> Vec<serde_json::Value> {
        let chosen = events.iter().filter(|e| e.topic == topic);
        chosen.map(Event::item).collect()
    };
    let mut avro = schemas::fastavro(&of(AVRO)).into_iter();
    let mut proto = schemas::protobuf_writer(schemas::proto_versions(), None, &of(PROTO));
    let mut proto = proto.drain(..);
    let records = events
        .iter()
        .map(|e| Record {
            topic: e.topic.into(),
            partition: e.partition,
            payload: match e.topic {
                AVRO => avro.next().unwrap(),
                PROTO => proto.next().unwrap(),
                _ => e.item().to_string().into_bytes(),
            },
        })
        .collect();
    (events, records)
}

/// Every key the events write, with its value, computed without tally's code.
fn truth(events: &[Event]) -> BTreeMap<String, i64> {
    let mut want = BTreeMap::new();
    for e in events {
        let hour = Utc.timestamp_millis_opt(e.ts).unwrap().format("%Y%m%d%H");
        *want.entry(format!("ec:r:{}:{hour}", e.route)).or_default() += 1;
        *want.entry(format!("ec:m:{}:{hour}", e.method)).or_default() += 1;
        if e.topic == JSON && e.kept() {
            let key = format!("ec:e:{}:{}xx:{hour}", e.route, e.status / 100);
            *want.entry(key).or_default() += 1;
        }
    }
    want
}

/// JSON events at or past Redis' applied offsets (`from`) that the filter excludes: what a
/// process starting there and reading them skips as `filtered`.
fn filtered_from(events: &[Event], from: &BTreeMap<(&str, i32), i64>) -> u64 {
    let read = |e: &&Event| e.offset >= from[&(e.topic, e.partition)].max(0);
    let excluded = |e: &&Event| e.topic == JSON && !e.kept();
    events.iter().filter(read).filter(excluded).count() as u64
}

fn parts() -> impl Iterator<Item = (&'static str, i32)> {
    PARTITIONS
        .iter()
        .flat_map(|&(t, n)| (0..n).map(move |p| (t, p)))
}

#[test]
fn avro_protobuf_and_filtered_json_topics_count_exactly_through_a_sigkill_crash_loop() {
    // Events arrive at RATE until the 20th kill (at most MAX of them: the loop then ends),
    // then TAIL more while the final process runs, so that it has filtered events of its own.
    const MAX: u64 = 20_000;
    const TAIL: u64 = 1_500;
    const RATE: u64 = 80;
    // The session timeout (1.5 s, so that a killed process's members leave the group soon) is
    // shorter than the mock's 3 s wait before a new group's first rebalance, during which it
    // would expire the first process's members and never answer their joins.
    let broker = BrokerProcess::start_with(&PARTITIONS, &["--initial-rebalance-delay", "300ms"]);
    let redis = LocalRedis::start(&[]).unwrap();
    let registry = Registry::start(Some("tally:s3cret"));
    registry.add(1, &avro_v1());
    registry.add(2, &avro_v2());
    let common = [("shop/common.proto", "shop-common", 1)];
    registry.add_protobuf(3, PROTO_V1, &common);
    registry.add_protobuf(4, PROTO_V2, &common);
    registry.add_subject("shop-common", 1, PROTO_COMMON);
    let group = "g-events";
    let cfg = config(&broker.bootstrap, &redis.url(), &registry.url, group);
    let now_ms = Utc::now().timestamp_millis();
    let (events, records) = stream(MAX + TAIL, now_ms);
    let records = Arc::new(records);
    let record = |records: &Arc<Vec<Record>>| {
        let records = records.clone();
        move |i: u64| {
            let r = &records[i as usize];
            Record {
                topic: r.topic.clone(),
                partition: r.partition,
                payload: r.payload.clone(),
            }
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (producer, sent) = topics::produce_until(
        &broker.bootstrap,
        0..MAX,
        RATE,
        stop.clone(),
        record(&records),
    );

    let seed: u64 = rand::random();
    eprintln!("events crash loop seed {seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut conn = topics::redis_conn(&redis.url());
    let (mut kills, mut mid_flush, mut consuming) = (0, 0, 0);
    let skips_allowed = [("json_errors", "filtered")];
    while kills < 20 && !producer.is_finished() {
        let from = applied(&mut conn, group, parts());
        let mut t = TallyProcess::start(&cfg, "events");
        if t.wait_working() {
            consuming += 1;
            // A process skips at most the excluded events between where it started and what
            // has been produced.
            if let Some(scrape) = no_skips(&t, &skips_allowed) {
                let produced = sent.load(Ordering::Relaxed) as usize;
                let bound = filtered_from(&events[..produced], &from);
                let skipped = scrape.value(FILTERED).unwrap_or(0.0) as u64;
                assert!(skipped <= bound, "{skipped} filtered, at most {bound}");
            }
        }
        if kill_somewhere(&mut t, kills, &mut rng, &mut conn) {
            mid_flush += 1;
        }
        kills += 1;
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    let looped = sent.load(Ordering::Relaxed);
    let n = looped + TAIL;
    let events = &events[..n as usize];

    // The last replica: the tail is produced while it runs; it catches up, and its filtered
    // count is exactly the excluded events from where Redis said it should start.
    let from = applied(&mut conn, group, parts());
    let mut last = TallyProcess::start(&cfg, "events-final");
    let (tail, _) = topics::produce(&broker.bootstrap, looped..n, 2_000, record(&records));
    tail.join().unwrap();
    let mut ends = BTreeMap::new();
    for e in events {
        ends.insert((e.topic, e.partition), e.offset + 1);
    }
    topics::catch_up(&last, &mut conn, group, &ends);
    no_skips(&last, &skips_allowed).expect("the final process answers");
    let skipped = last.metric(FILTERED).unwrap_or(0.0) as u64;
    let want_skipped = filtered_from(events, &from);
    last.drain();

    let want = truth(events);
    let got = dump(&mut conn, "ec:*");
    let wrong = mismatches(&got, &want);
    eprintln!(
        "events crash loop: {kills} SIGKILLs ({consuming} while consuming, {mid_flush} inside a held flush), {n} events over 3 topics (Avro, Protobuf, JSON), {} keys, {wrong} wrong; the final process filtered {skipped} of {want_skipped}",
        want.len()
    );
    assert!(kills >= 20, "the producer ran out of events ({MAX}) first");
    assert_eq!(wrong, 0);
    assert!(
        want_skipped >= TAIL / 8,
        "the tail gave it events to filter"
    );
    assert_eq!(skipped, want_skipped, "filtered events counted exactly");
    for prefix in ["ec:r:", "ec:m:", "ec:e:"] {
        assert!(want.keys().any(|k| k.starts_with(prefix)), "{prefix}");
    }
}
