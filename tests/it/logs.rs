//! Log formats: `log.format = "json"` writes one JSON object per line (every line parses, with
//! `timestamp`, `level`, `message` and `target`), `TALLY_LOG_FORMAT` takes the setting's place
//! from the first line on, and text written to a file carries no colour escape codes.

use std::time::Duration;

use crate::common::process::TallyProcess;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::wait::wait_until;

fn serve_config(redis: &str, format: Option<&str>) -> String {
    let log = format.map_or(String::new(), |f| format!("[log]\nformat = \"{f}\"\n"));
    format!(
        r#"
[redis]
url = "{redis}"
{log}
[[counters]]
name = "plays"
dimensions = ["video"]
key = "plays:{{video}}:{{yyyyMMddHH}}"
window = "1h"
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
