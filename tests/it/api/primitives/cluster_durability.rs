//! Durable decisions on Redis Cluster across a primary failover: each decision's `WAIT` goes to
//! the primary of its own slot, over the connection its write used, so a shard without an
//! in-sync replica holds up only its own decisions.
//!
//! Three primaries, one replica each, tally serving quotas with `durability = { replicas = 1 }`
//! spread over the three shards. One primary is killed (kill -9) and its replica takes over at
//! once (`CLUSTER FAILOVER TAKEOVER`): the promoted primary has no replica until the killed node
//! comes back and follows it. Measured from the takeover: every quota of the other two shards
//! answers `admitted` within a bound, and then never `not-replicated` (their replicas are in
//! sync); the failed-over shard's quotas answer `not-replicated` while its new primary has no
//! replica (checked on the server), and `admitted` within a bound once the returning node is in
//! sync (it says its link is up and caught up, and the new primary lists it online). The ground truth is each quota's taken count read from the cluster: every unit taken is
//! one admitted, one answered `not-replicated` (taken, not granted), or one whose outcome was
//! answered unknown; nothing else.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalCluster;

use crate::common::process::TallyProcess;
use crate::common::replica::{cli, signal, wait_synced};
use crate::stream::failover::replicas_of;

/// Quotas spread over the shards by their names' hash tags.
const QUOTAS: usize = 12;
/// How long the other shards may take to answer normally after the takeover, and the failed-over
/// shard after its new replica is in sync.
const BOUND: Duration = Duration::from_secs(3);

/// How tally answered one take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Answer {
    Admitted,
    /// 503 `not-replicated`: taken, not granted.
    NotReplicated,
    /// 503 `outcome-unknown`: maybe taken.
    Unknown,
    /// 503 `redis-unavailable`: not run (no connection, or Redis refused it, a MOVED included).
    NotRun,
}

struct Takes {
    client: Client,
    port: u16,
    /// Answers per quota.
    answers: BTreeMap<String, BTreeMap<Answer, u64>>,
    next_user: u64,
}

