//! `tally demo`: the whole pipeline on local parts — an in-process Kafka-protocol broker
//! (librdkafka's mock cluster), a synthetic producer, a local `redis-server` — with a live view.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use tokio_util::sync::CancellationToken;

use tally::app::Tally;
use tally::config::Config;
use tally::ops::metrics::Metrics;
use tally_testkit::gen::EventGen;
use tally_testkit::local_redis::LocalRedis;

/// Demo knobs from the command line.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Events per second produced.
    pub rate: u64,
    /// Partitions of the demo topic.
    pub partitions: i32,
    /// Distinct device keys.
    pub keys: u64,
    /// Stop after this long (None: until Ctrl-C).
    pub duration: Option<Duration>,
    /// The loopback port the configuration named for Redis (the example's 6379): the demo's
    /// redis-server listens there when it is free, so that the CLI examples, which read the
    /// same file, reach it.
    pub redis_port: Option<u16>,
}

/// Run the demo until `shutdown` or the duration ends.
pub async fn run(
    mut config: Config,
    opts: DemoOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let _redis = start_local_redis(&mut config, opts.redis_port)?;
    let _mock = start_broker(&mut config, &opts)?;

    let produced = Arc::new(AtomicU64::new(0));
    let stop_producer = shutdown.child_token();
    let producer = spawn_producer(&config, &opts, produced.clone(), stop_producer.clone())?;

    // Its own limit beside the configuration's, so that the traffic it drives leaves the
    // examples' limits alone.
    let demo = demo_limit();
    let traffic = demo.name.clone();
    if !config.request.limits.iter().any(|l| l.name == demo.name) {
        config.request.limits.push(demo);
    }
    if config.counters.iter().all(|c| c.filter.is_none()) {
        config.counters.push(demo_filtered_counter());
    }
    let _limits_dir = demo_rls(&mut config)?;
    let model = tally::config::Model::compile(config.clone())?;
    let tally = Tally::new(model.clone());
    let metrics = tally.metrics.clone();
    let run_token = shutdown.child_token();
    let task = tokio::spawn(tally.run(run_token.clone()));
    let requests = tally::api::primitives::Primitives::new(
        &model,
        tally::app::request_client(&model)?,
        metrics.clone(),
    )?;
    tokio::spawn(request_traffic(requests, traffic, run_token.clone()));

    let client = tally::stream::sink::client(&config.redis)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    live_view(&mut conn, &metrics, &produced, &opts, &shutdown).await;
    stop_producer.cancel();
    let _ = producer.join();
    run_token.cancel();
    task.await??;
    println!(
        "done: consumed {} messages, flushed {} keys in {} flushes",
        metrics.consumer.messages_consumed.get(),
        metrics.sink.keys_flushed.get(),
        metrics.sink.flush_duration.get_sample_count()
    );
    Ok(())
}

/// A local `redis-server` if the config names no Redis (its URL goes into `config`); None
/// when it names one. It listens on `port` when that is free, else on any free port. The
/// server stops when the returned value is dropped.
fn start_local_redis(config: &mut Config, port: Option<u16>) -> anyhow::Result<Option<LocalRedis>> {
    if !config.redis.url.is_empty() {
        return Ok(None);
    }
    let free = port.filter(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok());
    let redis = match free {
        Some(p) => LocalRedis::start_on(p, &[])?,
        None => LocalRedis::start(&[])?,
    };
    config.redis.url = redis.url();
    println!("started redis-server on {}", config.redis.url);
    Ok(Some(redis))
}

/// The in-process Kafka broker with the demo topic (its address goes into `config`); it stops
/// when the returned value is dropped.
fn start_broker(
    config: &mut Config,
    opts: &DemoOptions,
) -> anyhow::Result<MockCluster<'static, DefaultProducerContext>> {
    let mock = MockCluster::new(1).context("starting the in-process Kafka broker")?;
    mock.create_topic(&config.kafka.topic, opts.partitions, 1)?;
    config.kafka.brokers = mock.bootstrap_servers();
    println!(
        "in-process Kafka broker at {} (topic `{}`, {} partitions)",
        config.kafka.brokers, config.kafka.topic, opts.partitions
    );
    if !config.http.listen.is_empty() {
        println!(
            "status page: http://{}/ (or `tally top`)",
            config.http.listen
        );
        println!("metrics: http://{}/metrics", config.http.listen);
    }
    Ok(mock)
}

/// The live view: every 2 s until `shutdown` or the demo's duration, the rates, the flushes
/// and the ten largest counters.
async fn live_view(
    conn: &mut redis::aio::MultiplexedConnection,
    metrics: &Metrics,
    produced: &AtomicU64,
    opts: &DemoOptions,
    shutdown: &CancellationToken,
) {
    let started = Instant::now();
    let mut last = (Instant::now(), 0u64, 0u64);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        last = print_progress(metrics, produced, started, last);
        if let Ok(top) = top_counters(conn, "flow:count:*", 10).await {
            for (key, count) in top {
                println!("  {count:>8}  {key}");
            }
        }
    }
}

/// One line of the live view; `last` is (when, produced, consumed) of the previous line, and
/// the same of this one is returned.
fn print_progress(
    metrics: &Metrics,
    produced: &AtomicU64,
    started: Instant,
    last: (Instant, u64, u64),
) -> (Instant, u64, u64) {
    let consumed = metrics.consumer.messages_consumed.get();
    let prod = produced.load(Ordering::Relaxed);
    let secs = last.0.elapsed().as_secs_f64();
    let flush = &metrics.sink.flush_duration;
    let mean_ms = if flush.get_sample_count() > 0 {
        flush.get_sample_sum() / flush.get_sample_count() as f64 * 1000.0
    } else {
        0.0
    };
    println!(
        "\n[{:>4}s] produced {:>9} ({:>7.0}/s)  consumed {:>9} ({:>7.0}/s)  keys flushed {:>8}  flushes {:>5}  mean flush {:>6.1} ms  pending {}",
        started.elapsed().as_secs(),
        prod,
        (prod - last.1) as f64 / secs,
        consumed,
        (consumed - last.2) as f64 / secs,
        metrics.sink.keys_flushed.get(),
        flush.get_sample_count(),
        mean_ms,
        metrics.aggregate.pending_keys.get(),
    );
    (Instant::now(), prod, consumed)
}

