//! Redis Cluster: 3 primaries with replicas on loopback. Exact counts with keys spread over all
//! primaries, through resharding, a primary failover and crash loops of tally itself.

use crate::common;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::process::{kafka_toml, BrokerProcess, TallyProcess};
use crate::common::stream::{Stream, COUNTERS};
use rand::RngExt;
use tally_testkit::local_redis::LocalCluster;
use tally_testkit::wait::wait_for_value;

pub(crate) const PARTITIONS: i32 = 8;
pub(crate) const SHARDS: u32 = 64;

pub(crate) fn config(bootstrap: &str, cluster: &LocalCluster, group: &str, topic: &str) -> String {
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let kafka = kafka_toml(bootstrap, topic, group);
    format!(
        r#"{kafka}[redis]
mode = "cluster"
nodes = [{}]
cluster_shards = {SHARDS}
connect_timeout = "500ms"
response_timeout = "2s"
[flush]
interval = "100ms"
max_keys_per_call = 100
retry_initial = "20ms"
retry_max = "500ms"
shutdown_grace = "20s"
{COUNTERS}"#,
        nodes.join(", ")
    )
}

/// Let one replica run until everything produced is applied, stop it (exit 0), compare.
pub(crate) fn finish(
    cfg: &str,
    cluster: &LocalCluster,
    group: &str,
    topic: &str,
    produced: &[i64],
    stream: &Stream,
) -> (usize, usize, Vec<usize>) {
    let mut t = TallyProcess::start(cfg, "final");
    t.finish(produced, Duration::from_secs(180), || {
        common::cluster::applied(cluster, SHARDS, group, topic, PARTITIONS)
    });
    let (keys, mismatches, spread) = common::cluster::compare(cluster, SHARDS, &stream.truth());
    // The other kinds (distinct, leaderboard, hash storage), merged over the primaries.
    let mut kinds = common::kinds::Kinds::default();
    for port in cluster.primaries() {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        common::kinds::dump(&mut c, &mut kinds);
    }
    let kind_mismatches = common::kinds::compare(&kinds, &stream.kinds_truth());
    (keys, mismatches + kind_mismatches, spread)
}

