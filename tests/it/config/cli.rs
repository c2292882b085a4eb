//! Bad configuration exits with code 64 and names the offending key, before connecting anywhere.

use std::io::Write;
use std::process::{Command, Output};

fn tally(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tally"));
    cmd.args(args).env_remove("TALLY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run tally")
}

fn with_file(toml: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut f = tempfile_in_target(toml);
    f.flush().unwrap();
    let path = f.path.clone();
    let mut all = vec!["check", "--config", path.as_str()];
    all.extend_from_slice(args);
    tally(&all, env)
}

struct TempFile {
    path: String,
    file: std::fs::File,
}
impl Write for TempFile {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.file.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
fn tempfile_in_target(content: &str) -> TempFile {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "tally-config-{}-{}.toml",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(content.as_bytes()).unwrap();
    TempFile {
        path: path.to_string_lossy().into_owned(),
        file,
    }
}

fn assert_usage_error(out: &Output, key: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "exit code; stderr: {stderr}");
    // Keys from the environment are reported as written there (upper case).
    assert!(
        stderr.to_lowercase().contains(&key.to_lowercase()),
        "stderr should name `{key}`: {stderr}"
    );
}

#[test]
fn default_config_is_valid_and_reproduces_the_reference_design() {
    let out = tally(&["check"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}"),
        "{text}"
    );
    assert!(text.contains("window = \"1h\""), "{text}");
}

