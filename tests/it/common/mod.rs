//! Test harness: a real Kafka-protocol broker (librdkafka's mock cluster, in-process), a real
//! `redis-server` on a free loopback port, and tally running in-process.

pub mod cluster;
pub mod dead_letters;
pub mod envoy_side;
pub mod kinds;
pub mod ledger;
pub mod lock_process;
pub mod primitives;
pub mod process;
pub mod registry;
pub mod replica;
pub mod request;
pub mod rls;
pub mod schemas;
pub mod sentinel;
pub mod stream;
pub mod terminal;
pub mod topics;
pub mod truth;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::ClientConfig;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use tally::app::Tally;
use tally::config::{Config, CounterConfig};
use tally::ops::metrics::Metrics;
use tally_testkit::local_redis::LocalRedis;

pub struct Harness {
    pub mock: MockCluster<'static, DefaultProducerContext>,
    pub topic: String,
    pub partitions: i32,
    pub redis: LocalRedis,
    producer: BaseProducer,
    /// Messages produced per partition (= end offset, the mock starts at 0).
    pub produced: Vec<i64>,
}

/// A running in-process tally.
pub struct Running {
    pub token: CancellationToken,
    pub handle: JoinHandle<anyhow::Result<()>>,
    pub metrics: Metrics,
    pub health: std::sync::Arc<tally::ops::health::Health>,
}

impl Running {
    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.handle)
            .await
            .expect("tally stops within 60s")
            .expect("task joins")
            .expect("tally exits cleanly");
    }
}

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("TALLY_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

impl Harness {
    pub fn new(topic: &str, partitions: i32) -> Harness {
        Self::with_redis(topic, partitions, &[])
    }

    pub fn with_redis(topic: &str, partitions: i32, redis_args: &[&str]) -> Harness {
        Self::with_brokers(topic, partitions, redis_args, 1)
    }

    /// A mock cluster of `brokers` brokers (ids 1 to `brokers`).
    pub fn with_brokers(
        topic: &str,
        partitions: i32,
        redis_args: &[&str],
        brokers: i32,
    ) -> Harness {
        init_logs();
        let mock = MockCluster::new(brokers).expect("mock cluster");
        mock.create_topic(topic, partitions, 1)
            .expect("create topic");
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("linger.ms", "1")
            .create()
            .expect("producer");
        Harness {
            topic: topic.to_string(),
            partitions,
            redis: LocalRedis::start(redis_args).expect("redis-server"),
            producer,
            produced: vec![0; partitions as usize],
            mock,
        }
    }

    /// A config for this broker/Redis with fast flushes and a short session timeout.
    pub fn config(&self, group: &str, counters: Vec<CounterConfig>) -> Config {
        let mut c = Config::default();
        c.kafka.brokers = self.mock.bootstrap_servers();
        c.kafka.topic = self.topic.clone();
        c.kafka.group_id = group.to_string();
        c.kafka
            .properties
            .insert("session.timeout.ms".into(), "6000".into());
        c.kafka
            .properties
            .insert("heartbeat.interval.ms".into(), "500".into());
        c.kafka
            .properties
            .insert("statistics.interval.ms".into(), "500".into());
        c.redis.url = self.redis.url();
        c.redis.connect_timeout = Duration::from_millis(500);
        c.redis.response_timeout = Duration::from_secs(2);
        c.flush.interval = Duration::from_millis(100);
        c.flush.retry_initial = Duration::from_millis(50);
        c.flush.retry_max = Duration::from_millis(500);
        c.flush.shutdown_grace = Duration::from_secs(10);
        c.http.listen = String::new();
        c.counters = counters;
        c.validate().expect("test config is valid");
        c
    }

    pub fn start(&self, config: Config) -> Running {
        let tally =
            Tally::new(tally::config::Model::compile(config).expect("test config is valid"));
        let metrics = tally.metrics.clone();
        let health = tally.health.clone();
        let token = CancellationToken::new();
        let handle = tokio::spawn(tally.run(token.clone()));
        Running {
            token,
            handle,
            metrics,
            health,
        }
    }

    /// Produce one message to `partition` with an optional Kafka timestamp.
    pub fn produce(&mut self, partition: i32, payload: &[u8], ts: Option<i64>) {
        let topic = self.topic.clone();
        let mut rec = BaseRecord::<[u8], [u8]>::to(&topic)
            .partition(partition)
            .payload(payload);
        if let Some(ts) = ts {
            rec = rec.timestamp(ts);
        }
        self.send(rec);
    }

    /// Produce one message with a key and headers.
    pub fn produce_record(
        &mut self,
        partition: i32,
        key: Option<&[u8]>,
        headers: rdkafka::message::OwnedHeaders,
        payload: &[u8],
    ) {
        let topic = self.topic.clone();
        let mut rec = BaseRecord::<[u8], [u8]>::to(&topic)
            .partition(partition)
            .payload(payload)
            .headers(headers);
        if let Some(key) = key {
            rec = rec.key(key);
        }
        self.send(rec);
    }

    fn send(&mut self, mut rec: BaseRecord<'_, [u8], [u8]>) {
        let partition = rec.partition.expect("a partition is chosen");
        loop {
            match self.producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    self.producer.poll(Duration::from_millis(10));
                    rec = r;
                }
            }
        }
        self.produced[partition as usize] += 1;
    }

    pub fn flush_producer(&self) {
        self.producer
            .flush(Duration::from_secs(30))
            .expect("produce flush");
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("redis connection")
    }

    /// The applied offset Redis holds for (group, partition), shard 0.
    pub fn applied(&self, group: &str, partition: i32) -> Option<i64> {
        let key = format!("tally:applied:{group}:{}:{partition}:0", self.topic);
        redis::cmd("GET")
            .arg(key)
            .query(&mut self.conn())
            .ok()
            .flatten()
    }

    /// Wait until Redis has applied everything produced so far for `group`.
    pub async fn wait_applied(&self, group: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let applied: Vec<Option<i64>> = (0..self.partitions)
                .map(|p| self.applied(group, p))
                .collect();
            if applied
                .iter()
                .zip(&self.produced)
                .all(|(a, &p)| a.unwrap_or(-1) == p)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out: applied {applied:?}, produced {:?}",
                self.produced
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until Kafka holds `group`'s commit of everything produced so far (commits follow
    /// each landed flush asynchronously).
    pub async fn wait_committed(&self, group: &str, timeout: Duration) {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.mock.bootstrap_servers())
            .set("group.id", group)
            .create()
            .expect("consumer");
        let deadline = Instant::now() + timeout;
        loop {
            let mut tpl = rdkafka::TopicPartitionList::new();
            for p in 0..self.partitions {
                tpl.add_partition(&self.topic, p);
            }
            let committed: Vec<i64> = c
                .committed_offsets(tpl, Duration::from_secs(5))
                .map(|got| {
                    (0..self.partitions)
                        .map(
                            |p| match got.find_partition(&self.topic, p).map(|e| e.offset()) {
                                Some(rdkafka::Offset::Offset(n)) => n,
                                _ => -1,
                            },
                        )
                        .collect()
                })
                .unwrap_or_default();
            if committed == self.produced {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out: committed {committed:?}, produced {:?}",
                self.produced
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every counter key (matching `pattern`) and its value.
    pub fn dump(&self, pattern: &str) -> BTreeMap<String, i64> {
        let mut conn = self.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut conn).unwrap();
        let mut out = BTreeMap::new();
        for k in keys {
            let v: i64 = redis::cmd("GET").arg(&k).query(&mut conn).unwrap();
            out.insert(k, v);
        }
        out
    }
}

/// `tally_decode_errors_total` for `reason`: events skipped for it so far.
pub fn decode_errors(m: &Metrics, reason: &str) -> u64 {
    m.decode.decode_errors.with_label_values(&[reason]).get()
}

/// `tally_events_counted_total` for `counter`: events it has counted so far.
pub fn events_counted(m: &Metrics, counter: &str) -> u64 {
    m.aggregate
        .events_counted
        .with_label_values(&[counter])
        .get()
}

/// Wait until `cond` holds, polling; panics with `what` after `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    assert!(
        tally_testkit::wait::wait_until_async(timeout, &mut cond).await,
        "timed out waiting for {what}"
    );
}

