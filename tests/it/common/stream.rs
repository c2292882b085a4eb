//! A deterministic event stream over several partitions, windows and counters, with its ground
//! truth computed independently of tally's own window and key code.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Datelike, TimeZone, Utc};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

const HOUR: i64 = 3_600_000;

/// Counters used by the exactly-once tests (TOML, appended to a config).
pub const COUNTERS: &str = r#"
[decode]
time_field = "ts"

[[counters]]
name = "flow"
dimensions = ["app_id", "device_id", "ip"]
key = "eo:flow:{app_id}:{device_id}:{ip}:{yyyyMMddHH}"
window = "1h"
retention = "1d"

[[counters]]
name = "daily"
dimensions = ["app_id"]
key = "eo:daily:{app_id}:{yyyyMMdd}"
window = "1d"
timezone = "Asia/Shanghai"
retention = "1d"

[[counters]]
name = "minute"
dimensions = ["ip"]
key = "eo:min:{ip}:{yyyyMMddHHmm}"
window = "1m"
retention = "1d"

[[counters]]
name = "bytes"
dimensions = ["app_id"]
key = "eo:bytes:{app_id}:{yyyyMMddHH}"
window = "1h"
retention = "1d"
value_field = "bytes"

[[counters]]
name = "uniq"
kind = "distinct"
distinct = "exact"
member = "device_id"
dimensions = ["app_id"]
key = "ek:uniq:{app_id}:{yyyyMMddHH}"
window = "1h"
retention = "1d"

[[counters]]
name = "uniq_hll"
kind = "distinct"
member = "device_id"
dimensions = ["app_id"]
key = "ek:hll:{app_id}:{yyyyMMddHH}"
window = "1h"
retention = "1d"

[[counters]]
name = "top"
kind = "leaderboard"
member = "device_id"
value_field = "bytes"
dimensions = ["app_id"]
key = "ek:top:{app_id}:{yyyyMMddHH}"
window = "1h"
retention = "1d"

[[counters]]
name = "hashed"
storage = "hash"
hash_key = "ek:h:{yyyyMMddHH}"
dimensions = ["app_id", "ip"]
key = "ek:hc:{app_id}:{ip}:{yyyyMMddHH}"
window = "1h"
retention = "1d"
"#;

/// The stream: `n` events over `partitions`, event times spread over the 3 hours before `now_ms`.
#[derive(Clone, Copy)]
pub struct Stream {
    pub n: u64,
    pub partitions: i32,
    pub now_ms: i64,
}

pub struct Event {
    pub partition: i32,
    pub payload: String,
    pub(super) app: String,
    pub(super) device: String,
    pub(super) ip: String,
    pub(super) ts: i64,
    pub(super) bytes: i64,
}

impl Event {
    pub fn app(&self) -> &str {
        &self.app
    }
    pub fn ip(&self) -> &str {
        &self.ip
    }
    pub fn device(&self) -> &str {
        &self.device
    }
    pub fn bytes(&self) -> i64 {
        self.bytes
    }
    pub fn ts(&self) -> i64 {
        self.ts
    }
}

impl Stream {
    pub fn event(&self, i: u64) -> Event {
        let i = i as i64;
        let app = format!("app{}", i % 7);
        let device = format!("dev{}", (i * 7919) % 1000);
        let ip = format!("10.0.{}.{}", i % 3, i % 50);
        let ts = self.now_ms - (i % 3) * HOUR - (i * 37_123) % HOUR;
        let bytes = i % 100 + 1;
        let payload = format!(
            r#"{{"app_id":"{app}","device_id":"{device}","ip":"{ip}","ts":{ts},"bytes":{bytes}}}"#
        );
        Event {
            partition: (i % self.partitions as i64) as i32,
            payload,
            app,
            device,
            ip,
            ts,
            bytes,
        }
    }

    pub fn truth(&self) -> BTreeMap<String, i64> {
        let shanghai = chrono_tz::Asia::Shanghai;
        let mut want = BTreeMap::new();
        for i in 0..self.n {
            let e = self.event(i);
            let t = Utc.timestamp_millis_opt(e.ts).unwrap();
            let hour = t.format("%Y%m%d%H").to_string();
            *want
                .entry(format!("eo:flow:{}:{}:{}:{hour}", e.app, e.device, e.ip))
                .or_insert(0) += 1;
            let local = t.with_timezone(&shanghai);
            let day = format!("{:04}{:02}{:02}", local.year(), local.month(), local.day());
            *want.entry(format!("eo:daily:{}:{day}", e.app)).or_insert(0) += 1;
            *want
                .entry(format!("eo:min:{}:{}", e.ip, t.format("%Y%m%d%H%M")))
                .or_insert(0) += 1;
            *want
                .entry(format!("eo:bytes:{}:{hour}", e.app))
                .or_insert(0) += e.bytes;
        }
        want
    }