#[test]
fn the_shipped_example_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tally.toml");
    let out = tally(&["check", "--config", path], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's stream example (one topic per format) is a configuration `tally check` accepts,
/// and it shows every format.
#[test]
fn the_readmes_example_of_each_format_is_valid() {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("```toml\n[[kafka.topics]]")
        .expect("README: the [[kafka.topics]] example")
        + "```toml\n".len();
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    for format in ["json", "avro", "protobuf"] {
        assert!(
            block.contains(&format!("format = \"{format}\"")),
            "the README's example shows no {format} topic"
        );
    }
    let out = with_file(block, &[], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for topic in ["http", "orders", "carts"] {
        assert!(stdout.contains(&format!("name = \"{topic}\"")), "{stdout}");
    }
}

#[test]
fn unknown_key_is_rejected() {
    assert_usage_error(
        &with_file("[flush]\nintervall = \"1s\"\n", &[], &[]),
        "intervall",
    );
}

#[test]
fn bad_duration_names_the_key() {
    assert_usage_error(
        &with_file("[flush]\ninterval = \"soon\"\n", &[], &[]),
        "interval",
    );
}

#[test]
fn window_that_does_not_divide_a_day() {
    let toml = r#"
[[counters]]
name = "odd"
dimensions = ["a"]
key = "odd:{a}:{yyyyMMddHHmm}"
window = "7m"
"#;
    assert_usage_error(&with_file(toml, &[], &[]), "counters[0].window");
}

#[test]
fn template_too_coarse_for_the_window() {
    let toml = r#"
[[counters]]
name = "c"
dimensions = ["a"]
key = "c:{a}:{yyyyMMdd}"
window = "1h"
"#;
    assert_usage_error(&with_file(toml, &[], &[]), "counters[0].key");
}

#[test]
fn unknown_time_zone() {
    let toml = r#"
[[counters]]
name = "c"
dimensions = ["a"]
key = "c:{a}:{yyyyMMddHH}"
window = "1h"
timezone = "Mars/Olympus"
"#;
    assert_usage_error(&with_file(toml, &[], &[]), "counters[0].timezone");
}

#[test]
fn managed_kafka_property_is_refused() {
    let toml = "[kafka.properties]\n\"enable.auto.commit\" = \"true\"\n";
    assert_usage_error(&with_file(toml, &[], &[]), "enable.auto.commit");
}

#[test]
fn environment_overrides_file_and_flags_override_environment() {
    let toml = "[kafka]\ntopic = \"from-file\"\n";
    let out = with_file(toml, &[], &[("TALLY_KAFKA__TOPIC", "from-env")]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("topic = \"from-env\""));
    let out = with_file(
        toml,
        &["--topic", "from-flag"],
        &[("TALLY_KAFKA__TOPIC", "from-env")],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("topic = \"from-flag\""));
    let out = with_file(toml, &[], &[("TALLY_FLUSH__MAX_KEYS", "zero")]);
    assert_usage_error(&out, "max_keys");
}

#[test]
fn bad_redis_url_and_missing_file() {
    assert_usage_error(
        &tally(&["check", "--redis-url", "http://x"], &[]),
        "redis.url",
    );
    assert_usage_error(
        &tally(&["check", "--config", "/nonexistent/tally.toml"], &[]),
        "--config",
    );
    assert_usage_error(
        &tally(&["run", "--listen", "not-an-address"], &[]),
        "http.listen",
    );
}

#[test]
fn two_counters_that_can_write_one_key_are_refused_by_name() {
    let toml = r#"
[[counters]]
name = "hits"
dimensions = ["a"]
key = "c:{a}:{yyyyMMddHH}"
window = "1h"

[[counters]]
name = "hits_daily"
dimensions = ["a"]
key = "c:{a}:{yyyyMMddHH}"
window = "1d"
"#;
    let out = with_file(toml, &[], &[]);
    assert_usage_error(&out, "counters[1].key");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`hits` (counters[0])") && stderr.contains("`hits_daily`"),
        "both counters named: {stderr}"
    );

    // Hourly and daily keys on one prefix never coincide: accepted.
    let toml = toml.replace(
        "key = \"c:{a}:{yyyyMMddHH}\"\nwindow = \"1d\"",
        "key = \"c:{a}:{yyyyMMdd}\"\nwindow = \"1d\"",
    );
    let out = with_file(&toml, &[], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Environment variables for one run.
type Env<'a> = &'a [(&'a str, &'a str)];

/// Secrets used below; none may ever appear in what tally prints.
const SECRETS: [&str; 7] = [
    "url-secret-1",
    "redis-secret-2",
    "sasl-secret-3",
    "keypw-secret-4",
    "oauth-secret-5",
    "keystore-secret-6",
    "http-secret-7",
];

const WITH_SECRETS: &str = r#"
[kafka.properties]
"sasl.username" = "tally-user"
"sasl.password" = "sasl-secret-3"
"ssl.key.password" = "keypw-secret-4"
"sasl.oauthbearer.client.secret" = "oauth-secret-5"
"ssl.keystore.password" = "keystore-secret-6"

[redis]
url = "redis://tally:url-secret-1@127.0.0.1:6379/0"
password = "redis-secret-2"

[http]
token = "http-secret-7"
"#;

fn assert_no_secret(out: &Output) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in SECRETS {
        assert!(!text.contains(secret), "`{secret}` printed: {text}");
    }
}

#[test]
fn check_prints_the_configuration_with_secrets_masked() {
    let out = with_file(WITH_SECRETS, &[], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_secret(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    // User names and hosts stay, so the output still says where and as whom.
    assert!(
        text.contains("redis://tally:***@127.0.0.1:6379/0"),
        "{text}"
    );
    assert!(text.contains("password = \"***\""), "{text}");
    assert!(text.contains("\"sasl.password\" = \"***\""), "{text}");
    assert!(
        text.contains("\"sasl.username\" = \"tally-user\""),
        "{text}"
    );

    // From a flag and from the environment, too.
    let out = with_file(
        "",
        &["--redis-url", "redis://u:url-secret-1@h:1"],
        &[("TALLY_REDIS__PASSWORD", "redis-secret-2")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_secret(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis://u:***@h:1"));
}

#[test]
fn configuration_errors_never_print_secrets() {
    // (file, environment, the key the error names)
    let cases: [(String, Env, &str); 7] = [
        // A URL refused by validation.
        (
            WITH_SECRETS.replace("redis://tally", "http://tally"),
            &[],
            "redis.url",
        ),
        (
            WITH_SECRETS.replace("[http]", "nodes = [\"http://u:url-secret-1@h:1\"]\n[http]"),
            &[],
            "redis.nodes[0]",
        ),
        // Values of the wrong type.
        (
            WITH_SECRETS.replace("\"redis-secret-2\"", "[\"redis-secret-2\"]"),
            &[],
            "password",
        ),
        (
            WITH_SECRETS.replace("\"sasl-secret-3\"", "[\"sasl-secret-3\"]"),
            &[],
            "sasl.password",
        ),
        // A syntax error on the line holding the secret.
        (
            WITH_SECRETS.replace("\"redis-secret-2\"", "\"redis-secret-2"),
            &[],
            "line",
        ),
        // From the environment.
        (
            String::new(),
            &[("TALLY_REDIS__URL", "ftp://u:url-secret-1@h:1")],
            "redis.url",
        ),
        (
            String::new(),
            &[("TALLY_KAFKA__PROPERTIES", "{sasl.password=sasl-secret-3}")],
            "kafka.properties",
        ),
    ];
    for (toml, env, key) in cases {
        let out = with_file(&toml, &[], env);
        assert_usage_error(&out, key);
        assert_no_secret(&out);
    }
}

#[test]
fn bad_expressions_and_field_sources_say_where() {
    for (toml, key, says) in [
        (
            "filter = '''a > 1 &&\n  a.all(x, x > 1)'''",
            "counters[0].filter",
            "2:",
        ),
        ("filter = 'a + 1'", "counters[0].filter", "gives a number"),
        ("filter = 'a >'", "counters[0].filter", "1:"),
    ] {
        let toml = format!("[[counters]]\nname = \"c\"\ndimensions = [\"a\"]\nkey = \"c:{{a}}:{{yyyyMMddHH}}\"\nwindow = \"1h\"\n{toml}\n");
        let out = with_file(&toml, &[], &[]);
        assert_usage_error(&out, key);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{toml}: {stderr}");
    }
    for (section, key, says) in [
        (
            "[decode.fields]\na = \"x..y\"",
            "decode.fields.a",
            "empty segment",
        ),
        (
            "[decode.fields]\na = \"$offset\"",
            "decode.fields.a",
            "unknown source",
        ),
        ("[decode.derive]\na = \"size(\"", "decode.derive.a", "1:"),
        (
            "[decode.derive]\na = \"b + 1\"\nb = \"c\"",
            "decode.derive.a",
            "another derived field",
        ),
    ] {
        let out = with_file(section, &[], &[]);
        assert_usage_error(&out, key);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{section}: {stderr}");
    }
}

/// With `[[kafka.topics]]`, `tally check` prints the topics read, not the single-topic
/// `kafka.topic` default (which names a topic that is not read); the text is the order of the
/// reference configuration (brokers before the topics).
#[test]
fn check_prints_the_topics_read_and_not_the_single_topic_default() {
    let config = r#"
[kafka]
brokers = "127.0.0.1:9092"
group_id = "g"

[[kafka.topics]]
name = "orders"

[[counters]]
name = "c"
dimensions = ["a"]
key = "c:{a}:{yyyyMMddHH}"
window = "1h"
retention = "2h"
"#;
    let out = with_file(config, &[], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("name = \"orders\""), "{text}");
    assert!(!text.contains("topic = "), "{text}");
    let (brokers, topics) = (
        text.find("brokers = ").unwrap(),
        text.find("name = \"orders\"").unwrap(),
    );
    assert!(brokers < topics, "{text}");
    // The single-topic form still prints its topic.
    let single = config.replace(
        "[[kafka.topics]]\nname = \"orders\"\n",
        "topic = \"orders\"\n",
    );
    assert_ne!(single, config);
    let single = with_file(&single, &[], &[]);
    let text = String::from_utf8_lossy(&single.stdout);
    assert!(
        single.status.success(),
        "{}",
        String::from_utf8_lossy(&single.stderr)
    );
    assert!(text.contains("topic = \"orders\""), "{text}");
}
