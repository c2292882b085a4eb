//! Spread expiry: every key the stream writes is stored with window end + retention
//! plus its own offset within the counter's `expiry_spread`, from a hash of the key as stored;
//! the same after a restart, a repair of a key without expiry and a rebuild from Kafka, on a
//! server and on a cluster (where the hash includes the key's hash tag).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tally::config::{CounterConfig, RedisMode};
use tally::model::layout::Layout;
use tally::model::{stored_expire_at, CounterSpec};
use tally_testkit::local_redis::LocalCluster;

use crate::common::{counter, wait_for, Harness};

const HOUR: i64 = 3_600_000;
const SPREAD: i64 = 600_000;
const DEVICES: usize = 600;
const WAIT: Duration = Duration::from_secs(60);

/// Hourly per device, kept an hour, expiry spread over 10 minutes.
fn spread_counter() -> CounterConfig {
    let mut c = counter(
        "flow",
        &["device_id"],
        "sp:{device_id}:{yyyyMMddHH}",
        Duration::from_secs(3600),
        "UTC",
        Duration::from_secs(3600),
    );
    c.expiry_spread = Some(Duration::from_millis(SPREAD as u64));
    c
}

fn produce_devices(h: &mut Harness, ts: i64) {
    for i in 0..DEVICES {
        let payload = format!(r#"{{"device_id":"d{i}"}}"#);
        h.produce((i % 2) as i32, payload.as_bytes(), Some(ts));
    }
    h.flush_producer();
}

/// Every key's stored expiry lies in [window expiry, + SPREAD], is the model's function of the
/// key, and the keys do not share one instant.
fn assert_spread(expiries: &BTreeMap<String, i64>, window_expiry: i64) {
    assert_eq!(expiries.len(), DEVICES, "one key per device");
    for (key, &at) in expiries {
        assert!(
            (window_expiry..=window_expiry + SPREAD).contains(&at),
            "{key}: {at} outside [{window_expiry}, +{SPREAD}]"
        );
        assert_eq!(
            at,
            stored_expire_at(key.as_bytes(), window_expiry, SPREAD),
            "{key}"
        );
    }
    let instants: BTreeSet<i64> = expiries.values().copied().collect();
    assert!(
        instants.len() > DEVICES * 9 / 10,
        "{} instants",
        instants.len()
    );
}

fn expiries(h: &Harness) -> BTreeMap<String, i64> {
    let mut conn = h.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("sp:*").query(&mut conn).unwrap();
    keys.into_iter()
        .map(|k| {
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(&mut conn).unwrap();
            (k, at)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiries_are_spread_and_the_same_after_restart_repair_and_rebuild() {
    let mut h = Harness::new("spread", 2);
    let g = "g-spread";
    let mut config = h.config(g, vec![spread_counter()]);
    config.flush.ttl_check_every = 1;
    let now = chrono::Utc::now().timestamp_millis();
    let window_expiry = now - now.rem_euclid(HOUR) + HOUR + HOUR;
    produce_devices(&mut h, now);
    let first = h.start(config.clone());
    h.wait_applied(g, WAIT).await;
    first.stop().await;
    let before = expiries(&h);
    assert_spread(&before, window_expiry);

    // A restart adding to the same keys keeps their expiries; keys left without one (PERSIST)
    // are repaired to the very same instant.
    let mut conn = h.conn();
    for key in before.keys().take(50) {
        let _: i64 = redis::cmd("PERSIST").arg(key).query(&mut conn).unwrap();
    }
    produce_devices(&mut h, now);
    let second = h.start(config.clone());
    h.wait_applied(g, WAIT).await;
    second.stop().await;
    assert_eq!(expiries(&h), before, "after a restart and a repair");

    // Redis loses everything: the rebuild from Kafka writes the same expiries again.
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    h.produce(0, br#"{"device_id":"d0"}"#, Some(now));
    h.flush_producer();
    let third = h.start(config);
    h.wait_applied(g, WAIT).await;
    third.stop().await;
    assert_eq!(expiries(&h), before, "after a rebuild");
    let total: i64 = h.dump("sp:*").values().sum();
    assert_eq!(total, 2 * DEVICES as i64 + 1, "counted exactly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_tagged_key_is_hashed() {
    let cluster = LocalCluster::start(3, 0).expect("cluster");
    let mut h = Harness::new("spread-cluster", 2);
    let g = "g-spread-cluster";
    let mut config = h.config(g, vec![spread_counter()]);
    config.redis.mode = RedisMode::Cluster;
    config.redis.nodes = cluster.urls();
    config.redis.cluster_shards = 8;
    let now = chrono::Utc::now().timestamp_millis();
    let window_expiry = now - now.rem_euclid(HOUR) + HOUR + HOUR;
    produce_devices(&mut h, now);
    // The stored (tagged) key of every device, as the model renders it.
    let spec = CounterSpec::compile(&spread_counter()).unwrap();
    let layout = Layout::for_config(&config.redis);
    let keys: Vec<Vec<u8>> = (0..DEVICES)
        .map(|i| spec.key_at(&[&format!("d{i}")], now, &layout).0)
        .collect();
    assert!(keys.iter().all(|k| k.ends_with(b"}")), "tagged keys");
    let running = h.start(config);
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_connection().unwrap();
    wait_for("every device counted", WAIT, || {
        keys.iter().all(|k| {
            redis::cmd("GET")
                .arg(k)
                .query::<Option<i64>>(&mut conn)
                .unwrap()
                == Some(1)
        })
    })
    .await;
    running.stop().await;
    let got: BTreeMap<String, i64> = keys
        .iter()
        .map(|k| {
            let at: i64 = redis::cmd("PEXPIRETIME").arg(k).query(&mut conn).unwrap();
            (String::from_utf8(k.clone()).unwrap(), at)
        })
        .collect();
    assert_spread(&got, window_expiry);
}