impl Takes {
    fn take(&mut self, quota: &str) -> Answer {
        self.next_user += 1;
        let body = format!(r#"{{"quota":"{quota}","user":"u{}"}}"#, self.next_user);
        let answer = self.client.post_json(self.port, "/v1/quota", &body);
        let (status, body) = match answer {
            Ok(a) => (
                a.status,
                serde_json::from_str::<Value>(&a.body).unwrap_or(Value::Null),
            ),
            Err(_) => (0, Value::Null),
        };
        let kind = body["type"].as_str().unwrap_or("");
        let answer = match status {
            200 if body["outcome"] == "admitted" => Answer::Admitted,
            503 if kind.ends_with("/not-replicated") => Answer::NotReplicated,
            503 if kind.ends_with("/outcome-unknown") => Answer::Unknown,
            503 if kind.ends_with("/redis-unavailable") => Answer::NotRun,
            0 => Answer::NotRun,
            _ => panic!("{quota}: {status} {body}"),
        };
        *self
            .answers
            .entry(quota.to_string())
            .or_default()
            .entry(answer)
            .or_default() += 1;
        answer
    }

    /// Take one unit of each of `quotas` per round until a whole round is admitted; when that
    /// round ended, after `from`, or None after 30 s.
    fn until_admitted(&mut self, quotas: &[String], from: Instant) -> Option<Duration> {
        while from.elapsed() < Duration::from_secs(30) {
            let answers: Vec<Answer> = quotas.iter().map(|q| self.take(q)).collect();
            if answers.iter().all(|a| *a == Answer::Admitted) {
                return Some(from.elapsed());
            }
        }
        None
    }

    fn count(&self, quota: &str, answer: Answer) -> u64 {
        self.answers
            .get(quota)
            .and_then(|a| a.get(&answer))
            .copied()
            .unwrap_or(0)
    }
}

fn quota_name(i: usize) -> String {
    format!("q{i:02}")
}

/// The primary holding quota `name`'s taken count, and the count.
fn taken(primaries: &[u16], name: &str) -> Option<(u16, u64)> {
    primaries.iter().find_map(|&port| {
        let keys = cli(port, &["KEYS", &format!("*quota:{name}:taken:*")]);
        let key = keys.lines().next().filter(|k| !k.is_empty())?;
        Some((port, cli(port, &["GET", key]).trim().parse().ok()?))
    })
}

fn connected_replicas(port: u16) -> u64 {
    cli(port, &["INFO", "replication"])
        .lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether `primary` counts `replica` as an online replica (a `WAIT` counts only those; the
/// replica's own `master_link_status:up` comes first).
/// Until a replica of `primary` acknowledges one of its writes within the quotas' 200 ms: a `SET`
/// of a key in one of its slots, then `WAIT 1 200` on the same connection.
fn wait_acknowledged(primary: u16) {
    let nodes = cli(primary, &["CLUSTER", "NODES"]);
    let mine = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .expect("myself");
    let ranges: Vec<(u32, u32)> = mine
        .split_whitespace()
        .skip(8)
        .filter_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    let key = (0..10_000)
        .map(|i| format!("ack-probe-{i}"))
        .find(|k| {
            let slot: u32 = cli(primary, &["CLUSTER", "KEYSLOT", k])
                .trim()
                .parse()
                .unwrap();
            ranges.iter().any(|&(a, b)| (a..=b).contains(&slot))
        })
        .expect("a key of the primary's slots");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut child = std::process::Command::new("redis-cli")
            .args(["-p", &primary.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let script = format!("SET {key} 1\nWAIT 1 200\n");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.lines().last().map(str::trim) == Some("1") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no replica of {primary} acknowledged a write: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn online_replica(primary: u16, replica: u16) -> bool {
    let port = format!("port={replica},");
    cli(primary, &["INFO", "replication"])
        .lines()
        .any(|l| l.starts_with("slave") && l.contains(&port) && l.contains("state=online"))
}

fn config(cluster: &LocalCluster) -> String {
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let mut config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = [{}]\nresponse_timeout = \"2s\"\n",
        nodes.join(", ")
    );
    for i in 0..QUOTAS {
        config += &format!(
            "[[request.quotas]]\nname = \"{}\"\nsize = 100000\n\
             durability = {{ replicas = 1, timeout = \"200ms\" }}\n",
            quota_name(i)
        );
    }
    config
}

#[test]
fn after_a_cluster_failover_durable_decisions_answer_once_their_shard_has_a_replica() {
    let mut cluster = LocalCluster::start(3, 1).unwrap();
    let tally =
        TallyProcess::start_command_with_http("serve", &config(&cluster), "cluster-durability", "");
    let mut takes = Takes {
        client: Client::new(Duration::from_secs(10)),
        port: tally.port,
        answers: BTreeMap::new(),
        next_user: 0,
    };
    let all: Vec<String> = (0..QUOTAS).map(quota_name).collect();
    assert!(
        takes.until_admitted(&all, Instant::now()).is_some(),
        "a healthy cluster never admitted a round: {}",
        tally.log()
    );
    let (victim, replica, failed, others) = victim_and_shards(&cluster, &all);

    signal(cluster.node_mut(victim).unwrap().pid().unwrap(), "-KILL");
    cluster.node_mut(victim).unwrap().stop();
    assert!(cli(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]).contains("OK"));
    let takeover = Instant::now();
    let before: BTreeMap<String, BTreeMap<Answer, u64>> = takes.answers.clone();
    let others_ok = the_other_shards_answer_while_one_has_no_replica(
        &mut takes, &tally, takeover, replica, &failed, &others,
    );
    let failed_ok = the_returning_node_brings_its_shard_back(
        &mut cluster,
        &mut takes,
        &tally,
        victim,
        replica,
        &failed,
        &others,
    );
    eprintln!(
        "after the takeover: other shards admitted after {:?}; the failed-over shard admitted \
         {:?} after its replica synced; answers {:?}",
        others_ok, failed_ok, takes.answers
    );
    every_unit_taken_was_answered(&cluster, &takes, &all, &others, &before);
}

/// Which shard holds each quota; the victim is the primary of the first, with its replica
/// (in sync), the quotas of its shard, and the others'.
fn victim_and_shards(
    cluster: &LocalCluster,
    all: &[String],
) -> (u16, u16, Vec<String>, Vec<String>) {
    let primaries = cluster.primaries();
    let owner: BTreeMap<String, u16> = all
        .iter()
        .map(|q| (q.clone(), taken(&primaries, q).expect("a taken count").0))
        .collect();
    let victim = owner[&all[0]];
    let replica = *replicas_of(victim).first().expect("the victim's replica");
    wait_synced(victim, replica);
    let (failed, others): (Vec<String>, Vec<String>) =
        all.iter().cloned().partition(|q| owner[q] == victim);
    assert!(
        owner
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == 3,
        "the quotas do not cover the three shards: {owner:?}"
    );
    (victim, replica, failed, others)
}

/// The other shards answer normally, whatever the failed-over one does.
/// The promoted primary has no replica: its shard's decisions are really not replicated.
/// Returns how soon after the takeover the other shards admitted.
fn the_other_shards_answer_while_one_has_no_replica(
    takes: &mut Takes,
    tally: &TallyProcess,
    takeover: Instant,
    replica: u16,
    failed: &[String],
    others: &[String],
) -> Duration {
    let others_ok = takes.until_admitted(others, takeover);
    assert!(
        others_ok.is_some_and(|d| d <= BOUND),
        "the other shards' decisions took {others_ok:?} to be admitted after the takeover \
         (answers {:?})\n{}",
        takes.answers,
        tally.log()
    );
    assert_eq!(connected_replicas(replica), 0);
    let mut unreplicated = 0;
    for _ in 0..10 {
        for q in others {
            assert_eq!(
                takes.take(q),
                Answer::Admitted,
                "{q}: its replica is in sync"
            );
        }
        for q in failed {
            let answer = takes.take(q);
            assert_ne!(answer, Answer::Admitted, "{q}: admitted without a replica");
            unreplicated += u64::from(answer == Answer::NotReplicated);
        }
    }
    assert!(
        unreplicated > 0,
        "no decision of the failed-over shard reached it"
    );
    others_ok.unwrap()
}

/// The killed node comes back, follows the new primary and syncs. Returns how soon after it synced its shard's
/// decisions were admitted.
fn the_returning_node_brings_its_shard_back(
    cluster: &mut LocalCluster,
    takes: &mut Takes,
    tally: &TallyProcess,
    victim: u16,
    replica: u16,
    failed: &[String],
    others: &[String],
) -> Duration {
    cluster.node_mut(victim).unwrap().restart().unwrap();
    wait_synced(replica, victim);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !online_replica(replica, victim) {
        assert!(
            Instant::now() < deadline,
            "the new primary never saw its replica online"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Online is not yet acknowledging: decisions are due normally once a replica confirms a write.
    wait_acknowledged(replica);
    let synced = Instant::now();
    let refused_before: u64 = failed
        .iter()
        .map(|q| takes.count(q, Answer::NotReplicated))
        .sum();
    let failed_ok = takes.until_admitted(failed, synced);
    let refused_after: u64 = failed
        .iter()
        .map(|q| takes.count(q, Answer::NotReplicated))
        .sum::<u64>()
        - refused_before;
    for q in others {
        assert_eq!(takes.take(q), Answer::Admitted, "{q}");
    }
    assert!(
        failed_ok.is_some_and(|d| d <= BOUND),
        "the failed-over shard's decisions took {failed_ok:?} to be admitted once its replica \
         was in sync (answers {:?})\n{}",
        takes.answers,
        tally.log()
    );
    assert_eq!(
        refused_after, 0,
        "the failed-over shard answered not-replicated with its replica online"
    );
    failed_ok.unwrap()
}

/// Ground truth: every unit taken was admitted, answered not-replicated, or answered unknown.
fn every_unit_taken_was_answered(
    cluster: &LocalCluster,
    takes: &Takes,
    all: &[String],
    others: &[String],
    before: &BTreeMap<String, BTreeMap<Answer, u64>>,
) {
    let primaries = cluster.primaries();
    for q in all {
        let (_, units) = taken(&primaries, q).expect("a taken count");
        let admitted = takes.count(q, Answer::Admitted);
        let refused = takes.count(q, Answer::NotReplicated);
        let unknown = takes.count(q, Answer::Unknown);
        assert!(
            admitted + refused <= units && units <= admitted + refused + unknown,
            "{q}: {units} taken, {admitted} admitted, {refused} not replicated, {unknown} unknown"
        );
        if others.contains(q) {
            let earlier = |a| before.get(q).and_then(|m| m.get(&a)).copied().unwrap_or(0);
            assert_eq!(
                (
                    refused - earlier(Answer::NotReplicated),
                    unknown - earlier(Answer::Unknown)
                ),
                (0, 0),
                "{q}: a healthy shard's decisions answered not-replicated or unknown"
            );
        }
    }
}
