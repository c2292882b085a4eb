//! Window results land on the partition a Java producer would choose for their key (Kafka's
//! murmur2, `toPositive(murmur2(key)) % partitions`), so a Kafka Streams or ksqlDB join with a
//! topic written by Java clients meets the same keys on the same partitions. librdkafka's
//! default partitioner (crc32) does not: before, 3 of 4 keys went elsewhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tally_testkit::local_redis::LocalRedis;

use crate::common::process::{BrokerProcess, TallyProcess};
use crate::stream::window::results::{config, events, produce, MIN, PARTITIONS};

/// Kafka's `Utils.murmur2` (the Java producer's default partitioner for keyed records).
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ len as u32;
    for chunk in data.chunks_exact(4) {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = &data[len & !3..];
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java producer picks for `key` among `n`.
fn java_partition(key: &[u8], n: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % n
}

#[test]
fn murmur2_is_kafkas() {
    // Kafka's own test vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest).
    assert_eq!(murmur2(b"21"), -973_932_308);
    assert_eq!(murmur2(b"foobar"), -790_332_482);
    assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
    assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
    assert_eq!(
        murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
        -58_897_971
    );
}

#[test]
fn window_results_go_to_the_partition_a_java_producer_would_choose() {
    const OUT_PARTITIONS: i32 = 4;
    let (topic, out) = ("part-in", "part-out");
    let broker = BrokerProcess::start(&[(topic, PARTITIONS), (out, OUT_PARTITIONS)]);
    let bootstrap = broker.bootstrap.as_str();
    let redis = LocalRedis::start(&[]).unwrap();
    let cfg = config(bootstrap, &redis.url(), topic, out, "final");
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 60 * MIN;
    // Minutes 0..3: minutes 0 and 1 close.
    produce(bootstrap, topic, &events(base, 0..3, 3_000, 7));
    let tally = TallyProcess::start(&cfg, "win-partitioner");

    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "part-reader")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..OUT_PARTITIONS {
        tpl.add_partition_offset(out, p, Offset::Beginning).unwrap();
    }
    reader.assign(&tpl).unwrap();
    let mut seen: BTreeMap<String, i32> = BTreeMap::new();
    let mut per_partition = [0usize; OUT_PARTITIONS as usize];
    let deadline = Instant::now() + Duration::from_secs(120);
    // Every partition receives some keys (dozens of keys over 4 partitions).
    while per_partition.iter().any(|n| *n < 3) {
        assert!(
            Instant::now() < deadline,
            "window results per partition: {per_partition:?}\n{}",
            tally.log()
        );
        let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) else {
            continue;
        };
        let key = m.key().expect("a keyed record");
        let want = java_partition(key, OUT_PARTITIONS);
        assert_eq!(
            m.partition(),
            want,
            "{}: on partition {}, a Java producer would choose {want}",
            String::from_utf8_lossy(key),
            m.partition()
        );
        per_partition[m.partition() as usize] += 1;
        seen.insert(String::from_utf8_lossy(key).into_owned(), m.partition());
    }
    assert!(seen.len() >= 12, "{seen:?}");
}
