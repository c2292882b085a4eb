//! The soak's steady load, each with its ground truth: events on the stream (1-minute windows)
//! and request-path traffic (hits on a 1-minute counter, rate-limit decisions).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use tally_testkit::http;

/// Expected value of every key written, by Redis key.
pub type Truth = Arc<Mutex<BTreeMap<String, i64>>>;

fn minute(ts_ms: i64) -> String {
    Utc.timestamp_millis_opt(ts_ms)
        .single()
        .map(|t| t.format("%Y%m%d%H%M").to_string())
        .unwrap_or_default()
}

/// Stream events' key, as tally's template `soak:s:{app_id}:{device_id}:{yyyyMMddHHmm}` makes it.
fn stream_key(app: u64, device: u64, ts_ms: i64) -> String {
    format!("soak:s:a{app}:d{device}:{}", minute(ts_ms))
}

/// `soak_hits`' key (`soak:h:{user}:{yyyyMMddHHmm}`), which events and hits both add to.
fn hits_key(user: u64, ts_ms: i64) -> String {
    format!("soak:h:u{user}:{}", minute(ts_ms))
}

/// When a key of either counter expires (window end + 2 m retention), from the minute it names.
pub fn expires_at_ms(key: &str) -> Option<i64> {
    let minute = key.rsplit(':').next()?;
    let start = chrono::NaiveDateTime::parse_from_str(&format!("{minute}00"), "%Y%m%d%H%M%S")
        .ok()?
        .and_utc()
        .timestamp_millis();
    Some(start + 3 * 60_000)
}

/// Produce `rate` events/s until `stop`; returns the events produced per partition.
pub fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    rate: u64,
    stop: Arc<AtomicBool>,
    truth: Truth,
    sent: Arc<AtomicU64>,
) -> anyhow::Result<Vec<i64>> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()?;
    let start = Instant::now();
    let mut per_partition = vec![0i64; partitions as usize];
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        if (start.elapsed().as_secs_f64() * rate as f64) < i as f64 {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let (app, device) = (i % 4, (i * 7) % 25);
        let ts = chrono::Utc::now().timestamp_millis();
        // `user` also feeds `soak_hits`: one counter written by both paths.
        let user = i % 50;
        let payload =
            format!(r#"{{"app_id":"a{app}","device_id":"d{device}","user":"u{user}","ts":{ts}}}"#);
        let partition = (i % partitions as u64) as i32;
        let mut rec = BaseRecord::<(), str>::to(topic)
            .partition(partition)
            .payload(&payload);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    std::thread::sleep(Duration::from_millis(5));
                    rec = r;
                }
            }
        }
        {
            let mut truth = truth.lock().unwrap();
            *truth.entry(stream_key(app, device, ts)).or_insert(0) += 1;
            *truth.entry(hits_key(user, ts)).or_insert(0) += 1;
        }
        per_partition[partition as usize] += 1;
        i += 1;
        sent.store(i, Ordering::Relaxed);
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(per_partition)
}

/// Send `rate` requests/s to tally's request path until `stop`: a hit on `soak_hits` (every
/// other one with an idempotency key, every tenth of those sent twice) and a rate-limit decision.
/// The truth of a hit is the key tally answers with; errors are counted, not added.
pub fn requests(
    port: u16,
    rate: u64,
    stop: Arc<AtomicBool>,
    truth: Truth,
    done: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let client = http::Client::new(Duration::from_secs(10));
    let start = Instant::now();
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        if (start.elapsed().as_secs_f64() * rate as f64) < i as f64 {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let user = format!("u{}", i % 50);
        let idem = if i.is_multiple_of(2) {
            format!(r#","idempotency_key":"req-{i}""#)
        } else {
            String::new()
        };
        let body = format!(
            r#"{{"counter":"soak_hits","dimensions":{{"user":"{user}"}},"value":1{idem}}}"#
        );
        let sends = if i.is_multiple_of(20) { 2 } else { 1 };
        for attempt in 0..sends {
            match client.post_json(port, "/v1/hit", &body) {
                Ok(a) if a.status == 200 => {
                    let reply: serde_json::Value =
                        serde_json::from_str(&a.body).unwrap_or_default();
                    let duplicate = reply["duplicate"].as_bool().unwrap_or(false);
                    if duplicate != (attempt == 1) {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("soak: hit {i} attempt {attempt}: duplicate={duplicate}");
                    }
                    if let (false, Some(key)) = (duplicate, reply["key"].as_str()) {
                        *truth.lock().unwrap().entry(key.to_string()).or_insert(0) += 1;
                    }
                }
                other => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("soak: hit {i}: {other:?}");
                }
            }
        }
        let limit = format!(r#"{{"policies":["soak_gcra"],"subject":"{user}","cost":1}}"#);
        match client.post_json(port, "/v1/limit", &limit) {
            Ok(a) if a.status == 200 || a.status == 429 => {}
            other => {
                errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("soak: limit {i}: {other:?}");
            }
        }
        i += 1;
        done.store(i, Ordering::Relaxed);
    }
}
