//! Redis loses part or all of tally's own state, or holds state that does not fit the topic:
//! nothing is counted twice, nothing retained is lost, and what needs an operator halts only the
//! partition concerned, visibly (metric, readiness), until `tally state repair`.

use tally_testkit::http;

use std::time::Duration;

use crate::common::{hourly, produce_batch, total, wait_for, Harness, Running};
use tally::config::OnStateLost;

const WAIT: Duration = Duration::from_secs(60);

fn fence(h: &Harness, group: &str, partition: i32) -> String {
    format!("tally:applied:{group}:{}:{partition}:0", h.topic)
}

/// Whether `partition` is halted for `reason`: the per-reason gauge counts it and readiness
/// names it.
fn halted(running: &Running, partition: i32, reason: &str) -> i64 {
    let named = running
        .health
        .halted_list()
        .iter()
        .any(|h| h.starts_with(&format!("partition {partition}:")));
    let count = running
        .metrics
        .recovery
        .partitions_halted
        .with_label_values(&[reason])
        .get();
    i64::from(named && count > 0)
}

/// `CONFIG SET maxmemory-policy` on the harness' Redis.
fn set_eviction_policy(h: &Harness, policy: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query(&mut h.conn())
        .unwrap();
}

/// Run the `tally` binary with `args` against this harness' Redis, topic and `group`; stdout.
fn tally_cli(h: &Harness, group: &str, args: &[&str]) -> String {
    // The command, then the options every command shares, then a subcommand's own.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg(args[0])
        .args(["--topic", &h.topic, "--group-id", group])
        .args(["--redis-url", &h.redis.url()])
        .args(&args[1..])
        .env("TALLY_LOG", "warn")
        .output()
        .expect("run tally");
    assert!(
        out.status.success(),
        "tally {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait until Redis applied everything produced on `partition`.
async fn wait_partition(h: &Harness, group: &str, partition: i32) {
    let want = h.produced[partition as usize];
    wait_for("partition applied", WAIT, || {
        h.applied(group, partition) == Some(want)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_fence_halts_its_partition_instead_of_counting_twice() {
    let mut h = Harness::new("fence-deleted", 2);
    let g = "g-fence-deleted";
    let mut config = h.config(g, hourly("fd"));
    let port = tally_testkit::local_redis::free_port().expect("free port");
    config.http.listen = format!("127.0.0.1:{port}");
    let running = h.start(config.clone());
    produce_batch(&mut h, 0, 2_000);
    h.wait_applied(g, WAIT).await;
    let applied_before = h.applied(g, 0).expect("fence exists");

    // The fence of partition 0 disappears (DEL, eviction, partial restore); counters stay.
    let _: () = redis::cmd("DEL")
        .arg(fence(&h, g, 0))
        .query(&mut h.conn())
        .unwrap();
    produce_batch(&mut h, 2_000, 1_000);
    wait_for("partition 0 halted", WAIT, || {
        halted(&running, 0, "fence_missing") == 1
    })
    .await;
    wait_partition(&h, g, 1).await;
    // Partition 1 counted its 500 new events; partition 0 counted nothing twice (before this
    // change it replayed from offset 0 and counted its 1,000 old events again).
    assert_eq!(total(&h, "fd:*"), 2_500);
    assert!(!running.health.ready(), "readiness reports the halt");
    let (status, body) = http::get(port, "/health/ready").expect("http answers");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("halted: partition 0:"), "{body}");
    let reasons = running.health.halted_list().join("; ");
    assert!(
        reasons.contains("partition 0") && reasons.contains("tally state repair"),
        "{reasons}"
    );
    assert_eq!(h.applied(g, 0), None, "nothing rewrote the fence by itself");

    // The operator looks, then restores the fence from the marker's copy with the CLI; the
    // running tally resumes the partition.
    let shown = tally_cli(&h, g, &["state"]);
    assert!(
        shown.contains(&format!("0\t0\t-\t{applied_before}\tmissing")),
        "{shown}"
    );
    let repaired = tally_cli(&h, g, &["state", "repair", "--partition", "0"]);
    assert!(
        repaired.contains(&format!("applied offset set to {applied_before}")),
        "{repaired}"
    );
    h.wait_applied(g, WAIT).await;
    wait_for("halt cleared", WAIT, || {
        halted(&running, 0, "fence_missing") == 0
    })
    .await;
    assert!(running.health.ready());
    let (status, body) = http::get(port, "/health/ready").expect("http answers");
    assert_eq!(status, 200, "{body}");
    running.stop().await;
    assert_eq!(total(&h, "fd:*"), 3_000, "every event counted exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_emptied_while_stopped_is_rebuilt_from_the_retained_log() {
    let mut h = Harness::new("lost-stopped", 2);
    let g = "g-lost-stopped";
    let config = h.config(g, hourly("ls"));
    produce_batch(&mut h, 0, 2_000);
    let first = h.start(config.clone());
    h.wait_applied(g, WAIT).await;
    first.stop().await;

    let _: () = redis::cmd("FLUSHALL").query(&mut h.conn()).unwrap();
    produce_batch(&mut h, 2_000, 100);
    let second = h.start(config);
    h.wait_applied(g, WAIT).await;
    let rebuilds = second.metrics.recovery.state_rebuilds.get();
    second.stop().await;
    // Before this change: 100 (the partitions resumed at Kafka's committed offset).
    assert_eq!(total(&h, "ls:*"), 2_100, "live windows recounted exactly");
    assert_eq!(rebuilds, 2, "both partitions rebuilt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_emptied_with_the_halt_policy_waits_for_the_operator() {
    let mut h = Harness::new("lost-halt", 2);
    let g = "g-lost-halt";
    let mut config = h.config(g, hourly("lh"));
    config.recovery.on_state_lost = OnStateLost::Halt;
    produce_batch(&mut h, 0, 1_000);
    let first = h.start(config.clone());
    h.wait_applied(g, WAIT).await;
    first.stop().await;

    let _: () = redis::cmd("FLUSHALL").query(&mut h.conn()).unwrap();
    produce_batch(&mut h, 1_000, 100);
    let second = h.start(config.clone());
    wait_for("both partitions halted", WAIT, || {
        halted(&second, 0, "state_lost") == 1 && halted(&second, 1, "state_lost") == 1
    })
    .await;
    assert_eq!(total(&h, "lh:*"), 0, "nothing counted while halted");
    // Without a copy in a marker, repair needs an explicit offset: recount from the start.
    assert!(tally::stream::state::repair(&config, None, 0, None)
        .await
        .is_err());
    for p in 0..2 {
        tally::stream::state::repair(&config, None, p, Some(0))
            .await
            .unwrap();
    }
    h.wait_applied(g, WAIT).await;
    second.stop().await;
    assert_eq!(total(&h, "lh:*"), 1_100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_emptied_while_running_is_rebuilt() {
    let mut h = Harness::new("lost-running", 3);
    let g = "g-lost-running";
    let running = h.start(h.config(g, hourly("lr")));
    produce_batch(&mut h, 0, 1_500);
    h.wait_applied(g, WAIT).await;
    // Kafka's commit tells a partition counted before (rebuilt) from a new one.
    h.wait_committed(g, WAIT).await;
    let _: () = redis::cmd("FLUSHALL").query(&mut h.conn()).unwrap();
    produce_batch(&mut h, 1_500, 300);
    h.wait_applied(g, WAIT).await;
    let rebuilds = running.metrics.recovery.state_rebuilds.get();
    running.stop().await;
    assert_eq!(total(&h, "lr:*"), 1_800);
    assert_eq!(rebuilds, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_fence_halts_only_its_partition() {
    let mut h = Harness::new("corrupt", 3);
    let g = "g-corrupt";
    let config = h.config(g, hourly("cf"));
    produce_batch(&mut h, 0, 900);
    let first = h.start(config.clone());
    h.wait_applied(g, WAIT).await;
    first.stop().await;

    // At start: partition 1's fence is another type. While running: partition 0's is text.
    let mut conn = h.conn();
    let _: () = redis::cmd("DEL")
        .arg(fence(&h, g, 1))
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(fence(&h, g, 1))
        .arg("x")
        .arg("y")
        .query(&mut conn)
        .unwrap();
    let running = h.start(config.clone());
    wait_for("partition 1 halted", WAIT, || {
        halted(&running, 1, "fence_corrupt") == 1
    })
    .await;
    let _: () = redis::cmd("SET")
        .arg(fence(&h, g, 0))
        .arg("not-a-number")
        .query(&mut conn)
        .unwrap();
    produce_batch(&mut h, 900, 300);
    wait_for("partition 0 halted", WAIT, || {
        halted(&running, 0, "fence_corrupt") == 1
    })
    .await;
    wait_partition(&h, g, 2).await;
    assert_eq!(
        total(&h, "cf:*"),
        1_000,
        "partition 2 went on; nothing doubled"
    );

    for p in 0..2 {
        tally::stream::state::repair(&config, None, p, None)
            .await
            .unwrap();
    }
    h.wait_applied(g, WAIT).await;
    running.stop().await;
    assert_eq!(total(&h, "cf:*"), 1_200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_offset_beyond_the_topic_halts_instead_of_dropping() {
    let mut h = Harness::new("beyond", 2);
    let g = "g-beyond";
    let config = h.config(g, hourly("be"));
    produce_batch(&mut h, 0, 200);
    let first = h.start(config.clone());
    h.wait_applied(g, WAIT).await;
    first.stop().await;

    // As if the topic had been recreated: Redis has applied far more than the topic holds.
    tally::stream::state::repair(&config, None, 0, Some(11_000))
        .await
        .unwrap();
    produce_batch(&mut h, 200, 200);
    let running = h.start(config.clone());
    wait_for("partition 0 halted", WAIT, || {
        halted(&running, 0, "beyond_end") == 1
    })
    .await;
    wait_partition(&h, g, 1).await;
    let resets = running
        .metrics
        .recovery
        .offset_resets
        .with_label_values(&["beyond_end"])
        .get();
    assert!(resets >= 1);
    // Before this change the 100 new events of partition 0 were consumed and silently dropped.
    assert_eq!(total(&h, "be:*"), 300);
    tally::stream::state::repair(&config, None, 0, Some(100))
        .await
        .unwrap();
    h.wait_applied(g, WAIT).await;
    running.stop().await;
    assert_eq!(total(&h, "be:*"), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_refused_at_start_and_at_runtime() {
    let mut h = Harness::with_redis("eviction", 1, &["--maxmemory-policy", "allkeys-lru"]);
    let g = "g-eviction";
    let config = h.config(g, hourly("ev"));
    let refused = h.start(config.clone());
    let result = tokio::time::timeout(WAIT, refused.handle)
        .await
        .expect("tally exits")
        .expect("task joins");
    let error = format!("{:#}", result.expect_err("an evicting redis is refused"));
    assert!(
        error.contains("maxmemory-policy") && error.contains("allkeys-lru"),
        "{error}"
    );

    let mut allowed = config.clone();
    allowed.redis.allow_eviction = true;
    produce_batch(&mut h, 0, 100);
    let running = h.start(allowed);
    h.wait_applied(g, WAIT).await;
    running.stop().await;
    assert_eq!(total(&h, "ev:*"), 100, "allowed explicitly");

    set_eviction_policy(&h, "noeviction");
    let running = h.start(config);
    produce_batch(&mut h, 100, 100);
    h.wait_applied(g, WAIT).await;
    // Someone switches eviction on while tally runs: writes stop, readiness drops.
    set_eviction_policy(&h, "volatile-lru");
    let m = running.metrics.clone();
    wait_for("eviction detected", WAIT, || {
        m.redis.eviction_policy_unsafe.get() == 1
    })
    .await;
    produce_batch(&mut h, 200, 100);
    let health = running.health.clone();
    wait_for("not ready", WAIT, || !health.ready()).await;
    assert_eq!(
        total(&h, "ev:*"),
        200,
        "nothing written under an evicting policy"
    );
    set_eviction_policy(&h, "noeviction");
    h.wait_applied(g, WAIT).await;
    running.stop().await;
    assert_eq!(total(&h, "ev:*"), 300);
}

/// `INFO persistence`'s `field`.
fn persistence(h: &Harness, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query(&mut h.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The Operate page "Backing up and restoring", followed: a copy made with BGSAVE while tally
/// counts, more events counted after it, tally stopped, Redis restarted from the copy, tally
/// started again. Each partition resumes at the copy's applied offset (not at Kafka's committed
/// offset, which is past it) and replays the rest from Kafka: every count exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restored_from_an_older_copy_replays_to_exact_counts() {
    let mut h = Harness::new("restored", 2);
    let g = "g-restored";
    let config = h.config(g, hourly("rc"));
    produce_batch(&mut h, 0, 1_000);
    let first = h.start(config.clone());
    h.wait_applied(g, WAIT).await;

    // The backup: BGSAVE (answered once the fork has started), wait until it is written, copy.
    let _: String = redis::cmd("BGSAVE").query(&mut h.conn()).unwrap();
    wait_for("the snapshot written", WAIT, || {
        persistence(&h, "rdb_bgsave_in_progress") == "0"
    })
    .await;
    assert_eq!(persistence(&h, "rdb_last_bgsave_status"), "ok");
    let copy = h.redis.dir.join("copy.rdb");
    std::fs::copy(h.redis.dir.join("dump.rdb"), &copy).unwrap();

    produce_batch(&mut h, 1_000, 500);
    h.wait_applied(g, WAIT).await;
    h.wait_committed(g, WAIT).await;
    first.stop().await;
    assert_eq!(total(&h, "rc:*"), 1_500);

    // The restore: the server stopped, the copy put in its directory, the server started.
    h.redis.stop();
    std::fs::copy(&copy, h.redis.dir.join("dump.rdb")).unwrap();
    h.redis.restart().unwrap();
    assert_eq!(total(&h, "rc:*"), 1_000, "Redis holds the copy");

    let second = h.start(config);
    h.wait_applied(g, WAIT).await;
    second.stop().await;
    // Resuming at Kafka's committed offset would leave 1,000: the 500 after the copy lost.
    assert_eq!(
        total(&h, "rc:*"),
        1_500,
        "the events after the copy replayed"
    );
}
