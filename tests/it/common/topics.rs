//! Crash tests over several topics (`[[kafka.topics]]`): a producer of generated records to
//! chosen topic-partitions at a fixed rate, each topic-partition's applied offset, every key
//! under a prefix against a ground truth, and `tally <command>` on a config text.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

use super::process::TallyProcess;

/// One record to produce.
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub payload: Vec<u8>,
}

/// Produce `record(i)` for every `i` of `range` at `rate` per second on a thread; `sent`
/// counts the records handed to the producer (it flushes them all before the thread ends).
pub fn produce(
    bootstrap: &str,
    range: std::ops::Range<u64>,
    rate: u64,
    record: impl Fn(u64) -> Record + Send + 'static,
) -> (std::thread::JoinHandle<()>, Arc<AtomicU64>) {
    produce_until(bootstrap, range, rate, Arc::default(), record)
}

/// As [`produce`], stopping early (after the record in hand) once `stop` is set.
pub fn produce_until(
    bootstrap: &str,
    range: std::ops::Range<u64>,
    rate: u64,
    stop: Arc<AtomicBool>,
    record: impl Fn(u64) -> Record + Send + 'static,
) -> (std::thread::JoinHandle<()>, Arc<AtomicU64>) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let sent = Arc::new(AtomicU64::new(range.start));
    let progress = sent.clone();
    let handle = std::thread::spawn(move || {
        let start = Instant::now();
        let first = range.start;
        for i in range {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            while (start.elapsed().as_secs_f64() * rate as f64) < (i - first) as f64 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let r = record(i);
            let mut rec = BaseRecord::<(), [u8]>::to(&r.topic)
                .partition(r.partition)
                .payload(&r.payload);
            while let Err((_, back)) = producer.send(rec) {
                std::thread::sleep(Duration::from_millis(5));
                rec = back;
            }
            progress.store(i + 1, Ordering::Relaxed);
        }
        producer
            .flush(Duration::from_secs(60))
            .expect("all produced");
    });
    (handle, sent)
}

pub fn redis_conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap()
}

/// Redis' applied offset of every (topic, partition) of `parts` (shard 0; -1: none).
pub fn applied<'a>(
    conn: &mut redis::Connection,
    group: &str,
    parts: impl IntoIterator<Item = (&'a str, i32)>,
) -> BTreeMap<(&'a str, i32), i64> {
    parts
        .into_iter()
        .map(|(t, p)| {
            let v: Option<i64> = redis::cmd("GET")
                .arg(format!("tally:applied:{group}:{t}:{p}:0"))
                .query(conn)
                .unwrap();
            ((t, p), v.unwrap_or(-1))
        })
        .collect()
}

/// Every key matching `pattern` and its value.
pub fn dump(conn: &mut redis::Connection, pattern: &str) -> BTreeMap<String, i64> {
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    let mut got = BTreeMap::new();
    for chunk in keys.chunks(500) {
        let values: Vec<i64> = redis::cmd("MGET").arg(chunk).query(conn).unwrap();
        got.extend(chunk.iter().cloned().zip(values));
    }
    got
}

/// Keys that differ from the truth (printing the first few).
pub fn mismatches(got: &BTreeMap<String, i64>, want: &BTreeMap<String, i64>) -> usize {
    let mut wrong = 0;
    let keys: BTreeSet<&String> = got.keys().chain(want.keys()).collect();
    for k in keys {
        if got.get(k) != want.get(k) {
            if wrong < 10 {
                eprintln!("mismatch {k}: want {:?}, got {:?}", want.get(k), got.get(k));
            }
            wrong += 1;
        }
    }
    wrong
}

/// Let `last` run until Redis has applied `ends` (every topic-partition's end offset).
pub fn catch_up(
    last: &TallyProcess,
    conn: &mut redis::Connection,
    group: &str,
    ends: &BTreeMap<(&str, i32), i64>,
) {
    let produced: Vec<i64> = ends.values().copied().collect();
    last.catch_up(&produced, Duration::from_secs(90), || {
        applied(conn, group, ends.keys().copied())
            .into_values()
            .collect()
    });
}

/// `tally <command> --config <file> <args…>` (the file holding `config`): its stdout, stderr
/// and status.
pub fn tally_cli(config: &str, args: &[&str]) -> (String, String, std::process::ExitStatus) {
    let path = std::env::temp_dir().join(format!(
        "tally-topics-cli-{}-{}.toml",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg(args[0])
        .arg("--config")
        .arg(&path)
        .args(&args[1..])
        .env("TALLY_LOG", "warn")
        .output()
        .expect("run tally");
    let _ = std::fs::remove_file(&path);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status,
    )
}

/// Nothing `t` consumed was bad input, and no counter skipped an event except by a
/// `(counter, reason)` of `allowed`. Returns the scrape (None: `t` did not answer).
pub fn no_skips(
    t: &TallyProcess,
    allowed: &[(&str, &str)],
) -> Option<tally_testkit::scrape::Scrape> {
    let scrape = tally_testkit::scrape::Scrape::get(t.port, Duration::from_secs(5))?;
    let counted = |s: &&tally_testkit::scrape::Sample| {
        let family = ["tally_events_skipped_total", "tally_decode_errors_total"];
        let label = |name: &str| s.labels.get(name).map(String::as_str).unwrap_or("");
        let excused = s.name == "tally_events_skipped_total"
            && allowed.contains(&(label("counter"), label("reason")));
        family.contains(&s.name.as_str()) && s.value > 0.0 && !excused
    };
    let skipped: Vec<_> = scrape.samples.iter().filter(counted).collect();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert!(scrape.value("tally_messages_consumed_total").unwrap_or(0.0) > 0.0);
    Some(scrape)
}
