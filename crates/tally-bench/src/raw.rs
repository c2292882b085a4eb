//! Role `raw` (part 1): a plain rdkafka consumer that reads, or reads and parses, the topic.

use std::time::{Duration, Instant};

use anyhow::bail;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use tally::app::kafka_client_config;
use tally::config::Config;

use crate::proc_stats::{cpu_self, proc_status_mb};

/// The event as a typical consumer parses it: borrowed strings, typed numbers.
#[derive(Deserialize)]
pub struct RawEvent<'a> {
    #[serde(borrow)]
    pub app_id: &'a str,
    #[serde(borrow)]
    pub device_id: &'a str,
    #[serde(borrow)]
    pub ip: &'a str,
    pub ts: i64,
    pub bytes: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RawResult {
    pub messages: u64,
    /// From `assign` to the last message.
    pub secs: f64,
    /// From the first message to the last.
    pub secs_from_first: f64,
    pub cpu: f64,
    pub parse_errors: u64,
    pub checksum: i64,
    pub peak_rss_mb: f64,
    /// CPU of the broker process meanwhile (filled in by the parent).
    #[serde(default)]
    pub broker_cpu: f64,
    /// This process' CPU from its start (client creation and group join included).
    #[serde(default)]
    pub process_cpu: f64,
}

pub fn role_raw(
    brokers: &str,
    topic: &str,
    partitions: i32,
    expect: u64,
    parse: bool,
    group: Option<&str>,
    properties: &[String],
) -> anyhow::Result<()> {
    let mut kafka = Config::default().kafka;
    kafka.brokers = brokers.to_string();
    kafka.topic = topic.to_string();
    kafka.group_id = group.map_or_else(|| format!("raw-{}", std::process::id()), str::to_string);
    for p in properties {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--property {p}: expected key=value"))?;
        kafka.properties.insert(k.to_string(), v.to_string());
    }
    // The very settings tally uses (fetch.queue.backoff.ms=10 among them).
    let consumer: BaseConsumer = kafka_client_config(&kafka).create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        // An explicit offset, as tally assigns (no offset lookup first).
        tpl.add_partition_offset(topic, p, Offset::Offset(0))?;
    }
    let cpu0 = cpu_self();
    let t0 = Instant::now();
    match group {
        // A group member, as a consumer service is: it reads from the start (a new group).
        Some(_) => consumer.subscribe(&[topic])?,
        None => consumer.assign(&tpl)?,
    }
    let (mut n, mut errors, mut checksum) = (0u64, 0u64, 0i64);
    let mut first = None;
    while n < expect {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                first.get_or_insert_with(Instant::now);
                n += 1;
                let payload = m.payload().unwrap_or_default();
                if parse {
                    match serde_json::from_slice::<RawEvent>(payload) {
                        Ok(e) => {
                            let lens = e.app_id.len() + e.device_id.len() + e.ip.len();
                            checksum = checksum.wrapping_add(e.ts ^ e.bytes ^ lens as i64);
                        }
                        Err(_) => errors += 1,
                    }
                } else {
                    checksum = checksum.wrapping_add(payload.len() as i64);
                }
            }
            Some(Err(e)) => eprintln!("consume error: {e}"),
            None if t0.elapsed() > Duration::from_secs(600) => bail!("raw consumer stalled at {n}"),
            None => {}
        }
    }
    let result = RawResult {
        messages: n,
        secs: t0.elapsed().as_secs_f64(),
        secs_from_first: first.map_or(f64::NAN, |f| f.elapsed().as_secs_f64()),
        cpu: cpu_self() - cpu0,
        parse_errors: errors,
        checksum,
        peak_rss_mb: proc_status_mb(None, "VmHWM"),
        broker_cpu: 0.0,
        process_cpu: cpu_self(),
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}
