//! `when = "updates"`: while a window is open, each change of its keys is published (`"final":
//! false`), the values of a count, sum or exact distinct count only grow, and when the window
//! closes its final record carries the truth. One `tally run` on the mock broker process, the
//! counters and events of `window_results`, read back with a `read_committed` consumer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::local_redis::LocalRedis;

use crate::common::process::{BrokerProcess, TallyProcess};
use crate::stream::window::results::{
    config, events, produce, read_output, tops, truth, Ev, MIN, PARTITIONS,
};

/// Per key, its records in the order of the topic.
fn by_key(records: &[(String, Value)]) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (k, v) in records {
        out.entry(k.clone()).or_default().push(v.clone());
    }
    out
}

/// Read the output until `done` accepts it; panics with the last records after two minutes.
fn wait_records(
    bootstrap: &str,
    out: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, Vec<Value>>) -> bool,
) -> BTreeMap<String, Vec<Value>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let keys = by_key(&read_output(bootstrap, out));
        if done(&keys) {
            return keys;
        }
        assert!(Instant::now() < deadline, "never {what}: {keys:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn updates_publish_each_change_of_an_open_window_then_its_final_truth() {
    let (topic, out) = ("upd-in", "upd-out");
    let broker = BrokerProcess::start(&[(topic, PARTITIONS), (out, 1)]);
    let bootstrap = broker.bootstrap.as_str();
    let redis = LocalRedis::start(&[]).unwrap();
    let cfg = config(bootstrap, &redis.url(), topic, out, "updates");
    let now = chrono::Utc::now().timestamp_millis();
    let base = now - now.rem_euclid(MIN) - 60 * MIN;
    let mut tally = TallyProcess::start(&cfg, "win-updates");

    // Four steps of events in minute 0, which stays open (no event time reaches its end): after
    // each, every key's latest record is an update with the value so far.
    let mut all: Vec<Ev> = Vec::new();
    let mut steps: Vec<BTreeMap<String, i64>> = Vec::new();
    for step in 0..4u64 {
        let batch = events(base, 0..1, 400, step * 1000 + 1);
        produce(bootstrap, topic, &batch);
        all.extend(batch);
        let want = truth(&all, base + MIN);
        wait_records(bootstrap, out, &format!("step {step}'s values"), |keys| {
            want.iter().all(|(k, v)| {
                keys.get(k)
                    .and_then(|r| r.last())
                    .is_some_and(|last| last["value"] == *v && last["final"] == false)
            })
        });
        steps.push(want);
    }

    // One event per active partition in minute 1: minute 0 closes.
    let closer = events(base, 1..2, 3, 0);
    produce(bootstrap, topic, &closer);
    all.extend(closer);
    let want = truth(&all, base + MIN);
    let keys = wait_records(bootstrap, out, "the final records", |keys| {
        want.iter().all(|(k, v)| {
            keys.get(k)
                .and_then(|r| r.last())
                .is_some_and(|last| last["value"] == *v && last["final"] == true)
        })
    });
    for (key, truth) in &want {
        let records = &keys[key];
        let values: Vec<i64> = records
            .iter()
            .map(|r| r["value"].as_i64().unwrap())
            .collect();
        assert!(
            values.windows(2).all(|w| w[0] <= w[1]),
            "{key}: values only grow: {values:?}"
        );
        let (last, updates) = records.split_last().unwrap();
        assert_eq!(last["value"], *truth, "{key}: the last record is the truth");
        assert!(
            updates.iter().all(|u| u["final"] == false),
            "{key}: one final record, the last: {records:#?}"
        );
        for u in updates {
            assert!(
                u["watermark"].as_i64().unwrap() < u["window_end"].as_i64().unwrap(),
                "{key}: an update is of an open window: {u}"
            );
        }
        assert!(
            last["watermark"].as_i64().unwrap() >= last["window_end"].as_i64().unwrap(),
            "{key}: the final record carries the watermark that closed the window: {last}"
        );
        // Each step's value of the key was published (it changed in every step or kept it).
        for (i, step) in steps.iter().enumerate() {
            if let Some(v) = step.get(key) {
                assert!(
                    values.contains(v),
                    "{key}: step {i}'s value {v} in {values:?}"
                );
            }
        }
    }
    for (key, top) in tops(&all, base + MIN) {
        let last = keys[&key].last().unwrap();
        assert_eq!(
            last["top"], top,
            "{key}: the leaderboard's final top: {last}"
        );
    }
    // Minute 1 is open: its keys have updates only.
    let open: Vec<&String> = keys.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(!open.is_empty(), "minute 1's keys are published as updates");
    for k in open {
        assert!(
            keys[k].iter().all(|r| r["final"] == false),
            "{k}: {:?}",
            keys[k]
        );
    }
    assert!(tally.terminate(Duration::from_secs(30)).success());
}