/// Envoy's rate limit service beside the rest, on a free loopback port, with a limits file of
/// domain `edge` in a temporary folder (removed when the returned guard drops); unless the
/// configuration sets one.
fn demo_rls(config: &mut Config) -> anyhow::Result<Option<TempDir>> {
    if !config.rls.listen.is_empty() {
        return Ok(None);
    }
    let dir = TempDir(std::env::temp_dir().join(format!("tally-demo-rls-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    std::fs::write(
        dir.0.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, unit: minute, requests_per_unit: 100}\n",
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    config.rls.listen = format!("127.0.0.1:{port}");
    config.rls.limits_file = Some(dir.0.clone());
    println!(
        "envoy rate limit service: 127.0.0.1:{port} (domain `edge`, limits in {})",
        dir.0.display()
    );
    Ok(Some(dir))
}

/// A folder removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The demo's rate limit: 20 requests per second per subject, bursts of 5.
/// A counter with a filter, so the demo shows what filters skip: the large events (bytes of
/// 1000 or more, about 6% of the synthetic ones) per app and hour.
fn demo_filtered_counter() -> tally::config::CounterConfig {
    tally::config::CounterConfig {
        name: "large".into(),
        dimensions: vec!["app_id".into()],
        key: "demo:large:{app_id}:{yyyyMMddHH}".into(),
        filter: Some("bytes >= 1000".into()),
        ..tally::config::CounterConfig::reference()
    }
}

fn demo_limit() -> tally_counters::request::LimitPolicy {
    tally_counters::request::LimitPolicy {
        name: "demo_api".into(),
        algorithm: tally_counters::request::Algorithm::Gcra,
        limit: 20,
        window: Duration::from_secs(1),
        burst: Some(5),
        shadow: false,
        on_redis_error: tally_counters::request::FailureMode::Open,
        durability: None,
    }
}

/// Request-path traffic beside the stream: 8 subjects asking `policy` 200 times a second in
/// all, so some are admitted and some denied (see the dashboard's "Request path" row).
async fn request_traffic(
    requests: tally::api::primitives::Primitives,
    policy: String,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut n: u64 = 0;
    while !stop.is_cancelled() {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        n += 1;
        let subject = format!("client-{}", n % 8);
        let action = tally::api::primitives::Action::Apply;
        if let Err(e) = requests.limit(&[&policy], &subject, 1, action).await {
            tracing::debug!(error = %e, "demo rate limit");
        }
    }
}

fn spawn_producer(
    config: &Config,
    opts: &DemoOptions,
    produced: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &config.kafka.brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let topic = config.kafka.topic.clone();
    let rate = opts.rate.max(1);
    let keys = opts.keys;
    Ok(std::thread::spawn(move || {
        let mut gen = EventGen::new(keys, 1.0, 42);
        let mut buf = Vec::with_capacity(128);
        let start = Instant::now();
        let mut sent: u64 = 0;
        while !stop.is_cancelled() {
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            if sent >= due {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            let now = chrono::Utc::now().timestamp_millis();
            while sent < due {
                let k = gen.next_key();
                EventGen::write_json(&mut buf, k, now);
                let key = k.to_le_bytes();
                if producer
                    .send(BaseRecord::to(&topic).key(&key[..]).payload(&buf[..]))
                    .is_err()
                {
                    std::thread::sleep(Duration::from_millis(5));
                    break;
                }
                sent += 1;
            }
            produced.store(sent, Ordering::Relaxed);
        }
        let _ = producer.flush(Duration::from_secs(5));
    }))
}

/// The `n` largest counters matching `pattern` (scans at most 20,000 keys).
pub async fn top_counters(
    conn: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
    n: usize,
) -> redis::RedisResult<Vec<(String, i64)>> {
    let mut cursor: u64 = 0;
    let mut keys: Vec<String> = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 || keys.len() >= 20_000 {
            break;
        }
    }
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let values: Vec<Option<i64>> = redis::cmd("MGET").arg(&keys).query_async(conn).await?;
    let mut pairs: Vec<(String, i64)> = keys
        .into_iter()
        .zip(values)
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
    pairs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    pairs.truncate(n);
    Ok(pairs)
}

/// The port of a `redis://` URL on this host (127.0.0.1 or localhost), if it names one.
pub fn loopback_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("redis://")?;
    let host_port = rest.rsplit('@').next()?.split('/').next()?;
    let (host, port) = host_port.rsplit_once(':')?;
    matches!(host, "127.0.0.1" | "localhost")
        .then(|| port.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::loopback_port;

    #[test]
    fn only_a_loopback_url_names_the_demos_port() {
        assert_eq!(loopback_port("redis://127.0.0.1:6379"), Some(6379));
        assert_eq!(loopback_port("redis://localhost:6380/0"), Some(6380));
        assert_eq!(loopback_port("redis://:pw@127.0.0.1:7000"), Some(7000));
        assert_eq!(loopback_port("redis://redis:6379"), None);
        assert_eq!(loopback_port("rediss://127.0.0.1:6379"), None);
        assert_eq!(loopback_port(""), None);
    }
}
