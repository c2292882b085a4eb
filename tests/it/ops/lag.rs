//! The lag shown (`tally_consumer_lag_messages`, `tally_consumer_lag_seconds`, the status page)
//! is the broker's end minus what Redis has applied, for every owned partition, including one
//! that is halted or not being fetched: compared, partition by partition, with what the test
//! produced. Before the lag probe, a halted partition's lag froze at librdkafka's last report
//! (127 while the backlog grew to 3,277), and a stalled one read whatever the last statistics
//! said.

use std::time::Duration;

use crate::common::{hourly, produce_batch, wait_for, Harness, Running};

const WAIT: Duration = Duration::from_secs(60);
/// The probe's interval in these tests: the lag must follow within a few of them.
const LAG_INTERVAL: Duration = Duration::from_millis(300);
const FOLLOWS_WITHIN: Duration = Duration::from_secs(10);

fn lag(running: &Running, partition: i32) -> Option<i64> {
    sample(running, "tally_consumer_lag_messages", partition).map(|v| v as i64)
}

fn lag_seconds(running: &Running, partition: i32) -> Option<f64> {
    sample(running, "tally_consumer_lag_seconds", partition)
}

/// The value of `/metrics`' series of `family` for `partition` (of the one topic), if any.
fn sample(running: &Running, family: &str, partition: i32) -> Option<f64> {
    let start = format!("{family}{{partition=\"{partition}\",topic=");
    let text = running.metrics.render();
    let line = text.lines().find(|l| l.starts_with(&start))?;
    line.rsplit(' ').next()?.parse().ok()
}

/// The status page's lag of `partition`, as `/v1/status` answers it.
fn status_lag(running: &Running, partition: i32) -> Option<i64> {
    let view = running.metrics.status.view(&running.health, true);
    let view = serde_json::to_value(view).expect("status serializes");
    view["stream"]["partitions"]
        .as_array()?
        .iter()
        .find(|p| p["partition"] == partition)?["lag"]
        .as_i64()
}

/// Tally on two partitions, the probe every [`LAG_INTERVAL`], with 1,000 events counted and
/// every partition's lag seen at 0.
async fn caught_up(name: &str, group: &str) -> (Harness, Running) {
    let mut h = Harness::new(name, 2);
    let mut config = h.config(group, hourly(name));
    config.kafka.lag_interval = LAG_INTERVAL;
    let running = h.start(config);
    produce_batch(&mut h, 0, 1_000);
    h.wait_applied(group, WAIT).await;
    for p in 0..2 {
        wait_lag(&running, p, 0, "caught up").await;
    }
    (h, running)
}

async fn wait_lag(running: &Running, partition: i32, expected: i64, what: &str) {
    wait_for(what, FOLLOWS_WITHIN, || {
        lag(running, partition) == Some(expected)
            && status_lag(running, partition) == Some(expected)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_partitions_lag_follows_its_backlog() {
    let g = "g-lag-halted";
    let (mut h, running) = caught_up("lag-halted", g).await;
    let applied = h.applied(g, 0).expect("partition 0's fence");

    // Partition 0 halts (its fence is deleted; tally refuses to guess where it was).
    let fence = format!("tally:applied:{g}:{}:0:0", h.topic);
    let _: () = redis::cmd("DEL").arg(&fence).query(&mut h.conn()).unwrap();
    produce_batch(&mut h, 1_000, 400);
    wait_for("partition 0 halted", WAIT, || {
        running
            .health
            .halted_list()
            .iter()
            .any(|r| r.contains("partition 0"))
    })
    .await;
    // Its backlog grows while it is halted, and the lag follows it exactly; partition 1 counts.
    for more in [0, 300, 700] {
        let payload = br#"{"app_id":"a1","device_id":"d1"}"#;
        for _ in 0..more {
            h.produce(0, payload, Some(chrono::Utc::now().timestamp_millis()));
        }
        h.flush_producer();
        let truth = h.produced[0] - applied;
        wait_lag(&running, 0, truth, &format!("partition 0's lag = {truth}")).await;
    }
    let end = h.produced[1];
    wait_for("partition 1 applied", WAIT, || h.applied(g, 1) == Some(end)).await;
    wait_lag(&running, 1, 0, "partition 1 caught up").await;
    let age = lag_seconds(&running, 0).expect("partition 0's lag in seconds");
    assert!(
        age > 0.0,
        "the oldest message not counted has an age: {age}"
    );
    assert_eq!(lag_seconds(&running, 1), Some(0.0), "no backlog, no age");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_partitions_lag_is_the_produced_minus_the_applied() {
    let g = "g-lag-stalled";
    let (mut h, running) = caught_up("lag-stalled", g).await;

    // Redis stops answering (SIGSTOP): nothing lands, the lanes pause for backpressure or wait
    // on the flush, and librdkafka stops reporting what it does not fetch. 600 more events are
    // produced: the lag must be exactly what Redis has not applied.
    let pid = h.redis.pid().expect("redis pid") as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let applied: Vec<i64> = h.produced.clone();
    produce_batch(&mut h, 1_000, 600);
    for p in 0..2 {
        let truth = h.produced[p as usize] - applied[p as usize];
        assert_eq!(truth, 300, "partition {p}'s backlog");
        wait_lag(
            &running,
            p,
            truth,
            &format!("partition {p}'s lag = {truth}"),
        )
        .await;
    }
    // The oldest message not counted ages while Redis is stopped.
    wait_for("an age above 0", FOLLOWS_WITHIN, || {
        lag_seconds(&running, 0).is_some_and(|age| age > 0.0)
    })
    .await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    h.wait_applied(g, WAIT).await;
    for p in 0..2 {
        wait_lag(&running, p, 0, "caught up after redis came back").await;
        wait_for("no age without a backlog", FOLLOWS_WITHIN, || {
            lag_seconds(&running, p) == Some(0.0)
        })
        .await;
    }
    running.stop().await;
}
