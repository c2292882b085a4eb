//! Tests for `validate.rs`: rules that span counters.

use std::time::Duration;

use super::super::{Config, ConfigError, CounterConfig};

fn counter(name: &str, key: &str, window_secs: u64) -> CounterConfig {
    CounterConfig {
        name: name.into(),
        dimensions: vec!["app_id".into()],
        key: key.into(),
        window: Duration::from_secs(window_secs),
        timezone: "UTC".into(),
        retention: Duration::ZERO,
        value_field: None,
    }
}

fn refusal(counters: Vec<CounterConfig>) -> (String, String) {
    let config = Config {
        counters,
        ..Config::default()
    };
    match config.validate() {
        Err(ConfigError::Invalid { key, reason }) => (key, reason),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_hourly_and_a_daily_counter_on_one_template_are_refused_by_name() {
    let (key, reason) = refusal(vec![
        CounterConfig::reference(),
        counter("hourly", "c:{app_id}:{yyyyMMddHH}", 3600),
        counter("daily", "c:{app_id}:{yyyyMMddHH}", 86_400),
    ]);
    assert_eq!(key, "counters[2].key");
    assert!(reason.contains("`hourly` (counters[1])"), "{reason}");
    assert!(reason.contains("`daily`"), "{reason}");
    assert!(reason.contains("c::0000000000"), "{reason}");
}

#[test]
fn a_count_and_a_sum_on_one_template_are_refused() {
    let mut sum = counter("bytes", "c:{app_id}:{yyyyMMddHH}", 3600);
    sum.value_field = Some("bytes".into());
    let (key, reason) = refusal(vec![counter("hits", "c:{app_id}:{yyyyMMddHH}", 3600), sum]);
    assert_eq!(key, "counters[1].key");
    assert!(
        reason.contains("`hits`") && reason.contains("`bytes`"),
        "{reason}"
    );
}

#[test]
fn counters_with_their_own_prefixes_are_accepted() {
    let config = Config {
        counters: vec![
            CounterConfig::reference(),
            counter("hourly", "flow:{app_id}:{yyyyMMddHH}", 3600),
            counter("daily", "flow:{app_id}:{yyyyMMdd}", 86_400),
            counter("minute", "minute:{app_id}:{yyyyMMddHHmm}", 60),
        ],
        ..Config::default()
    };
    config.validate().expect("no two counters share a key");
}

#[test]
fn keys_that_can_land_among_the_state_keys_are_refused() {
    let (key, reason) = refusal(vec![counter("c", "{app_id}:{yyyyMMddHH}", 3600)]);
    assert_eq!(key, "counters[0].key");
    assert!(reason.contains("redis.state_prefix `tally:`"), "{reason}");
    assert!(reason.contains("tally:0000000000"), "{reason}");

    let mut config = Config::default();
    config.redis.state_prefix = "flow:".into();
    assert!(matches!(
        config.validate(),
        Err(ConfigError::Invalid { key, .. }) if key == "counters[0].key"
    ));
}
