//! `tally produce` (a load generator) and `tally mock-broker` (a stand-alone Kafka-protocol
//! broker for tests and benchmarks).

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, Producer, ThreadedProducer,
};
use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use crate::gen::EventGen;

/// Options of `tally produce`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProduceArgs {
    /// Kafka bootstrap servers.
    #[arg(long, default_value = "localhost:9092")]
    pub brokers: String,
    /// Topic to produce to.
    #[arg(long, default_value = "events")]
    pub topic: String,
    /// Target events per second (0 = as fast as possible).
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Stop after this many events (0 = until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Distinct devices (key cardinality).
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Zipf exponent of the key distribution (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    pub skew: f64,
    /// Random seed, for reproducible streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Extra librdkafka producer properties, as key=value.
    #[arg(long = "property", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not key=value"))
}

/// Produce synthetic events until `count` or `shutdown`, reporting the rate each second.
pub async fn run(args: ProduceArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || produce_blocking(&args, &shutdown)).await?
}

fn produce_blocking(args: &ProduceArgs, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000");
    for (k, v) in &args.properties {
        cc.set(k, v);
    }
    let producer: ThreadedProducer<DefaultProducerContext> =
        cc.create().context("kafka producer")?;
    let mut gen = EventGen::new(args.keys, args.skew, args.seed);
    let mut buf = Vec::with_capacity(128);
    let start = Instant::now();
    let mut report = (Instant::now(), 0u64);
    let mut sent: u64 = 0;
    while !shutdown.is_cancelled() && (args.count == 0 || sent < args.count) {
        let due = if args.rate == 0 {
            sent + 1000
        } else {
            (start.elapsed().as_secs_f64() * args.rate as f64) as u64
        };
        let due = if args.count > 0 {
            due.min(args.count)
        } else {
            due
        };
        if sent >= due {
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = chrono::Utc::now().timestamp_millis();
        while sent < due {
            let k = gen.next_key();
            EventGen::write_json(&mut buf, k, now);
            let key = k.to_le_bytes();
            match producer.send(BaseRecord::to(&args.topic).key(&key[..]).payload(&buf[..])) {
                Ok(()) => sent += 1,
                Err(_) => {
                    // Local queue full: let librdkafka drain it.
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
        if report.0.elapsed() >= Duration::from_secs(1) {
            let rate = (sent - report.1) as f64 / report.0.elapsed().as_secs_f64();
            eprintln!("produced {sent} events ({rate:.0}/s)");
            report = (Instant::now(), sent);
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing produced events")?;
    eprintln!(
        "produced {sent} events in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Run a mock Kafka cluster with `topics` ("name:partitions") until `shutdown`.
/// Prints `bootstrap=<host:port>` on stdout once it is ready.
///
/// `initial_rebalance_delay` is how long a new (empty) consumer group waits for more members
/// before its first rebalance (Kafka's `group.initial.rebalance.delay.ms`, 3 s by default).
/// The mock expires a member whose `JoinGroup` waits longer than its `session.timeout.ms`
/// and never answers it (that client then waits for `max.poll.interval.ms`): consumers with a
/// session timeout shorter than this delay need a shorter delay.
pub async fn mock_broker(
    topics: &[String],
    initial_rebalance_delay: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // The client owns the cluster (`test.mock.num.brokers`), so its handle reaches the
    // cluster's settings that `MockCluster` does not wrap.
    let client: BaseProducer = ClientConfig::new()
        .set("test.mock.num.brokers", "1")
        .create()
        .context("starting the mock cluster")?;
    let mock = client
        .client()
        .mock_cluster()
        .context("starting the mock cluster")?;
    let delay_ms = i32::try_from(initial_rebalance_delay.as_millis())
        .context("--initial-rebalance-delay is too long")?;
    // SAFETY: the handle is the live client's own; the cluster lives as long as the client,
    // which outlives this call.
    unsafe {
        let cluster = rdkafka::bindings::rd_kafka_handle_mock_cluster(client.client().native_ptr());
        anyhow::ensure!(!cluster.is_null(), "the client has no mock cluster");
        rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, delay_ms);
    }
    for t in topics {
        let (name, parts) = t.split_once(':').unwrap_or((t.as_str(), "1"));
        let parts: i32 = parts
            .parse()
            .with_context(|| format!("bad partition count in `{t}`"))?;
        mock.create_topic(name, parts, 1)?;
    }
    println!("bootstrap={}", mock.bootstrap_servers());
    std::io::stdout().flush()?;
    shutdown.cancelled().await;
    Ok(())
}
