//! The stream path on Redis Sentinel, through failovers with replication lag and SIGKILLs of
//! tally: a primary, a replica and three sentinels; tally (`tally run`, its own process) counts a
//! topic produced at 2,000 events/s. Six times: the replica is cut off (SIGSTOP and
//! `CLIENT KILL TYPE replica`), a flush lands on the primary alone, the primary is SIGKILLed, the
//! replica continued; the sentinels promote it (losing that flush: counts and fences go back
//! together); the old primary restarts empty, as a replica of the new one. Every other
//! round tally is SIGKILLed too, in the middle of the failover, and restarted; then tally is
//! SIGKILLed every 1 to 3 s until the producer is done (60 s in all). At the end every
//! key is compared with the truth. Printed per failover, measured from outside: from the kill
//! until the first sentinel names the new primary (the sentinels' share: down-after 1 s, their
//! vote, the promotion, their next INFO of it), and from then until tally's first flush lands
//! on it, until Redis holds every event produced before that moment, and until new counts are
//! visible (an event produced after the kill counted on every partition), asserted <= 1 s in
//! every round where tally was not killed too.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tally_testkit::local_redis::{free_port, LocalRedis};

use crate::common::accuracy;
use crate::common::process::{kafka_toml, BrokerProcess, TallyProcess};
use crate::common::replica::{cli, cut_replica, port_of, signal, wait_synced};
use crate::common::sentinel::{wait_until, Sentinels};
use crate::common::stream::{self, Stream, COUNTERS};
use crate::stream::exactly_once::{finish_and_compare, PARTITIONS};

/// Failovers; `TALLY_SENTINEL_ROUNDS` overrides (the failover measurement runs 10).
const ROUNDS: usize = 6;

/// `TALLY_SENTINEL_MEASURE=1`: no SIGKILL of tally during the failovers, so every round measures
/// the failover alone (run in release: `cargo nextest run --release -E
/// 'test(/stream::sentinel::/)'`); the crash loop after them still runs.
fn measuring() -> bool {
    std::env::var("TALLY_SENTINEL_MEASURE").is_ok_and(|v| v == "1")
}

/// Applied offsets on the server at `port` (-1 where none, or unreadable).
fn applied(port: u16, group: &str, topic: &str) -> Vec<i64> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .map(|mut c| stream::applied(&mut c, group, topic, PARTITIONS))
        .unwrap_or_else(|_| vec![-1; PARTITIONS as usize])
}

/// Whether the server at `port` has applied at least `offsets` on every partition.
fn holds(port: u16, group: &str, topic: &str, offsets: &[i64]) -> bool {
    applied(port, group, topic)
        .iter()
        .zip(offsets)
        .all(|(a, o)| a >= o)
}

/// What one failover measured.
struct Round {
    /// From the naming of the new primary until tally's first flush on it.
    first_flush: Duration,
    /// From the naming until Redis held everything produced before it.
    took: Duration,
    /// From the kill until the first sentinel named the new primary.
    named: Duration,
    /// From the kill until an event produced after it was counted, on every partition.
    visible: Duration,
    /// tally was SIGKILLed and restarted in this failover (not measured).
    restarted: bool,
}

const TOPIC: &str = "sentinel-stream";
const GROUP: &str = "g-sentinel-stream";
/// A replica syncs at once (the default waits 5 s for more replicas to share the transfer).
const FAST: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// The servers (a primary and a replica, by port), their sentinels, and tally's configuration.
struct Deployment {
    servers: HashMap<u16, LocalRedis>,
    sentinels: Sentinels,
    cfg: String,
    /// Reads the topic's end on every partition.
    watermarks: BaseConsumer,
    started: Instant,
}

