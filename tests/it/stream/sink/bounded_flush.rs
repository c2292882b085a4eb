//! A flush larger than one encoding chunk (`tally::stream::sink::CHUNK_KEYS`) is sent chunk after chunk
//! and still lands exactly: every key once, with its whole count.

use std::time::Duration;

use crate::common::{hourly, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_of_several_chunks_lands_every_key_exactly_once() {
    let mut h = Harness::new("chunks", 4);
    let keys = 2 * tally::stream::sink::CHUNK_KEYS + 5_000;
    let now = chrono::Utc::now().timestamp_millis();
    // Every key twice, in two partitions: merged calls add the pairs up.
    for i in 0..2 * keys {
        let payload = format!(
            r#"{{"app_id":"a{}","device_id":"d{}"}}"#,
            i % keys % 7,
            i % keys
        );
        h.produce((i % 4) as i32, payload.as_bytes(), Some(now));
    }
    h.flush_producer();
    let mut config = h.config("g-chunks", hourly("chunks"));
    // The whole backlog is read well within one interval: the flush after it holds every key.
    config.flush.interval = Duration::from_secs(5);
    let running = h.start(config);
    h.wait_applied("g-chunks", Duration::from_secs(120)).await;
    let flushes = running.metrics.sink.flush_keys.get_sample_count();
    let flushed = running.metrics.sink.flush_keys.get_sample_sum();
    running.stop().await;

    let got = h.dump("chunks:*");
    assert_eq!(got.len(), keys, "one counter key per key");
    assert!(
        got.values().all(|&v| v == 2),
        "every key counted twice, once"
    );
    assert!(
        flushed / flushes as f64 > tally::stream::sink::CHUNK_KEYS as f64,
        "some flush spanned several chunks ({flushed} keys in {flushes} flushes)"
    );
}
