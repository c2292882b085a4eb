//! Redis Cluster failover, measured from outside: a producer keeps producing, a primary fails,
//! and the test measures the time from the failure until counts produced after it are visible
//! in Redis, with the defaults a user gets (`redis.*_timeout`, `flush.retry_*`) and a node
//! timeout of 2 s. Rounds take turns: the primary is killed (kill -9) and its replica takes
//! over at once (`CLUSTER FAILOVER TAKEOVER`, what an operator or orchestrator that saw the
//! process die does: the promotion costs milliseconds, so the time measured is tally's); the
//! primary is killed and the cluster promotes its replica itself (after the node timeout and an
//! election: 2.5-4.5 s here, the cluster's share); the primary is frozen (SIGSTOP: its
//! connections hang rather than fail, like a host gone silent) and the cluster promotes.
//!
//! Each round measures, from the failure: when the replica says it is a primary, and when, for
//! every partition and on every primary (the promoted replica included), one of its shards
//! holds an applied offset past the end of the topic at the failure (an event produced after
//! it is counted everywhere: new counts visible). It asserts visible <= 1 s after the failure in the takeover rounds and
//! <= 1 s after the promotion in the others; the counts are exact at the end.
//! `TALLY_FAILOVER_ROUNDS=10` runs ten rounds, `TALLY_FAILOVER_KINDS=takeover` only takeovers
//! (the measurement of ten kills in a row); `TALLY_FAILOVER_LOG=<file>` keeps tally's log.

use std::time::{Duration, Instant};

use crate::common::process::{BrokerProcess, TallyProcess};
use crate::common::stream::Stream;
use crate::stream::cluster::{config, finish, PARTITIONS, SHARDS};
use tally_testkit::local_redis::LocalCluster;

const NODE_TIMEOUT_MS: u32 = 2000;
const RATE: u64 = 2_000;

fn conn(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap()
}

/// The applied-offset keys a primary holds (its shards' fences).
fn applied_keys(port: u16) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("tally:applied:*")
        .query(&mut conn(port))
        .unwrap()
}

fn values(c: &mut redis::Connection, keys: &[String]) -> Option<Vec<Option<i64>>> {
    let mut pipe = redis::pipe();
    for k in keys {
        pipe.cmd("GET").arg(k);
    }
    pipe.query(c).ok()
}

fn is_primary(c: &mut redis::Connection) -> bool {
    let role: Result<Vec<redis::Value>, _> = redis::cmd("ROLE").query(c);
    matches!(role.ok().and_then(|r| r.into_iter().next()), Some(redis::Value::BulkString(b)) if b == b"master")
}

