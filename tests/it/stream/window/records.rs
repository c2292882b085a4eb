//! What the window tests read back from an output topic: every record's invariants, one final
//! record per key, the leaderboards' tops, and a wait until the records say a condition holds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::stream::window::results::{minute_text, read_output, MIN};

/// Per key: the distinct values of its final (not correction) records, and its last value.
pub(crate) type Seen = BTreeMap<String, (BTreeSet<i64>, i64)>;

pub(crate) fn summarize(records: &[(String, Value)]) -> Seen {
    let mut seen = Seen::new();
    for (key, v) in records {
        let value = v["value"].as_i64().unwrap();
        let entry = seen.entry(key.clone()).or_default();
        if !v["correction"].as_bool().unwrap() {
            entry.0.insert(value);
        }
        entry.1 = value;
    }
    seen
}

/// The invariants of every record: final, closed by a watermark at or past its window's end,
/// its key the counter key of its dimensions and window.
pub(crate) fn check_records(records: &[(String, Value)]) {
    for (key, v) in records {
        assert_eq!(v["final"], Value::Bool(true), "{key}: {v}");
        let end = v["window_end"].as_i64().unwrap();
        assert_eq!(end - v["window_start"].as_i64().unwrap(), MIN, "{v}");
        assert_eq!(
            v["_kafka_timestamp"].as_i64(),
            Some(end),
            "{key}: the record's timestamp is its window's end: {v}"
        );
        assert!(
            v["watermark"].as_i64().unwrap() >= end,
            "{key} published before its watermark passed its end: {v}"
        );
        let t = minute_text(v["window_start"].as_i64().unwrap());
        let app = v["dimensions"]["app"].as_str().unwrap();
        let want = match v["counter"].as_str().unwrap() {
            "bytes" => format!(
                "win:bytes:{app}:{}:{t}",
                v["dimensions"]["dev"].as_str().unwrap()
            ),
            c => format!("win:{c}:{app}:{t}"),
        };
        assert_eq!(key, &want, "{v}");
    }
}

/// The last record of each leaderboard key carries the truth's `top`, and every key of `want`
/// is published.
pub(crate) fn check_tops(records: &[(String, Value)], want: &BTreeMap<String, Value>) {
    let mut last: BTreeMap<&str, &Value> = BTreeMap::new();
    for (k, v) in records.iter().filter(|(_, v)| v["counter"] == "devs") {
        last.insert(k, v);
    }
    assert_eq!(last.len(), want.len(), "every leaderboard key is published");
    for (k, v) in last {
        assert_eq!(v["top"], want[k], "{k}: its last record's top: {v}");
    }
}

/// Every key's final (not correction) records are one and the same record, byte for byte (the
/// JSON as parsed): re-publishes after kills and retries repeat the first attempt.
pub(crate) fn one_final(records: &[(String, Value)]) {
    let mut finals: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (k, v) in records.iter().filter(|(_, v)| v["correction"] == false) {
        finals.entry(k).or_default().insert(v.to_string());
    }
    for (k, f) in finals {
        assert_eq!(f.len(), 1, "{k}: one final record: {f:#?}");
    }
}

pub(crate) fn wait_output(
    bootstrap: &str,
    out: &str,
    done: impl Fn(&Seen) -> bool,
) -> Vec<(String, Value)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let records = read_output(bootstrap, out);
        if done(&summarize(&records)) || Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