    /// Produce the stream at `rate` events/s on a background thread; the counter tracks progress.
    pub fn produce(
        self,
        bootstrap: &str,
        topic: &str,
        rate: u64,
    ) -> (std::thread::JoinHandle<Vec<i64>>, Arc<AtomicU64>) {
        self.produce_with(bootstrap, topic, rate, &[])
    }

    /// [`Stream::produce`] with more librdkafka properties (idempotence, SASL credentials).
    pub fn produce_with(
        self,
        bootstrap: &str,
        topic: &str,
        rate: u64,
        properties: &[(&str, &str)],
    ) -> (std::thread::JoinHandle<Vec<i64>>, Arc<AtomicU64>) {
        let open = Arc::new(AtomicU64::new(u64::MAX));
        self.produce_gated(bootstrap, topic, rate, properties, open)
    }

    /// [`Stream::produce_with`] that sends event `i` only once `i < open` (the caller raises
    /// `open` to let the rest go).
    pub fn produce_gated(
        self,
        bootstrap: &str,
        topic: &str,
        rate: u64,
        properties: &[(&str, &str)],
        open: Arc<AtomicU64>,
    ) -> (std::thread::JoinHandle<Vec<i64>>, Arc<AtomicU64>) {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "1000000");
        for (k, v) in properties {
            config.set(*k, *v);
        }
        let producer: ThreadedProducer<DefaultProducerContext> = config.create().expect("producer");
        let topic = topic.to_string();
        let sent = Arc::new(AtomicU64::new(0));
        let progress = sent.clone();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut per_partition = vec![0i64; self.partitions as usize];
            for i in 0..self.n {
                while i >= open.load(Ordering::Relaxed)
                    || (start.elapsed().as_secs_f64() * rate as f64) < i as f64
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let e = self.event(i);
                let mut rec = BaseRecord::<(), str>::to(&topic)
                    .partition(e.partition)
                    .payload(&e.payload);
                loop {
                    match producer.send(rec) {
                        Ok(()) => break,
                        Err((_, r)) => {
                            std::thread::sleep(Duration::from_millis(5));
                            rec = r;
                        }
                    }
                }
                per_partition[e.partition as usize] += 1;
                progress.store(i + 1, Ordering::Relaxed);
            }
            producer
                .flush(Duration::from_secs(60))
                .expect("all produced");
            per_partition
        });
        (handle, sent)
    }
}

/// Compare Redis with the truth, key for key; returns (keys compared, mismatches) and prints
/// the first few differences.
pub fn compare(conn: &mut redis::Connection, truth: &BTreeMap<String, i64>) -> (usize, usize) {
    let keys: Vec<String> = redis::cmd("KEYS").arg("eo:*").query(conn).unwrap();
    let mut got = BTreeMap::new();
    for chunk in keys.chunks(1000) {
        let values: Vec<i64> = redis::cmd("MGET").arg(chunk).query(conn).unwrap();
        got.extend(chunk.iter().cloned().zip(values));
    }
    let mut mismatches = 0;
    for (k, w) in truth {
        if got.get(k) != Some(w) {
            if mismatches < 10 {
                eprintln!("mismatch {k}: want {w}, got {:?}", got.get(k));
            }
            mismatches += 1;
        }
    }
    for k in got.keys() {
        if !truth.contains_key(k) {
            if mismatches < 10 {
                eprintln!("unexpected key {k}");
            }
            mismatches += 1;
        }
    }
    (truth.len(), mismatches)
}

/// Applied offsets in Redis for (group, topic, partition), shard 0.
pub fn applied(
    conn: &mut redis::Connection,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<i64> {
    (0..partitions)
        .map(|p| {
            redis::cmd("GET")
                .arg(format!("tally:applied:{group}:{topic}:{p}:0"))
                .query::<Option<i64>>(conn)
                .ok()
                .flatten()
                .unwrap_or(-1)
        })
        .collect()
}