/// Wait until every node agrees on the slot configuration (`redis-cli --cluster check`).
fn wait_agreement(port: u16) {
    let check = || {
        let out = Command::new("redis-cli")
            .args(["--cluster", "check", &format!("127.0.0.1:{port}")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let agreed = out.status.success() && !text.contains("[ERR]") && !text.contains("[WARNING]");
        (agreed, text)
    };
    if let Err((_, text)) = wait_for_value(
        Duration::from_secs(60),
        Duration::from_millis(200),
        check,
        |c| c.0,
    ) {
        panic!("cluster nodes never agreed: {text}");
    }
}

pub(crate) fn node_id(port: u16) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "CLUSTER", "MYID"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn cluster_exact_counts_spread_over_all_primaries() {
    let topic = "cl-exact";
    let cluster = LocalCluster::start(3, 1).unwrap();
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    let cfg = config(&broker.bootstrap, &cluster, "g-cl", topic);
    let stream = Stream {
        n: 100_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce(&broker.bootstrap, topic, 50_000);
    let produced = producer.join().unwrap();
    let (keys, mismatches, spread) = finish(&cfg, &cluster, "g-cl", topic, &produced, &stream);
    // The query tooling computes the tagged key and reads it: event 0 is app0/dev0/10.0.0.0 at now.
    let path = std::env::temp_dir().join(format!("tally-cl-query-{}.toml", std::process::id()));
    std::fs::write(&path, &cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args([
            "query",
            "--config",
            path.to_str().unwrap(),
            "--counter",
            "flow",
        ])
        .args([
            "--dim",
            "app_id=app0",
            "--dim",
            "device_id=dev0",
            "--dim",
            "ip=10.0.0.0",
        ])
        .args(["--at", &stream.now_ms.to_string()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let (key, value) = printed.trim().split_once('\t').expect("key<TAB>value");
    let hour = chrono::DateTime::from_timestamp_millis(stream.now_ms)
        .unwrap()
        .format("%Y%m%d%H");
    let plain = format!("eo:flow:app0:dev0:10.0.0.0:{hour}");
    assert!(key.starts_with(&format!("{plain}:{{")), "{printed}");
    assert_eq!(
        value.parse::<i64>().ok(),
        stream.truth().get(&plain).copied(),
        "{printed}"
    );
    // A range over 120 one-minute windows, whose keys lie in many slots: one pipeline per slot.
    std::fs::write(&path, &cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["query", "--config"])
        .arg(&path)
        .args([
            "--counter",
            "minute",
            "--dim",
            "ip=10.0.0.0",
            "--last",
            "120",
            "--json",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let range: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let truth = stream.truth();
    let mut want = 0;
    for w in range["windows"].as_array().unwrap() {
        let minute = chrono::DateTime::from_timestamp_millis(w["start_ms"].as_i64().unwrap())
            .unwrap()
            .format("%Y%m%d%H%M");
        let cell = truth.get(&format!("eo:min:10.0.0.0:{minute}")).copied();
        assert_eq!(w["value"].as_i64(), cell, "minute {minute}");
        want += cell.unwrap_or(0);
    }
    assert!(want > 0);
    assert_eq!(range["value"].as_i64(), Some(want));
    let total: usize = spread.iter().sum();
    eprintln!("cluster: {} events, {keys} keys compared, {mismatches} mismatches, keys per primary {spread:?}", stream.n);
    assert_eq!(mismatches, 0);
    assert_eq!(spread.len(), 3);
    for n in &spread {
        assert!(*n * 100 / total >= 25, "uneven spread {spread:?}");
    }
}

#[test]
fn cluster_resharding_while_writing_counts_exactly() {
    let topic = "cl-reshard";
    let cluster = LocalCluster::start(3, 1).unwrap();
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    let cfg = config(&broker.bootstrap, &cluster, "g-rs", topic);
    let stream = Stream {
        n: 120_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce(&broker.bootstrap, topic, 6_000);
    let t = TallyProcess::start(&cfg, "reshard");
    assert!(
        t.wait_metric("tally_keys_flushed_total", 1.0, Duration::from_secs(60)),
        "{}",
        t.log()
    );
    let primaries = cluster.primaries();
    let mut moved = 0;
    for (from, to) in [
        (primaries[0], primaries[1]),
        (primaries[1], primaries[2]),
        (primaries[2], primaries[0]),
    ] {
        wait_agreement(from);
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args([
                "--cluster-from",
                &node_id(from),
                "--cluster-to",
                &node_id(to),
            ])
            .args(["--cluster-slots", "1500", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "reshard failed: {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .join("\n")
        );
        moved += 1500;
    }
    let produced = producer.join().unwrap();
    let migrations = t.metric("tally_redis_retries_total").unwrap_or(0.0);
    drop(t);
    cluster.wait_ok(Duration::from_secs(30)).unwrap();
    let (keys, mismatches, spread) = finish(&cfg, &cluster, "g-rs", topic, &produced, &stream);
    eprintln!("reshard: {moved} slots migrated while writing, {migrations} flush retries, {} events, {keys} keys compared, {mismatches} mismatches, keys per primary {spread:?}", stream.n);
    assert_eq!(mismatches, 0);
}

#[test]
fn cluster_primary_failover_while_writing() {
    let topic = "cl-failover";
    let mut cluster = LocalCluster::start(3, 1).unwrap();
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    // Measured with the default redis.response_timeout: what a user gets.
    let cfg = config(&broker.bootstrap, &cluster, "g-fo", topic)
        .replace("response_timeout = \"2s\"\n", "");
    assert!(!cfg.contains("response_timeout"));
    let stream = Stream {
        n: 100_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce(&broker.bootstrap, topic, 5_000);
    let t = TallyProcess::start(&cfg, "failover");
    assert!(
        t.wait_metric("tally_keys_flushed_total", 1.0, Duration::from_secs(60)),
        "{}",
        t.log()
    );
    std::thread::sleep(Duration::from_millis(rand::rng().random_range(500..2000)));
    let victim = cluster.primaries()[0];
    cluster.node_mut(victim).unwrap().stop();
    let killed_at = Instant::now();
    // Promotion: the victim is no longer a primary and its replica took its slots.
    while cluster.primaries().contains(&victim) || cluster.primaries().len() < 3 {
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "no replica was promoted: {:?}\n{}",
            cluster.primaries(),
            String::from_utf8_lossy(
                &Command::new("redis-cli")
                    .args([
                        "-p",
                        &cluster.primaries().last().copied().unwrap_or(0).to_string(),
                        "CLUSTER",
                        "NODES"
                    ])
                    .output()
                    .unwrap()
                    .stdout
            )
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let promoted_after = killed_at.elapsed();
    // Recovery: the first whole flush (every shard, the moved ones included) landing after the
    // promotion. Events keep arriving, so a flush is always due.
    let promoted_at = Instant::now();
    let flushed = t.metric("tally_keys_flushed_total").unwrap_or(0.0);
    assert!(
        t.wait_metric(
            "tally_keys_flushed_total",
            flushed + 1.0,
            Duration::from_secs(60)
        ),
        "no flush landed within 60 s of the promotion\n{}",
        t.log()
    );
    let recovered_after = promoted_at.elapsed();
    cluster.wait_ok(Duration::from_secs(60)).unwrap();
    let produced = producer.join().unwrap();
    let retries = t.metric("tally_redis_retries_total").unwrap_or(0.0);
    let conflicts = t.metric("tally_fence_conflicts_total").unwrap_or(0.0);
    drop(t);
    let (keys, mismatches, spread) = finish(&cfg, &cluster, "g-fo", topic, &produced, &stream);
    eprintln!(
        "failover: primary {victim} killed, replica promoted after {promoted_after:?}, flushes landing again {recovered_after:?} after the promotion, {retries} flush retries, {conflicts} fence resyncs, {} events, {keys} keys compared, {mismatches} mismatches, keys per primary {spread:?}",
        stream.n
    );
    assert_eq!(mismatches, 0);
    // The target is 5 s; the bound leaves room for a loaded shared machine.
    assert!(
        recovered_after < Duration::from_secs(15),
        "flushes resumed only {recovered_after:?} after the promotion"
    );
}

#[test]
fn cluster_crash_loop_counts_exactly() {
    let topic = "cl-crash";
    let cluster = LocalCluster::start(3, 1).unwrap();
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    let cfg = config(&broker.bootstrap, &cluster, "g-cc", topic);
    let stream = Stream {
        n: 100_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce(&broker.bootstrap, topic, 2_000);
    let mut kills = 0;
    while kills < 8 || !producer.is_finished() {
        let mut t = TallyProcess::start(&cfg, "crash");
        t.wait_working();
        std::thread::sleep(Duration::from_millis(rand::rng().random_range(0..1500)));
        t.kill9();
        kills += 1;
    }
    let produced = producer.join().unwrap();
    let (keys, mismatches, _) = finish(&cfg, &cluster, "g-cc", topic, &produced, &stream);
    eprintln!("cluster crash loop: {kills} SIGKILLs, {} events, {keys} keys compared, {mismatches} mismatches", stream.n);
    assert_eq!(mismatches, 0);
}

/// Redis Cluster replicates asynchronously: a primary that dies before its replica received its
/// latest writes loses them, even though it acknowledged them. Force exactly that (cut the
/// replica off, keep writing, kill the primary) and check that tally notices the applied
/// offsets went back and puts the lost events back (from the flushes it keeps, or from Kafka).
#[test]
fn cluster_failover_losing_acknowledged_writes_stays_exact() {
    let topic = "cl-lost";
    let mut cluster = LocalCluster::start(3, 1).unwrap();
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    let cfg = config(&broker.bootstrap, &cluster, "g-lost", topic);
    let stream = Stream {
        n: 80_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    // The last quarter of the events waits for the promotion: tally can only notice the rolled
    // back offsets when it flushes again (however long the steps before take under load).
    let open = Arc::new(AtomicU64::new(stream.n * 3 / 4));
    let (producer, _) = stream.produce_gated(&broker.bootstrap, topic, 5_000, &[], open.clone());
    let t = TallyProcess::start(&cfg, "lost");
    assert!(
        t.wait_metric("tally_keys_flushed_total", 1.0, Duration::from_secs(60)),
        "{}",
        t.log()
    );

    let victim = cluster.primaries()[0];
    let replica = replica_of(victim);
    // Cut the replica off: wrong credentials for its primary, then drop the link.
    let mut r = redis::Client::open(format!("redis://127.0.0.1:{replica}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg("wrong")
        .query(&mut r)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("master")
        .query(&mut r)
        .unwrap();
    let flushed = t.metric("tally_keys_flushed_total").unwrap_or(0.0);
    // The primary acknowledges writes its replica will never see.
    assert!(t.wait_metric(
        "tally_keys_flushed_total",
        flushed + 5_000.0,
        Duration::from_secs(60)
    ));
    // Killed while the replica is still cut off: given its credentials back first, the replica
    // could reconnect and catch up (PSYNC from the backlog) before the kill, and nothing would
    // be lost. Once promoted it needs them no more.
    cluster.node_mut(victim).unwrap().stop();
    let killed_at = Instant::now();
    while cluster.primaries().contains(&victim) || cluster.primaries().len() < 3 {
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "replica {replica} was not promoted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg("")
        .query(&mut r)
        .unwrap();
    cluster.wait_ok(Duration::from_secs(60)).unwrap();
    open.store(u64::MAX, Ordering::Relaxed);
    let produced = producer.join().unwrap();
    // The sink applies the lost flushes again from memory when it reconnects (what it still
    // keeps); a flush that meets older rolled-back offsets resynchronises from Kafka.
    // Or the fence check finds the rolled-back offsets first, before any flush meets them.
    let noticed = || {
        t.metric("tally_reapplied_ranges_total").unwrap_or(0.0)
            + t.metric("tally_fence_conflicts_total").unwrap_or(0.0)
            + t.metric(r#"tally_state_rollbacks_total{found="behind"}"#)
                .unwrap_or(0.0)
            + t.metric(r#"tally_state_rollbacks_total{found="lost"}"#)
                .unwrap_or(0.0)
    };
    tally_testkit::wait::wait_until(Duration::from_secs(30), || noticed() > 0.0);
    let reapplied = t.metric("tally_reapplied_ranges_total").unwrap_or(0.0);
    let resyncs = t.metric("tally_fence_conflicts_total").unwrap_or(0.0);
    let checked = noticed() - reapplied - resyncs;
    drop(t);
    let (keys, mismatches, _) = finish(&cfg, &cluster, "g-lost", topic, &produced, &stream);
    eprintln!(
        "failover with lost writes: replica {replica} cut off, primary {victim} killed, {reapplied} offset ranges applied again from memory, {resyncs} flush units found their applied offset rolled back and were replayed, {checked} partitions found rolled back by the fence check, {} events, {keys} keys compared, {mismatches} mismatches",
        stream.n
    );
    assert!(
        reapplied + resyncs + checked > 0.0,
        "the failover lost acknowledged writes and tally noticed"
    );
    assert_eq!(mismatches, 0);
}

pub(crate) fn replica_of(primary: u16) -> u16 {
    // Asked of the primary itself (ROLE): a node's `CLUSTER NODES` can be stale.
    let mut found = None;
    tally_testkit::wait::wait_until(Duration::from_secs(30), || {
        found = crate::stream::failover::replicas_of(primary)
            .first()
            .copied();
        found.is_some()
    });
    found.expect("the primary has a connected replica")
}
