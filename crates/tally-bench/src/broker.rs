//! Role `broker`: librdkafka's mock cluster in its own process; and producing a workload to it.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use tally_testkit::gen::EventGen;

use crate::child::wait_for_stdin_eof;
use crate::proc_stats::unix_ms;
use crate::Variant;

pub fn role_broker(topics: &[String]) -> anyhow::Result<()> {
    let mock = rdkafka::mocking::MockCluster::new(1).context("mock cluster")?;
    for t in topics {
        let (name, parts) = t.split_once(':').context("topic is name:partitions")?;
        mock.create_topic(name, parts.parse()?, 1)?;
    }
    println!("{}", mock.bootstrap_servers());
    std::io::stdout().flush()?;
    wait_for_stdin_eof();
    Ok(())
}

/// Produce `per_partition` events to every partition of `topic` (round-robin, no key: each
/// key's events are spread over all partitions, the harder case for pre-aggregation).
///
/// Batches are made as large as librdkafka allows (1 MB): the mock broker answers a fetch with
/// one stored batch per partition, where a real broker returns up to `max.partition.fetch.bytes`
/// (1 MiB); with 1 MB batches both hand the consumer the same amount per fetch.
pub fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    per_partition: i64,
    v: &Variant,
    compression: &str,
) -> anyhow::Result<f64> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "200")
        .set("compression.type", compression)
        .set("batch.size", "1000000")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .context("producer")?;
    let mut gen = EventGen::new(v.keys, v.skew, v.seed);
    let mut buf = Vec::with_capacity(128);
    let total = per_partition * i64::from(partitions);
    let started = Instant::now();
    let mut now = unix_ms();
    for i in 0..total {
        if i % 1024 == 0 {
            now = unix_ms();
            producer.poll(Duration::ZERO);
        }
        EventGen::write_json(&mut buf, gen.next_key(), now);
        let partition = (i % i64::from(partitions)) as i32;
        loop {
            let record = BaseRecord::<(), [u8]>::to(topic)
                .partition(partition)
                .payload(&buf[..])
                .timestamp(now);
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => bail!("produce: {e}"),
            }
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("producer flush")?;
    let secs = started.elapsed().as_secs_f64();
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    for p in 0..partitions {
        let (lo, hi) = probe.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if lo != 0 || hi != per_partition {
            bail!(
                "partition {p} of {topic} holds offsets [{lo}, {hi}), expected [0, {per_partition}): \
                 the mock broker keeps only 5 MiB per partition; use fewer --per-partition"
            );
        }
    }
    Ok(total as f64 / secs)
}
