//! Part 2, event-to-visible latency: tally running live while markers are produced.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use tally::config::Config;
use tally_testkit::gen::EventGen;

use crate::proc_stats::{percentile, unix_ms};
use crate::redis_stats::{flushall, redis_conn};
use crate::store::Store;
use crate::tally::{spawn_tally, Ctx, Scrape, Share};

/// The mock broker answers a fetch that finds no data only after the full `fetch.wait.max.ms`
/// (librdkafka default 500 ms), even if data arrives meanwhile; a real broker answers as soon as
/// data arrives. A short wait restores that behaviour for the live phase.
pub const LIVE_KAFKA_PROPERTIES: &str = r#""fetch.wait.max.ms" = "10""#;

#[derive(Debug, Default, Clone)]
pub struct Latency {
    pub markers: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub rate: f64,
    pub flush_p50: f64,
    pub flush_p99: f64,
    pub interval: f64,
}

pub fn phase_latency(ctx: &Ctx, topic: &str, secs: u64, rate: u64) -> anyhow::Result<Latency> {
    let mut conn = redis_conn(&ctx.redis_url)?;
    flushall(&mut conn)?;
    let (child, port, config_path) = spawn_tally(
        ctx,
        &Store::standalone(&ctx.redis_url),
        topic,
        "bench-live",
        "live",
        LIVE_KAFKA_PROPERTIES,
        Share {
            lanes: 1,
            partitions: i64::from(ctx.exe_args_partitions),
            merge: true,
        },
    )?;
    let _assigned: serde_json::Value = child.result(Duration::from_secs(60))?;

    // The poller looks for each marker's key every 2 ms and records when it appears.
    let (marker_tx, marker_rx) = mpsc::channel::<(String, Instant)>();
    let url = ctx.redis_url.clone();
    let base = Instant::now();
    let poller = std::thread::spawn(move || -> anyhow::Result<Vec<(f64, f64)>> {
        let mut conn = redis_conn(&url)?;
        let mut outstanding: Vec<(String, Instant)> = Vec::new();
        let mut seen = Vec::new();
        let mut closed_at: Option<Instant> = None;
        loop {
            loop {
                match marker_rx.try_recv() {
                    Ok(m) => outstanding.push(m),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed_at.get_or_insert_with(Instant::now);
                        break;
                    }
                }
            }
            if !outstanding.is_empty() {
                let mut pipe = redis::pipe();
                for (key, _) in &outstanding {
                    pipe.cmd("EXISTS").arg(key);
                }
                let found: Vec<i64> = pipe.query(&mut conn)?;
                let now = Instant::now();
                let mut i = 0;
                outstanding.retain(|(_, sent)| {
                    let keep = found[i] == 0;
                    if !keep {
                        seen.push(((*sent - base).as_secs_f64(), (now - *sent).as_secs_f64()));
                    }
                    i += 1;
                    keep
                });
            }
            if closed_at
                .is_some_and(|c| outstanding.is_empty() || c.elapsed() > Duration::from_secs(10))
            {
                if !outstanding.is_empty() {
                    bail!("{} markers never became visible", outstanding.len());
                }
                return Ok(seen);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });

    // Background load in large batches (the mock broker scans a partition's batches linearly
    // on every fetch, so many tiny batches would slow it down over time); markers unbatched, so
    // their latency starts when they are produced.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &ctx.bootstrap)
        .set("linger.ms", "50")
        .create()?;
    let marker_producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &ctx.bootstrap)
        .set("linger.ms", "0")
        .create()?;
    let mut gen = EventGen::new(100_000, 1.0, 7);
    let mut buf = Vec::with_capacity(128);
    let started = Instant::now();
    let warmup = Duration::from_secs(2);
    let parts = i64::from(ctx.exe_args_partitions);
    let (mut sent, mut markers) = (0u64, 0u64);
    let mut next_marker = started;
    while started.elapsed() < Duration::from_secs(secs) {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let now = unix_ms();
        while sent < due {
            EventGen::write_json(&mut buf, gen.next_key(), now);
            let record = BaseRecord::<(), [u8]>::to(topic)
                .partition((sent as i64 % parts) as i32)
                .payload(&buf[..])
                .timestamp(now);
            if producer.send(record).is_err() {
                producer.poll(Duration::from_millis(1));
                continue;
            }
            sent += 1;
        }
        if Instant::now() >= next_marker {
            next_marker += Duration::from_millis(10);
            let payload = format!(
                r#"{{"app_id":"mark","device_id":"m{markers}","ip":"0.0.0.0","ts":{now},"bytes":1}}"#
            );
            let hour = chrono::DateTime::from_timestamp_millis(now)
                .context("clock")?
                .format("%Y%m%d%H");
            let key = format!("flow:count:mark:m{markers}:0.0.0.0:{hour}");
            let record = BaseRecord::<(), str>::to(topic)
                .partition((markers as i64 % parts) as i32)
                .payload(payload.as_str())
                .timestamp(now);
            let sent_at = Instant::now();
            if marker_producer.send(record).is_ok() {
                if started.elapsed() > warmup {
                    let _ = marker_tx.send((key, sent_at));
                }
                markers += 1;
            }
        }
        producer.poll(Duration::ZERO);
        marker_producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_micros(500));
    }
    producer.flush(Duration::from_secs(10))?;
    marker_producer.flush(Duration::from_secs(10))?;
    drop(marker_tx);
    let produce_secs = started.elapsed().as_secs_f64();
    let timeline = poller
        .join()
        .map_err(|_| anyhow::anyhow!("poller panicked"))??;
    if std::env::var_os("TALLY_BENCH_DEBUG").is_some() {
        for (at, l) in &timeline {
            eprintln!("marker sent at {at:.3}s visible after {:.1} ms", l * 1e3);
        }
    }
    let mut seen: Vec<f64> = timeline.iter().map(|t| t.1).collect();
    let scrape = Scrape::get(port)?;
    child.finish(Duration::from_secs(60));
    let _ = std::fs::remove_file(config_path);
    seen.sort_by(f64::total_cmp);
    Ok(Latency {
        markers: seen.len(),
        p50: percentile(&seen, 0.5),
        p99: percentile(&seen, 0.99),
        max: seen.last().copied().unwrap_or(f64::NAN),
        rate: (sent + markers) as f64 / produce_secs,
        flush_p50: scrape.quantile("tally_flush_duration_seconds", 0.5),
        flush_p99: scrape.quantile("tally_flush_duration_seconds", 0.99),
        interval: Config::default().flush.interval.as_secs_f64(),
    })
}
