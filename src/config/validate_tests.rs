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
        ..CounterConfig::reference()
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

#[test]
fn http_limits_and_token_sources() {
    let refused = |change: &dyn Fn(&mut Config)| {
        let mut config = Config::default();
        change(&mut config);
        match crate::config::Model::compile(config) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(
        refused(&|c| c.http.header_timeout = Duration::ZERO),
        "http.header_timeout"
    );
    assert_eq!(
        refused(&|c| c.http.request_timeout = Duration::ZERO),
        "http.request_timeout"
    );
    assert_eq!(
        refused(&|c| c.http.max_connections = 0),
        "http.max_connections"
    );
    assert_eq!(
        refused(&|c| c.http.max_connections_per_peer = Some(0)),
        "http.max_connections_per_peer"
    );
    assert_eq!(
        refused(&|c| c.http.ipv6_peer_prefix = 0),
        "http.ipv6_peer_prefix"
    );
    assert_eq!(
        refused(&|c| c.http.probe_listen = "9101".into()),
        "http.probe_listen"
    );
    assert_eq!(
        refused(&|c| c.http.probe_listen = c.http.listen.clone()),
        "http.probe_listen"
    );
    assert_eq!(refused(&|c| c.http.token = Some(" ".into())), "http.token");
    let same = |c: &mut Config| {
        c.http.token = Some("same".into());
        c.http.admin_token = Some("same".into());
    };
    assert_eq!(refused(&same), "http.admin_token");
    assert_eq!(
        refused(&|c| c.http.admin_token = Some("".into())),
        "http.admin_token"
    );

    let dir = std::env::temp_dir().join(format!("tally-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let mut config = Config::default();
    config.http.token_file = Some(file.clone());
    let model = crate::config::Model::compile(config.clone()).expect("a token file");
    assert_eq!(model.tokens.token.as_deref(), Some("from-a-file"));
    config.http.token = Some("inline".into());
    assert!(config.validate().is_err(), "token and token_file together");
    std::fs::write(&file, "\n").unwrap();
    assert_eq!(
        refused(&|c| c.http.token_file = Some(file.clone())),
        "http.token_file"
    );
    assert_eq!(
        refused(&|c| c.http.token_file = Some(dir.join("missing"))),
        "http.token_file"
    );
    // The admin token from a file too; not both, and never the bearer token itself.
    std::fs::write(&file, "admin-from-a-file\n").unwrap();
    let mut config = Config::default();
    config.http.admin_token_file = Some(file.clone());
    let model = crate::config::Model::compile(config.clone()).expect("an admin token file");
    assert_eq!(model.tokens.admin.as_deref(), Some("admin-from-a-file"));
    config.http.admin_token = Some("inline".into());
    assert!(
        config.validate().is_err(),
        "admin_token and its file together"
    );
    assert_eq!(
        refused(&|c| {
            c.http.token = Some("admin-from-a-file".into());
            c.http.admin_token_file = Some(file.clone());
        }),
        "http.admin_token"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn readiness_needs_statistics_more_often_than_unreachable_after() {
    let mut config = Config::default();
    config.kafka.unreachable_after = Duration::from_millis(500);
    assert!(matches!(
        config.validate(),
        Err(ConfigError::Invalid { key, .. }) if key == "kafka.unreachable_after"
    ));
    config.kafka.unreachable_after = Duration::from_secs(10);
    for (ms, ok) in [
        ("5000", true),
        ("1", true),
        ("0", false),
        ("5001", false),
        ("x", false),
    ] {
        config
            .kafka
            .properties
            .insert("statistics.interval.ms".into(), ms.into());
        assert_eq!(
            config.validate().is_ok(),
            ok,
            "statistics.interval.ms = {ms}"
        );
    }
    assert_eq!(
        crate::config::statistics_interval_ms(Duration::from_secs(15)),
        5_000
    );
    assert_eq!(
        crate::config::statistics_interval_ms(Duration::from_secs(3)),
        1_000
    );
}

#[test]
fn consumer_lanes_are_a_count_from_1_to_64_or_auto() {
    use crate::config::{AutoWord, Consumers, KafkaConfig};
    let parse = |text: &str| toml::from_str::<KafkaConfig>(text).map(|k| k.consumers);
    assert_eq!(parse("consumers = 3").unwrap(), Consumers::Count(3));
    assert_eq!(
        parse("consumers = \"auto\"").unwrap(),
        Consumers::Auto(AutoWord::Auto)
    );
    assert_eq!(
        parse("").unwrap(),
        Consumers::Auto(AutoWord::Auto),
        "the default"
    );
    assert!(Consumers::Auto(AutoWord::Auto).resolve() >= 1);
    let e = parse("consumers = \"many\"").unwrap_err().to_string();
    assert!(e.contains("1 to 64") && e.contains("auto"), "{e}");
    let mut config = crate::config::Config::default();
    config.kafka.consumers = Consumers::Count(0);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("kafka.consumers"), "{e}");
}

#[test]
fn the_counters_come_back_compiled_in_config_order() {
    let config = Config {
        counters: vec![
            counter("minute", "minute:{app_id}:{yyyyMMddHHmm}", 60),
            CounterConfig::reference(),
        ],
        ..Config::default()
    };
    let specs = config.validate().expect("valid");
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["minute", "flow"]);
}

#[test]
fn redis_refusals_name_the_key_under_redis_and_hide_the_password() {
    let mut config = Config::default();
    config.redis.nodes = vec!["tcp://u:hunter2@h:1".into()];
    match config.validate() {
        Err(ConfigError::Invalid { key, reason }) => {
            assert_eq!(key, "redis.nodes[0]");
            assert_eq!(
                reason,
                "`tcp://u:***@h:1` must start with redis:// or rediss://"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_output_needs_a_topic_a_lateness_within_retention_and_top_for_leaderboards_only() {
    use tally_counters::config::{CounterKind, OutputConfig};
    let with = |topic: &str, lateness: u64, retention: u64| {
        let mut c = counter("views", "v:{app_id}:{yyyyMMddHH}", 3600);
        c.retention = Duration::from_secs(retention);
        c.output = Some(OutputConfig {
            allowed_lateness: Duration::from_secs(lateness),
            ..OutputConfig::to(topic)
        });
        c
    };
    let ok = Config {
        counters: vec![with("views-hourly", 300, 7200)],
        ..Config::default()
    };
    assert!(ok.validate().is_ok());
    let (key, _) = refusal(vec![with("views hourly", 300, 7200)]);
    assert_eq!(key, "counters[0].output.topic");
    let (key, reason) = refusal(vec![with("t", 300, 300)]);
    assert_eq!(key, "counters[0].output.allowed_lateness");
    assert!(reason.contains("retention"), "{reason}");
    let board = |top: Option<usize>| {
        let mut c = with("t", 0, 60);
        c.kind = CounterKind::Leaderboard;
        c.member = Some("device_id".into());
        c.output.as_mut().unwrap().top = top;
        c
    };
    for top in [None, Some(1), Some(1000)] {
        let ok = Config {
            counters: vec![board(top)],
            ..Config::default()
        };
        assert!(ok.validate().is_ok(), "{top:?}");
    }
    for top in [0, 1001] {
        assert_eq!(refusal(vec![board(Some(top))]).0, "counters[0].output.top");
    }
    let mut count = with("t", 0, 60);
    count.output.as_mut().unwrap().top = Some(5);
    assert_eq!(refusal(vec![count]).0, "counters[0].output.top");
}

#[test]
fn a_late_topic_is_for_dropped_changes_and_is_another_topic() {
    use tally_counters::config::{OutputConfig, OutputLate};
    let with = |late: OutputLate, topic: &str| {
        let mut c = counter("views", "v:{app_id}:{yyyyMMddHH}", 3600);
        c.retention = Duration::from_secs(7200);
        c.output = Some(OutputConfig {
            late,
            late_topic: Some(topic.into()),
            ..OutputConfig::to("views-hourly")
        });
        c
    };
    let ok = Config {
        counters: vec![with(OutputLate::Drop, "views-late")],
        ..Config::default()
    };
    assert!(ok.validate().is_ok());
    for (late, topic) in [
        (OutputLate::Correct, "views-late"),
        (OutputLate::Drop, "views late"),
        (OutputLate::Drop, "views-hourly"),
    ] {
        let (key, _) = refusal(vec![with(late, topic)]);
        assert_eq!(key, "counters[0].output.late_topic", "{late:?} {topic}");
    }
}

#[test]
fn request_batch_sizes_are_checked_and_one_call_turns_batching_off() {
    use super::super::BatchConfig;
    use tally_counters::request::Batching;

    let refused = |batch: BatchConfig| {
        let mut config = Config::default();
        config.request.batch = batch;
        match config.validate() {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    let default = BatchConfig::default();
    assert_eq!(default.batching(), Batching::default());
    let zero_calls = BatchConfig {
        max_calls: 0,
        ..default
    };
    assert_eq!(refused(zero_calls), "request.batch.max_calls");
    let no_slot = BatchConfig {
        in_flight: 0,
        ..default
    };
    assert_eq!(refused(no_slot), "request.batch.in_flight");
    let off = BatchConfig {
        max_calls: 1,
        in_flight: 1,
    };
    assert_eq!(
        off.batching(),
        Batching::OFF,
        "alone, and no wait for a slot"
    );
    let mut config = Config::default();
    config.request.batch = off;
    config.validate().expect("max_calls = 1 is batching off");
}

#[test]
fn an_output_topic_alone_is_what_the_file_reads() {
    use tally_counters::config::OutputConfig;
    let read: OutputConfig = toml::from_str("topic = \"t\"").unwrap();
    assert_eq!(read, OutputConfig::to("t"));
}

#[test]
fn each_format_names_its_own_schema_sources() {
    use super::super::{DecodeConfig, Format, RegistryConfig};
    let registry = || RegistryConfig {
        url: "http://registry:8081".into(),
        username: None,
        password: None,
        timeout: std::time::Duration::from_secs(5),
        ca_file: None,
    };
    let check = |f: &dyn Fn(&mut DecodeConfig)| {
        let mut d = DecodeConfig::default();
        f(&mut d);
        d.validate().map_err(|e| e.to_string())
    };
    assert!(check(&|d| d.message = Some("a.B".into())).is_err(), "json");
    let protobuf = |d: &mut DecodeConfig| d.format = Format::Protobuf;
    let e = check(&|d| protobuf(d)).unwrap_err();
    assert!(e.contains("descriptor_file with decode.message"), "{e}");
    let e = check(&|d| {
        protobuf(d);
        d.schema_registry = Some(registry());
        d.schema_file = Some("x.avsc".into());
    })
    .unwrap_err();
    assert!(e.contains("schema_file is for format = \"avro\""), "{e}");
    let e = check(&|d| {
        protobuf(d);
        d.descriptor_file = Some("x.pb".into());
    })
    .unwrap_err();
    assert!(e.contains("decode.message"), "{e}");
    check(&|d| {
        protobuf(d);
        d.schema_registry = Some(registry());
    })
    .expect("a registry alone");
    let e = check(&|d| {
        d.format = Format::Avro;
        d.schema_registry = Some(registry());
        d.descriptor_file = Some("x.pb".into());
    })
    .unwrap_err();
    assert!(e.contains("are for format = \"protobuf\""), "{e}");
}