impl Deployment {
    fn start(bootstrap: &str) -> Deployment {
        let mut servers: HashMap<u16, LocalRedis> = HashMap::new();
        let first = LocalRedis::start(&FAST).unwrap();
        let p = port_of(&first);
        servers.insert(p, first);
        let r = free_port().unwrap();
        let replica = LocalRedis::start_on(
            r,
            &["--replicaof", "127.0.0.1", &p.to_string(), FAST[0], FAST[1]],
        )
        .unwrap();
        servers.insert(r, replica);
        wait_synced(p, r);
        let sentinels = Sentinels::start(p, 1);
        // The defaults of the Redis timeouts and of the flush retries: what a user gets.
        let kafka = kafka_toml(bootstrap, TOPIC, GROUP);
        let cfg = format!(
            r#"{kafka}{}[flush]
interval = "50ms"
shutdown_grace = "20s"
{COUNTERS}"#,
            sentinels.redis_toml()
        );
        let watermarks: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .unwrap();
        Deployment {
            servers,
            sentinels,
            cfg,
            watermarks,
            started: Instant::now(),
        }
    }

    /// The end of the topic on every partition.
    fn high(&self) -> Vec<i64> {
        (0..PARTITIONS)
            .map(|part| {
                self.watermarks
                    .fetch_watermarks(TOPIC, part, Duration::from_secs(5))
                    .unwrap()
                    .1
            })
            .collect()
    }

    /// One failover with lag, measured; tally is SIGKILLed and restarted in it every other
    /// round (unless measuring). Returns what it measured and the acknowledged offsets it
    /// rolled back.
    fn failover(
        &mut self,
        round: usize,
        tally: &mut TallyProcess,
        kills: &mut usize,
    ) -> (Round, i64) {
        let primary = self.sentinels.primary().unwrap();
        let replica = *self.servers.keys().find(|&&port| port != primary).unwrap();
        let lagging = self.lose_a_flush(round, primary, replica);
        let restarted = round % 2 == 1 && !measuring();
        if restarted {
            tally.kill9();
            *kills += 1;
            *tally = TallyProcess::start(&self.cfg, "sentinel-stream");
        }
        let measured = self.measure(round, replica, &lagging, tally, restarted);
        self.restore(round, primary, replica);
        let lost = lagging
            .acknowledged
            .iter()
            .zip(&lagging.rolled_back)
            .map(|(a, b)| (a - b).max(0))
            .sum::<i64>();
        (measured, lost)
    }

    /// From a caught-up tally, the replica is cut off, a flush lands on the primary alone, and
    /// the primary dies (the replica, without that flush, goes on).
    fn lose_a_flush(&mut self, round: usize, primary: u16, replica: u16) -> Lagging {
        wait_synced(primary, replica);
        // Each failover starts from a caught-up tally: what is measured is the failover alone.
        let now = self.high();
        let catching_up = Instant::now();
        wait_until(
            &format!("round {round}: tally never caught up before the failover"),
            Duration::from_secs(60),
            || holds(primary, GROUP, TOPIC, &now),
        );
        // The replica is cut off; wait for flushes to land on the primary alone.
        cut_replica(primary, &self.servers[&replica]);
        let before = applied(primary, GROUP, TOPIC);
        wait_until(
            &format!("round {round}: no flush landed on the primary alone"),
            Duration::from_secs(10),
            || {
                applied(primary, GROUP, TOPIC).iter().sum::<i64>()
                    > before.iter().sum::<i64>() + 200
            },
        );
        eprintln!("round {round}: caught up in {:?}", catching_up.elapsed());
        let acknowledged = applied(primary, GROUP, TOPIC);
        // The end of the topic when the primary dies: an applied offset past it is an event
        // produced after the kill.
        let end = self.high();
        // The primary dies; the replica, without those flushes, goes on.
        self.servers.get_mut(&primary).unwrap().stop();
        let killed = Instant::now();
        signal(self.servers[&replica].pid().unwrap(), "-CONT");
        // What the promotion will expose, read before any sentinel names the replica (so
        // before tally can write to it): tally applies the lost flushes again within
        // milliseconds of learning of it, and read after that, this would hide them and
        // measure the next regular flush instead.
        // Anything the replica still had in its socket from before the cut is applied by the
        // time it sees the link closed.
        wait_until(
            &format!("round {round}: the replica never saw its link down"),
            Duration::from_secs(10),
            || cli(replica, &["INFO", "replication"]).contains("master_link_status:down"),
        );
        let rolled_back = applied(replica, GROUP, TOPIC);
        Lagging {
            acknowledged,
            end,
            killed,
            rolled_back,
        }
    }

