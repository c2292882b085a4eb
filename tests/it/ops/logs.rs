//! Log formats: `log.format = "json"` writes one JSON object per line (every line parses, with
//! `timestamp`, `level`, `message` and `target`), `TALLY_LOG_FORMAT` takes the setting's place
//! from the first line on, and text written to a file carries no colour escape codes.

use std::time::Duration;

use crate::common::process::TallyProcess;
use crate::common::request::PLAYS;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::wait::wait_until;

fn serve_config(redis: &str, format: Option<&str>) -> String {
    let log = format.map_or(String::new(), |f| format!("[log]\nformat = \"{f}\"\n"));
    format!(
        r#"
[redis]
url = "{redis}"
{log}
{PLAYS}
"#
    )
}

/// Start `tally serve` and wait until its log says it serves; returns the log's lines.
fn serve_log(redis: &LocalRedis, format: Option<&str>, env: &[(&str, &str)]) -> Vec<String> {
    let t = TallyProcess::start_command_with_env(
        "serve",
        &serve_config(&redis.url(), format),
        "logs",
        "",
        env,
    );
    assert!(
        wait_until(Duration::from_secs(30), || t.log().contains("serving")),
        "serve never said it serves:\n{}",
        t.log()
    );
    t.log().lines().map(str::to_string).collect()
}

fn assert_json_lines(lines: &[String]) {
    assert!(!lines.is_empty());
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for field in ["timestamp", "level", "message", "target"] {
            assert!(v.get(field).is_some(), "no `{field}` in {line}");
        }
    }
    assert!(lines.iter().any(|l| l.contains("\"message\":\"serving")));
}

#[test]
fn json_logs_parse_line_by_line_and_text_in_a_file_has_no_colour() {
    let redis = LocalRedis::start(&[]).unwrap();
    // log.format = "json": every line (serve logs nothing before its file is read).
    assert_json_lines(&serve_log(&redis, Some("json"), &[]));
    // TALLY_LOG_FORMAT: from the process's first line, whatever the file says.
    assert_json_lines(&serve_log(
        &redis,
        Some("text"),
        &[("TALLY_LOG_FORMAT", "json")],
    ));
    // Text (the default) to a file: no escape codes, and not JSON.
    let text = serve_log(&redis, None, &[]);
    assert!(
        text.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a file:\n{}",
        text.join("\n")
    );
    assert!(text.iter().all(|l| !l.starts_with('{')));
}

/// `tally serve` says when Redis does not answer, naming it (password masked), again while it
/// stays down (rate-limited), and when it answers again.
#[test]
fn serve_warns_while_redis_is_unreachable_and_says_when_it_is_back() {
    let port = tally_testkit::local_redis::free_port().expect("a free port");
    let url = format!("redis://user:pw-of-the-test@127.0.0.1:{port}");
    let t = TallyProcess::start_command_with_env(
        "serve",
        &serve_config(&url, None),
        "logs-unreachable",
        "",
        &[],
    );
    let named = format!("redis://user:***@127.0.0.1:{port}");
    assert!(
        wait_until(Duration::from_secs(30), || {
            let log = t.log();
            log.contains("WARN") && log.contains("redis unreachable") && log.contains(&named)
        }),
        "no WARN naming the unreachable redis:\n{}",
        t.log()
    );
    assert!(!t.log().contains("pw-of-the-test"), "{}", t.log());
    // The server comes up with that user (an ACL user, as the URL names).
    let acl = [
        "--user",
        "user",
        "on",
        ">pw-of-the-test",
        "~*",
        "&*",
        "+@all",
    ];
    let redis = LocalRedis::start_on(port, &acl).expect("redis-server on the port");
    assert!(
        wait_until(Duration::from_secs(30), || t
            .log()
            .contains("redis reachable")),
        "serve never said redis is back:\n{}",
        t.log()
    );
    drop(redis);
}

/// A stream-only setting in `tally serve`'s configuration is a WARN naming it (one file may serve
/// both commands, so it is not an error); the defaults say nothing.
#[test]
fn serve_warns_about_stream_settings_it_ignores() {
    let redis = LocalRedis::start(&[]).expect("redis-server");
    let quiet = serve_log(&redis, None, &[]);
    assert!(
        !quiet.iter().any(|l| l.contains("does not consume Kafka")),
        "{quiet:?}"
    );
    let config = format!(
        "{}\n[flush]\ninterval = \"2s\"\n[status]\nhot_keys = 5\n",
        serve_config(&redis.url(), None)
    );
    let t = TallyProcess::start_command_with_env("serve", &config, "logs-ignored", "", &[]);
    assert!(
        wait_until(Duration::from_secs(30), || t.log().contains("serving")),
        "{}",
        t.log()
    );
    let log = t.log();
    for section in ["[flush]", "status.hot_keys"] {
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("does not consume Kafka")
                && l.contains(section)),
            "no warning for {section}:\n{log}"
        );
    }
}