pub fn counter(
    name: &str,
    dims: &[&str],
    key: &str,
    window: Duration,
    tz: &str,
    retention: Duration,
) -> CounterConfig {
    CounterConfig {
        name: name.into(),
        dimensions: dims.iter().map(|d| d.to_string()).collect(),
        key: key.into(),
        window,
        timezone: tz.into(),
        retention,
        value_field: None,
        ..CounterConfig::reference()
    }
}

/// One hourly counter keyed `<prefix>:{app_id}:{device_id}:<hour>`, kept a day.
pub fn hourly(prefix: &str) -> Vec<CounterConfig> {
    vec![counter(
        "flow",
        &["app_id", "device_id"],
        &format!("{prefix}:{{app_id}}:{{device_id}}:{{yyyyMMddHH}}"),
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(86_400),
    )]
}

/// Produce events `from..from + n`, event `i` on partition `i % partitions`, 20 keys, all in
/// the current hour (the truth is simply `n`).
pub fn produce_batch(h: &mut Harness, from: usize, n: usize) {
    let now = chrono::Utc::now().timestamp_millis();
    for i in from..from + n {
        let payload = format!(r#"{{"app_id":"a{}","device_id":"d{}"}}"#, i % 4, i % 5);
        h.produce(
            (i % h.partitions as usize) as i32,
            payload.as_bytes(),
            Some(now),
        );
    }
    h.flush_producer();
}

pub fn total(h: &Harness, pattern: &str) -> i64 {
    h.dump(pattern).values().sum()
}

/// One cell of the accuracy table (`scripts/accuracy.py` collects these lines from the tests'
/// output into docs/accuracy.md): what a primitive did under a fault, against its truth.
/// `over`: admitted past the limit, or counted twice; `lost`: acknowledged, then gone.
pub fn accuracy(
    primitive: &str,
    fault: &str,
    durability: &str,
    observed: impl std::fmt::Display,
    truth: impl std::fmt::Display,
    over: i64,
    lost: i64,
) {
    println!("ACCURACY|{primitive}|{fault}|{durability}|{observed}|{truth}|{over}|{lost}");
}
