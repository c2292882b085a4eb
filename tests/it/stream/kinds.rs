//! Counter kinds on the stream path (distinct exact and HyperLogLog, leaderboard, hash storage)
//! against a real broker and redis-server, compared with a truth computed from the events; and
//! their configuration errors. The kill -9 crash loop in `exactly_once.rs` runs them too.

use std::time::Duration;

use crate::common::kinds::{self, Kinds};
use crate::common::stream::{self, Stream, COUNTERS};
use crate::common::Harness;
use tally::config::Config;

/// `COUNTERS` (counts and kinds) on this harness.
fn config(h: &Harness, group: &str, max_keys_per_call: usize) -> Config {
    #[derive(serde::Deserialize)]
    struct Parsed {
        decode: tally::config::DecodeConfig,
        counters: Vec<tally::config::CounterConfig>,
    }
    let parsed: Parsed = toml::from_str(COUNTERS).unwrap();
    let mut c = h.config(group, parsed.counters);
    c.decode = parsed.decode;
    c.flush.max_keys_per_call = max_keys_per_call;
    c.validate().unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_exact_against_the_events() {
    let mut h = Harness::new("kinds", 4);
    let s = Stream {
        n: 20_000,
        partitions: 4,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    for i in 0..s.n {
        let e = s.event(i);
        h.produce(e.partition, e.payload.as_bytes(), None);
    }
    h.flush_producer();
    // Small units: members and scores of one key are split over many units and flushes.
    let running = h.start(config(&h, "g-kinds", 200));
    h.wait_applied("g-kinds", Duration::from_secs(120)).await;
    running.stop().await;

    let mut conn = h.conn();
    let (keys, mismatches) = stream::compare(&mut conn, &s.truth());
    assert!(keys > 0);
    assert_eq!(mismatches, 0, "counts");
    let mut got = Kinds::default();
    kinds::dump(&mut conn, &mut got);
    let want = s.kinds_truth();
    assert!(!want.uniq.is_empty() && !want.top.is_empty() && !want.hashed.is_empty());
    assert_eq!(kinds::compare(&got, &want), 0, "kinds");
    // Exact distinct sets hold every device; the HyperLogLog stays within its error.
    let hll_err: f64 = want
        .hll
        .iter()
        .map(|(k, w)| (got.hll[k] as f64 - *w as f64).abs() / *w as f64)
        .fold(0.0, f64::max);
    eprintln!(
        "largest HyperLogLog relative error: {:.3}%",
        hll_err * 100.0
    );
}

#[test]
fn kind_settings_that_do_not_fit_are_refused() {
    let base = r#"
[[counters]]
name = "c"
dimensions = ["app_id"]
key = "c:{app_id}:{yyyyMMddHH}"
window = "1h"
"#;
    for (extra, field) in [
        ("kind = \"distinct\"", "member"),
        ("kind = \"distinct\"\nmember = \"app_id\"", "member"),
        (
            "kind = \"distinct\"\nmember = \"d\"\nvalue_field = \"v\"",
            "value_field",
        ),
        ("kind = \"leaderboard\"", "member"),
        ("storage = \"hash\"", "hash_key"),
        (
            "storage = \"hash\"\nhash_key = \"h:{app_id}:{yyyyMMddHH}\"",
            "key",
        ),
        (
            "kind = \"leaderboard\"\nmember = \"d\"\nstorage = \"hash\"",
            "storage",
        ),
        ("member = \"d\"", "member"),
    ] {
        let text = format!("{base}{extra}\n");
        let mut config: Config = toml::from_str(&text).unwrap();
        config.kafka.brokers = "127.0.0.1:9092".into();
        let err = config.validate().expect_err(extra).to_string();
        assert!(
            err.contains(&format!("counters[0].{field}")),
            "{extra}: {err}"
        );
    }
}