/// The ports of the replicas connected to `port`, if it says (ROLE) it is a primary. Asked of
/// the node itself: another node's `CLUSTER NODES` may still be stale after the previous round
/// (under load a rejoined node was once listed as a primary, and the round picked a replica).
pub(crate) fn replicas_of(port: u16) -> Vec<u16> {
    let role: Vec<redis::Value> = match redis::cmd("ROLE").query(&mut conn(port)) {
        Ok(role) => role,
        Err(_) => return Vec::new(),
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    match role.as_slice() {
        [kind, _, redis::Value::Array(replicas)] if text(kind) == "master" => replicas
            .iter()
            .filter_map(|r| match r {
                redis::Value::Array(parts) => parts.get(1).and_then(|p| text(p).parse().ok()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The `index`-th of the three primaries and its synced replica, once the nodes agree.
fn victim(cluster: &LocalCluster, index: usize) -> (u16, u16) {
    let mut found = None;
    when(Duration::from_secs(60), || {
        let primaries = cluster.primaries();
        found = (primaries.len() == 3)
            .then(|| primaries[index % 3])
            .and_then(|p| Some((p, *replicas_of(p).first()?)))
            .filter(|(_, r)| is_synced_replica(*r));
        found.is_some()
    });
    found.expect("three primaries, each with a synced replica")
}

fn is_synced_replica(port: u16) -> bool {
    let info: Option<String> = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .ok()
        .and_then(|c| {
            c.get_connection_with_timeout(Duration::from_millis(300))
                .ok()
        })
        .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c).ok());
    info.is_some_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
}

/// Poll `cond` every 5 ms until it holds; the instant it held, or None after `timeout`.
fn when(timeout: Duration, mut cond: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// How a round's primary fails.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// kill -9, and its replica takes over at once (`CLUSTER FAILOVER TAKEOVER`).
    KillTakeover,
    /// kill -9; the cluster promotes the replica after its node timeout.
    Kill,
    /// SIGSTOP; the cluster promotes the replica after its node timeout.
    Stall,
}

/// What one round measured, from the failure.
struct Round {
    fault: Fault,
    /// The replica said it is a primary.
    promoted: Duration,
    /// Every primary had counted an event produced after the failure, for every partition.
    visible: Duration,
    /// Everything produced before the promotion was counted (the outage's backlog).
    caught_up: Duration,
}

/// The applied offsets `keys` name, read on `c`: the highest per partition (-1: none yet).
fn newest_per_partition(c: &mut redis::Connection, keys: &[(i32, String)]) -> Option<Vec<i64>> {
    let names: Vec<String> = keys.iter().map(|(_, k)| k.clone()).collect();
    let values = values(c, &names)?;
    let mut newest = vec![-1; PARTITIONS as usize];
    for ((p, _), v) in keys.iter().zip(values) {
        newest[*p as usize] = newest[*p as usize].max(v.unwrap_or(-1));
    }
    Some(newest)
}

/// The partition an applied-offset key is for (`tally:applied:<group>:<topic>:<p>:<shard>:{tag}`).
fn partition_of(key: &str, group: &str, topic: &str) -> i32 {
    key.strip_prefix(&format!("tally:applied:{group}:{topic}:"))
        .and_then(|rest| rest.split(':').next()?.parse().ok())
        .unwrap_or_else(|| panic!("not an applied-offset key of {group}/{topic}: {key}"))
}

/// One failover of `victim` (see [`Fault`]); then the victim comes back (restarted, or
/// continued) and rejoins as a replica.
fn failover(
    cluster: &mut LocalCluster,
    (victim, replica): (u16, u16),
    fault: Fault,
    t: &TallyProcess,
    stream: &EndToEnd,
) -> Round {
    // Each primary's applied offsets, read where they will be after the failover (the
    // victim's on its replica): counts are visible again when every primary, the promoted one
    // included, has counted an event produced after the failure, for every partition.
    let primaries = cluster.primaries();
    let mut readers: Vec<(redis::Connection, Vec<(i32, String)>)> = primaries
        .iter()
        .map(|&port| {
            let keys: Vec<(i32, String)> = applied_keys(port)
                .into_iter()
                .map(|k| (partition_of(&k, "g-five", "cl-five"), k))
                .collect();
            assert!(!keys.is_empty(), "primary {port} holds no applied offsets");
            (conn(if port == victim { replica } else { port }), keys)
        })
        .collect();
    let mut c = conn(replica);
    let pid = cluster.node_mut(victim).unwrap().pid().unwrap() as i32;
    // The end of the topic when the primary fails: an applied offset past it is an event
    // produced after the failure.
    let end = (stream.high)();
    if fault == Fault::Stall {
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    } else {
        cluster.node_mut(victim).unwrap().stop();
    }
    let failed = Instant::now();
    if fault == Fault::KillTakeover {
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .arg("TAKEOVER")
            .query(&mut c)
            .unwrap();
    }
    eprintln!(
        "{victim} failed ({fault:?}) at {}",
        chrono::Utc::now().format("%H:%M:%S%.3f")
    );
    let promoted = when(Duration::from_secs(30), || is_primary(&mut c))
        .unwrap_or_else(|| panic!("replica {replica} of {victim} was not promoted"));
    let produced = (stream.high)();
    let visible = when(Duration::from_secs(60), || {
        readers.iter_mut().all(|(c, keys)| {
            newest_per_partition(c, keys)
                .is_some_and(|now| now.iter().zip(&end).all(|(n, e)| n > e))
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "events produced after the failure were not counted within 60 s\n{}",
            t.log()
        )
    });
    let caught_up = when(Duration::from_secs(60), || {
        (stream.applied)(&*cluster)
            .iter()
            .zip(&produced)
            .all(|(a, p)| a >= p)
    })
    .unwrap_or_else(|| {
        panic!(
            "what was produced before the promotion was not counted within 60 s\n{}",
            t.log()
        )
    });
    if fault == Fault::Stall {
        unsafe { libc::kill(pid, libc::SIGCONT) };
    } else {
        cluster.node_mut(victim).unwrap().restart().unwrap();
    }
    cluster.wait_ok(Duration::from_secs(60)).unwrap();
    assert!(
        when(Duration::from_secs(60), || is_synced_replica(victim)).is_some(),
        "{victim} did not rejoin as a replica"
    );
    Round {
        fault,
        promoted: promoted - failed,
        visible: visible - failed,
        caught_up: caught_up.max(visible) - failed,
    }
}

/// End to end: Kafka's end offsets (what was produced) and what Redis applied, per partition.
struct EndToEnd<'a> {
    high: Box<dyn Fn() -> Vec<i64> + 'a>,
    applied: Box<Applied<'a>>,
}

/// What Redis applied per partition, read through the cluster.
type Applied<'a> = dyn Fn(&LocalCluster) -> Vec<i64> + 'a;

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[test]
fn cluster_failovers_counted_within_a_second_of_the_kill() {
    let topic = "cl-five";
    let mut cluster = LocalCluster::start_with_node_timeout(3, 1, NODE_TIMEOUT_MS).unwrap();
    let broker = BrokerProcess::start(&[(topic, PARTITIONS)]);
    // The defaults of the Redis timeouts and of the flush retries: what a user gets.
    let cfg: String = config(&broker.bootstrap, &cluster, "g-five", topic)
        .lines()
        .filter(|l| !l.contains("_timeout =") && !l.starts_with("retry_"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!cfg.contains("response_timeout") && !cfg.contains("retry_max"));
    let (rounds_wanted, kinds, seconds) = plan();
    let stream = Stream {
        n: RATE * seconds,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    let (producer, _) = stream.produce(&broker.bootstrap, topic, RATE);
    let t = TallyProcess::start(&cfg, "five-failovers");
    assert!(
        t.wait_metric("tally_keys_flushed_total", 1.0, Duration::from_secs(60)),
        "{}",
        t.log()
    );
    let watermarks: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .unwrap();
    let end_to_end = EndToEnd {
        high: Box::new(|| {
            use rdkafka::consumer::Consumer;
            (0..PARTITIONS)
                .map(|p| {
                    watermarks
                        .fetch_watermarks(topic, p, Duration::from_secs(5))
                        .unwrap()
                        .1
                })
                .collect()
        }),
        applied: Box::new(|cluster| {
            crate::common::cluster::applied(cluster, SHARDS, "g-five", topic, PARTITIONS)
        }),
    };
    // Every partition counted (its fences on every shard): a lane that joins late gets its
    // partitions only then, and a round measured before would wait for offsets no primary has.
    assert!(
        when(Duration::from_secs(60), || (end_to_end.applied)(&cluster)
            .iter()
            .all(|a| *a >= 0))
        .is_some(),
        "not every partition was counted within 60 s\n{}",
        t.log()
    );
    let mut rounds = Vec::new();
    for round in 0..rounds_wanted {
        assert!(
            !producer.is_finished(),
            "the stream ended before failover {round}"
        );
        let fault = kinds[round % kinds.len()];
        let pair = victim(&cluster, round);
        let r = failover(&mut cluster, pair, fault, &t, &end_to_end);
        eprintln!(
            "failover {round}: primary {} {fault:?}, replica promoted after {}, new counts visible {} after the failure ({} after the promotion), everything produced before the promotion counted after {}",
            pair.0,
            ms(r.promoted),
            ms(r.visible),
            ms(r.visible.saturating_sub(r.promoted)),
            ms(r.caught_up)
        );
        rounds.push(r);
        // Kept after each round, so a round that fails later still leaves the log.
        if let Ok(path) = std::env::var("TALLY_FAILOVER_LOG") {
            std::fs::write(path, t.log()).unwrap();
        }
    }
    let produced = producer.join().unwrap();
    drop(t);
    let (keys, mismatches, _) = finish(&cfg, &cluster, "g-five", topic, &produced, &stream);
    report(&rounds, rounds_wanted, stream.n, keys, mismatches);
    assert_eq!(mismatches, 0);
    each_round_counted_within_a_second(&rounds);
}

/// How many failovers (`TALLY_FAILOVER_ROUNDS`, 4), of which kinds (`TALLY_FAILOVER_KINDS`,
/// taking turns), and the seconds of events they need.
fn plan() -> (usize, Vec<Fault>, u64) {
    let rounds_wanted: usize = std::env::var("TALLY_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let kinds: Vec<Fault> = match std::env::var("TALLY_FAILOVER_KINDS").as_deref() {
        Ok("takeover") => vec![Fault::KillTakeover],
        _ => vec![
            Fault::KillTakeover,
            Fault::Kill,
            Fault::KillTakeover,
            Fault::Stall,
        ],
    };
    // Seconds of events: for tally to start, and per round (a takeover and the victim's
    // rejoining take ~1 s; the cluster's own failover and the rejoining take ~5 s).
    let seconds: u64 = 12
        + (0..rounds_wanted)
            .map(|r| match kinds[r % kinds.len()] {
                Fault::KillTakeover => 3,
                Fault::Kill | Fault::Stall => 8,
            })
            .sum::<u64>();
    (rounds_wanted, kinds, seconds)
}

fn report(rounds: &[Round], rounds_wanted: usize, events: u64, keys: usize, mismatches: usize) {
    let list = |pick: fn(&Round) -> Duration, fault: Option<Fault>| -> String {
        let picked: Vec<String> = rounds
            .iter()
            .filter(|r| fault.is_none_or(|f| f == r.fault))
            .map(|r| ms(pick(r)))
            .collect();
        picked.join(", ")
    };
    eprintln!(
        "{rounds_wanted} failovers: new counts visible after the kill, with a takeover: {}; after the failure, the cluster promoting: {} (promoted after {}); {} events, {keys} keys compared, {mismatches} mismatches",
        list(|r| r.visible, Some(Fault::KillTakeover)),
        rounds.iter().filter(|r| r.fault != Fault::KillTakeover).map(|r| format!("{:?} {}", r.fault, ms(r.visible))).collect::<Vec<_>>().join(", "),
        list(|r| r.promoted, None),
        events
    );
}

fn each_round_counted_within_a_second(rounds: &[Round]) {
    for (round, r) in rounds.iter().enumerate() {
        // The cluster's own share (node timeout, election) is not tally's: a round the cluster
        // promoted itself is bounded from the promotion.
        let (since, from) = match r.fault {
            Fault::KillTakeover => (r.visible, "the kill"),
            _ => (r.visible.saturating_sub(r.promoted), "the promotion"),
        };
        assert!(
            since <= Duration::from_secs(1),
            "failover {round} ({:?}): new counts visible {} after {from}",
            r.fault,
            ms(since)
        );
    }
}