    /// The promotion, as clients can learn it (the first sentinel that names the replica),
    /// and tally's share after it.
    fn measure(
        &self,
        round: usize,
        replica: u16,
        lagging: &Lagging,
        tally: &TallyProcess,
        restarted: bool,
    ) -> Round {
        wait_until(
            &format!("round {round}: the sentinels never promoted the replica"),
            Duration::from_secs(30),
            || self.sentinels.names(replica),
        );
        let promoted = Instant::now();
        let produced = self.high();
        // tally's own share: its first flush on the new primary (an applied offset moves past
        // where the failover left it).
        wait_until(
            &format!("round {round}: no flush landed on the new primary"),
            Duration::from_secs(60),
            || {
                applied(replica, GROUP, TOPIC)
                    .iter()
                    .zip(&lagging.rolled_back)
                    .any(|(a, b)| a > b)
            },
        );
        let first_flush = promoted.elapsed();
        wait_until(
            &format!(
                "round {round}: redis never held what was produced before the promotion; log: {}",
                tally.log()
            ),
            Duration::from_secs(60),
            || holds(replica, GROUP, TOPIC, &produced),
        );
        let took = promoted.elapsed();
        // New counts visible: an event produced after the kill is counted, on every partition.
        wait_until(
            &format!("round {round}: no event produced after the kill was counted"),
            Duration::from_secs(60),
            || {
                applied(replica, GROUP, TOPIC)
                    .iter()
                    .zip(&lagging.end)
                    .all(|(a, e)| a > e)
            },
        );
        let visible = lagging.killed.elapsed();
        let named = promoted - lagging.killed;
        eprintln!(
            "round {round}: the first sentinel named the new primary {named:?} after the kill; first flush {first_flush:?} and everything produced before counted {took:?} after that; new counts visible {visible:?} after the kill ({:?} after the naming), {:?} into the test",
            visible.saturating_sub(named),
            self.started.elapsed()
        );
        if visible.saturating_sub(named) > Duration::from_secs(1) {
            let log = tally.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("round {round}: tally's last log lines:");
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        }
        Round {
            first_flush,
            took,
            named,
            visible,
            restarted,
        }
    }

    /// Only now (measured above without them, while they happen in a real failover too): the
    /// sentinels finish the failover, and the old primary comes back.
    fn restore(&mut self, round: usize, primary: u16, replica: u16) {
        wait_until(
            &format!("round {round}: the sentinels never agreed on the new primary"),
            Duration::from_secs(30),
            || self.sentinels.switched(replica),
        );
        // The old primary comes back empty, as a replica of the new one (the configuration the
        // sentinels rewrite on failover says so).
        let follower = [
            "--replicaof",
            "127.0.0.1",
            &replica.to_string(),
            FAST[0],
            FAST[1],
        ];
        self.servers
            .insert(primary, LocalRedis::start_on(primary, &follower).unwrap());
        wait_until(
            &format!(
                "round {round}: the old primary never replicated the new one: {} / new primary: {}",
                cli(primary, &["INFO", "replication"]),
                cli(replica, &["INFO", "replication"])
            ),
            Duration::from_secs(30),
            || cli(primary, &["INFO", "replication"]).contains("master_link_status:up"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.sentinels.settled(replica, 1) {
            assert!(
                Instant::now() < deadline,
                "round {round}: the sentinels never settled on {replica}: {}",
                self.sentinels.describe()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A failover's state once the primary is dead and before the promotion.
struct Lagging {
    /// Applied offsets the primary acknowledged (its replica cut off).
    acknowledged: Vec<i64>,
    /// The topic's end at the kill.
    end: Vec<i64>,
    killed: Instant,
    /// Applied offsets on the replica that will be promoted.
    rolled_back: Vec<i64>,
}

#[test]
fn sentinel_failovers_with_lag_and_sigkills_count_exactly() {
    let rounds = std::env::var("TALLY_SENTINEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS);
    // librdkafka's mock cluster. tansu was tried: its group coordinator moved
    // the partitions between tally's two lanes every 1-3 s with nothing failing, so catching
    // up took 3-6 s before any failover.
    let broker = BrokerProcess::start(&[(TOPIC, PARTITIONS)]);
    let bootstrap = broker.bootstrap.clone();
    let mut deployment = Deployment::start(&bootstrap);
    let stream = Stream {
        // 10 s of events per failover (2,000/s).
        n: 20_000 * rounds as u64,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    // `TALLY_SENTINEL_LINGER_MS`: the producer's linger (5 ms, librdkafka's and Java's default).
    // The mock cluster answers a fetch with one producer batch per partition, so replaying a
    // rolled-back range costs one round trip per batch: longer lingers, fewer batches.
    let linger = std::env::var("TALLY_SENTINEL_LINGER_MS").unwrap_or_else(|_| "5".into());
    let (producer, sent) =
        stream.produce_with(&bootstrap, TOPIC, 2_000, &[("linger.ms", linger.as_str())]);

    deployment.started = Instant::now();
    let cfg = deployment.cfg.clone();
    let mut tally = TallyProcess::start(&cfg, "sentinel-stream");
    assert!(tally.wait_working(), "{}", tally.log());
    let (mut resumed, mut lost, mut kills) = (Vec::new(), 0i64, 0);
    for round in 0..rounds {
        let (measured, rolled_back) = deployment.failover(round, &mut tally, &mut kills);
        resumed.push(measured);
        lost += rolled_back;
    }
    // Then a crash loop until the producer is done: SIGKILL every 1 to 3 s.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(rand::random());
    while kills < 5 || !producer.is_finished() {
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..3000)));
        tally.kill9();
        kills += 1;
        tally = TallyProcess::start(&cfg, "sentinel-stream");
    }
    let produced = producer.join().unwrap();
    assert_eq!(sent.load(Ordering::Relaxed), stream.n);
    tally.kill9();
    let now = deployment.sentinels.primary().unwrap();
    let url = format!("redis://127.0.0.1:{now}");
    let (keys, mismatches) = finish_and_compare(&cfg, &url, GROUP, TOPIC, &produced, &stream);
    let ms = |pick: fn(&Round) -> Duration| -> Vec<u128> {
        resumed.iter().map(|r| pick(r).as_millis()).collect()
    };
    eprintln!(
        "sentinel stream: {rounds} failovers with lag ({lost} acknowledged offsets rolled back in all), {kills} SIGKILLs of tally; from the kill until the first sentinel named the new primary (ms): {:?}; from then until tally's first flush on it (ms): {:?}, until redis held every event produced before it (ms): {:?}, until new counts were visible (ms): {:?} ({:?} from the kill); {} events, {keys} keys compared, {mismatches} mismatches",
        ms(|r| r.named),
        ms(|r| r.first_flush),
        ms(|r| r.took),
        ms(|r| r.visible.saturating_sub(r.named)),
        ms(|r| r.visible),
        stream.n
    );
    // The sentinels' share (down-after-milliseconds, their vote, the promotion, and up to a
    // second until their INFO sees it) is not tally's: bounded from the naming.
    for (round, r) in resumed.iter().enumerate().filter(|(_, r)| !r.restarted) {
        assert!(
            r.visible.saturating_sub(r.named) <= Duration::from_secs(1),
            "round {round}: new counts visible {:?} after the first sentinel named the new primary",
            r.visible.saturating_sub(r.named)
        );
    }
    assert!(
        lost > 0,
        "no failover lost an acknowledged flush: the scenario did not happen"
    );
    assert_eq!(mismatches, 0);
    accuracy(
        "stream counts",
        "Sentinel failovers with replication lag + tally SIGKILL",
        "none (applied again from memory, or replayed from Kafka)",
        format!("{keys} keys, {mismatches} wrong ({rounds} failovers, {kills} kills)"),
        "every key",
        0,
        0,
    );
}
