//! Executable documentation: every shell example of README.md, of the book's pages and of
//! `tally <command> --help` runs here, in that order, against one `tally serve` and one real
//! `redis-server`, both on the shipped example configuration (`config/example.toml`), and its
//! answer is checked against the one the text shows. `curl` examples run with the real `curl`
//! (only the address is rewritten to the test's port); `tally` examples with the built binary
//! (only `--config` is rewritten to the test's copy of the example); `redis-cli` examples at the
//! test's Redis. An example that cannot run here is in [`EXCLUDED`] with the reason; one that is
//! neither run nor excluded fails the test, so an example cannot be added without being run.

mod answer;
mod extract;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::process::TallyProcess;
use answer::Answer;
use extract::Example;
use tally_testkit::http;
use tally_testkit::local_redis::LocalRedis;
use tally_testkit::wait::wait_until;

/// Examples that do not run here, by a substring of the command, and why.
const EXCLUDED: &[(&str, &str)] = &[
    (
        "scripts/demo.sh",
        "the demo: builds, then runs until Ctrl-C",
    ),
    (
        "scripts/test.sh",
        "the whole test suite, this test included",
    ),
    ("cargo build --release", "a release build (minutes)"),
    ("tally run", "consumes the user's Kafka, until stopped"),
    (
        "tally top",
        "a terminal UI until q; ops/status_page.rs drives it in tmux",
    ),
    (
        "docker compose",
        "needs a Docker engine and builds an image",
    ),
    ("-p tally-bench", "the benchmark: minutes of load"),
    (
        "cargo nextest run",
        "a test of the suite (a figure's command): the suite runs it",
    ),
    (
        "kubectl",
        "needs a Kubernetes cluster; tests/it/release/kubernetes.rs validates the manifests",
    ),
    (
        "kcat",
        "reads the user's Kafka with a tool tally does not install",
    ),
    (
        "tally serve",
        "runs until stopped: the test runs one on the same file",
    ),
    ("tally demo", "the demo, with its own broker and Redis"),
    ("tally mock-broker", "a broker that runs until stopped"),
    (
        "tally produce",
        "produces to a broker the test does not start",
    ),
    (
        "./nightly-job",
        "runs the reader's job once the lock is taken",
    ),
    (
        "repair --partition",
        "repairs a halted partition, and none is halted here (the state-loss tests repair one)",
    ),
    (
        "kill -HUP",
        "signals the reader's running tally; the signals tests send SIGHUP to one",
    ),
    (
        "scripts/release.sh",
        "a release build and its packages (minutes); scripts/release_test.sh runs it",
    ),
    (
        "sha256sum -c",
        "checks downloaded artifacts; scripts/release_test.sh checks release.sh's",
    ),
    (
        "dpkg -i",
        "installs system-wide; scripts/release_test.sh installs and purges the .deb",
    ),
    (
        "/etc/tally/tally.toml",
        "the installed package's file; scripts/release_test.sh checks it",
    ),
    (
        "systemctl",
        "needs systemd as PID 1; scripts/release_test.sh verifies the units",
    ),
];

/// Examples whose answer shown is not their first: run again, [`ROUND`] calls at once, until
/// it comes (at most [`ROUNDS`] rounds; every other answer must be a 2xx).
const REPEATED: &[(&str, &str)] = &[(
    "/v1/limit",
    "the answer shown is a subject past its burst: the calls before are admitted",
)];

const ROUND: usize = 25;
const ROUNDS: usize = 8;

/// What the test adds to a curl example: the status line and headers, and a time limit.
const CURL_ARGS: &[&str] = &["-i", "--max-time", "10"];

/// Examples that run until stopped: once they printed their first line they get SIGTERM, and
/// must then exit 0 (the README says they release what they hold and exit 0).
const HELD: &[(&str, &str)] = &[("--hold", "holds the lock for ten minutes")];

/// How a tally example names its configuration: the shipped example, or the reader's own file
/// (a page that has just shown it). Both run with the example, at the test's Redis.
const CONFIG_NAMES: &[&str] = &["--config config/example.toml", "--config tally.toml"];

/// Where the README's examples send their requests; rewritten to the test's server.
const README_ADDRESSES: &[&str] = &["localhost:9100", "127.0.0.1:9100"];

/// The shipped example configuration, `config/example.toml`: what the demo runs and what every
/// example names. Only its Redis address changes (to the test's); the page that shows
/// `[[request.limits]]` must show the file's own block, so the policies its answers show come
/// from the configuration a reader runs.
fn config(redis: &LocalRedis, docs: &str) -> String {
    const SHIPPED_REDIS: &str = "url = \"redis://127.0.0.1:6379\"";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example =
        std::fs::read_to_string(root.join("config/example.toml")).expect("config/example.toml");
    let limits = extract::blocks(docs)
        .into_iter()
        .find(|b| b.lang == "toml" && b.lines.iter().any(|l| l == "[[request.limits]]"))
        .expect("the docs show [[request.limits]]")
        .lines
        .join("\n");
    assert!(
        example.contains(&limits),
        "the [[request.limits]] block the docs show is not config/example.toml's:\n{limits}"
    );
    assert_eq!(
        example.matches(SHIPPED_REDIS).count(),
        1,
        "config/example.toml names its Redis as {SHIPPED_REDIS}"
    );
    example.replace(SHIPPED_REDIS, &format!("url = \"{}\"", redis.url()))
}

/// How an example is run, chosen by the first word of its command.
enum Kind {
    Excluded(&'static str),
    Curl,
    Tally,
    RedisCli,
}

fn kind(command: &str) -> Option<Kind> {
    if let Some((_, why)) = EXCLUDED.iter().find(|(s, _)| command.contains(s)) {
        return Some(Kind::Excluded(why));
    }
    match command.split_whitespace().next()? {
        "curl" => Some(Kind::Curl),
        "tally" => Some(Kind::Tally),
        "redis-cli" => Some(Kind::RedisCli),
        _ => None,
    }
}

/// The test's side of the examples: where tally listens, the configuration file for the CLI,
/// and the placeholders earlier answers bound to real values.
struct Bench {
    port: u16,
    /// The test's Redis, for `redis-cli` examples (which name none: the reader's is local).
    redis_url: String,
    config_path: PathBuf,
    bindings: BTreeMap<String, String>,
}

impl Bench {
    /// The command with the README's placeholders replaced by what earlier answers held.
    fn bind(&self, command: &str) -> String {
        self.bindings
            .iter()
            .fold(command.to_string(), |c, (shown, real)| {
                c.replace(shown, real)
            })
    }

    fn run(&mut self, example: &Example, kind: &Kind) -> Result<(), String> {
        let command = self.bind(&example.command);
        match kind {
            Kind::Excluded(_) => Ok(()),
            Kind::Curl => self.curl(&command, &example.answers),
            Kind::Tally if HELD.iter().any(|(s, _)| command.contains(s)) => {
                self.tally_held(&command)
            }
            Kind::Tally => self.tally(&command, &example.answers),
            Kind::RedisCli => self.redis_cli(&command, &example.answers),
        }
    }

    /// Run a curl example with the real `curl`, `-i` added to see the status and headers.
    fn curl(&mut self, command: &str, shown: &[String]) -> Result<(), String> {
        let address = format!("127.0.0.1:{}", self.port);
        let command = README_ADDRESSES
            .iter()
            .fold(command.to_string(), |c, a| c.replace(a, &address));
        let want = Answer::shown_status(shown);
        if !REPEATED.iter().any(|(s, _)| command.contains(s)) {
            return Answer::from_curl(&shell(&command, CURL_ARGS)?)?
                .check(shown, &mut self.bindings);
        }
        // Rounds of calls at once, so that even on a slow machine they come faster than the
        // limit refills; an answer with the status shown is checked.
        for _ in 0..ROUNDS {
            let answers: Vec<Result<Answer, String>> = std::thread::scope(|scope| {
                let calls: Vec<_> = (0..ROUND)
                    .map(|_| scope.spawn(|| Answer::from_curl(&shell(&command, CURL_ARGS)?)))
                    .collect();
                calls
                    .into_iter()
                    .map(|c| c.join().expect("curl thread"))
                    .collect()
            });
            let mut shown_one = None;
            for answer in answers {
                let answer = answer?;
                if answer.status == want {
                    shown_one = Some(answer);
                } else if !answer.status.is_some_and(|s| (200..300).contains(&s)) {
                    return answer.check(shown, &mut self.bindings);
                }
            }
            if let Some(answer) = shown_one {
                return answer.check(shown, &mut self.bindings);
            }
        }
        Err(format!(
            "never answered {want:?} in {ROUNDS} rounds of {ROUND} calls"
        ))
    }

    /// The tally example's command line for the built binary and the test's configuration.
    fn tally_command(&self, command: &str) -> Result<String, String> {
        let rest = command.strip_prefix("tally ").expect("a tally command");
        if rest == "version" {
            return Ok(format!("{} version", env!("CARGO_BIN_EXE_tally")));
        }
        if !CONFIG_NAMES.iter().any(|n| rest.contains(n)) {
            return Err(
                "a tally example needs `--config config/example.toml` (or the reader's \
                 `--config tally.toml`) to reach the test's Redis: add it, or exclude the example"
                    .into(),
            );
        }
        let config = format!("--config {}", self.config_path.display());
        let rest = CONFIG_NAMES
            .iter()
            .fold(rest.to_string(), |r, n| r.replace(n, &config));
        Ok(format!("{} {rest}", env!("CARGO_BIN_EXE_tally")))
    }

    /// Run a tally example; it must exit 0 and print what the README shows, if anything.
    fn tally(&mut self, command: &str, shown: &[String]) -> Result<(), String> {
        let stdout = shell(&self.tally_command(command)?, &[])?;
        let answer = Answer {
            status: None,
            headers: Vec::new(),
            body: stdout,
        };
        answer.check(shown, &mut self.bindings)
    }

    /// Run a redis-cli example against the test's Redis; it must exit 0 and print what the
    /// page shows, if anything.
    fn redis_cli(&mut self, command: &str, shown: &[String]) -> Result<(), String> {
        let rest = command
            .strip_prefix("redis-cli ")
            .expect("a redis-cli command");
        let stdout = shell(&format!("redis-cli -u {} {rest}", self.redis_url), &[])?;
        if stdout.starts_with("ERR") || stdout.contains("\nERR") {
            return Err(format!("Redis answered an error: {stdout}"));
        }
        let answer = Answer {
            status: None,
            headers: Vec::new(),
            body: stdout,
        };
        answer.check(shown, &mut self.bindings)
    }

    /// Run a [`HELD`] example: it must print a line, then exit 0 on SIGTERM.
    fn tally_held(&mut self, command: &str) -> Result<(), String> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {}", self.tally_command(command)?))
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        // Kept open until it exits: what it prints on the way out must not hit a closed pipe.
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut printed = String::new();
        stdout
            .read_line(&mut printed)
            .map_err(|e| format!("read: {e}"))?;
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let mut status = None;
        wait_until(Duration::from_secs(15), || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        let _ = stdout.read_to_string(&mut printed);
        match status {
            Some(s) if s.success() => Ok(()),
            Some(s) => Err(format!("{s} after SIGTERM; printed {printed:?}")),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "still running 15 s after SIGTERM; printed {printed:?}"
                ))
            }
        }
    }
}

/// Run `command` (plus `extra` arguments) with `sh -c`, as a reader pasting it would; its
/// stdout if it exits 0.
fn shell(command: &str, extra: &[&str]) -> Result<String, String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{command} \"$@\""))
        .arg("sh")
        .args(extra)
        .output()
        .map_err(|e| format!("sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{}; stdout {:?}; stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// curl is what a reader runs the examples with; the test uses the same binary.
fn require_curl() {
    let found = Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "curl is not installed: the README's examples run with it (scripts/setup.sh installs it)"
    );
}

/// README.md, then every page of the docs site in `docs/SUMMARY.md` order: one text, as a
/// reader goes through it (error lines count from the start of it). The lab notes
/// (`docs/lab/`) are outside the book: their commands are past benchmark runs.
fn documentation() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let docs = root.join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).expect("SUMMARY.md");
    let pages: Vec<String> = summary
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("- [").or_else(|| l.strip_prefix('['))?;
            Some(l.split("](").nth(1)?.trim_end_matches(')').to_string())
        })
        .collect();
    assert!(pages.len() > 20, "pages of docs/SUMMARY.md: {pages:?}");
    for page in pages {
        text.push('\n');
        text.push_str(
            &std::fs::read_to_string(docs.join(&page))
                .unwrap_or_else(|e| panic!("docs/{page}: {e}")),
        );
    }
    text.push_str(&help_examples(
        &std::fs::read_to_string(docs.join("reference/cli.md")).expect("reference/cli.md"),
    ));
    text
}

/// The examples of every command's `--help` (`docs/reference/cli.md` is their text, checked
/// against the binary by the docs-site test), as one shell block: the lines after `Example:` or
/// `Examples:` that start with a command, `;`-separated commands apart.
fn help_examples(cli: &str) -> String {
    let mut block = String::from("\n```sh\n");
    let mut in_examples = false;
    for line in cli.lines() {
        if matches!(line, "Example:" | "Examples:") {
            in_examples = true;
            continue;
        }
        if line.trim().is_empty() || line.starts_with("```") {
            in_examples = false;
            continue;
        }
        let command = line.trim();
        if in_examples && (command.starts_with("tally ") || command.starts_with("TALLY_")) {
            for one in command.split("; ") {
                block.push_str(one);
                block.push('\n');
            }
        }
    }
    block.push_str("```\n");
    assert!(block.lines().count() > 15, "--help examples: {block}");
    block
}

#[test]
fn every_readme_example_runs_and_answers_as_shown() {
    require_curl();
    let readme = documentation();
    let examples = extract::examples(&readme);

    let redis = LocalRedis::start(&[]).expect("redis-server");
    let config = config(&redis, &readme);
    let server = TallyProcess::start_command("serve", &config, "readme");
    let ready = wait_until(Duration::from_secs(20), || {
        http::get(server.port, "/health/ready").is_some_and(|(code, _)| code == 200)
    });
    assert!(ready, "tally serve not ready:\n{}", server.log());
    let config_path = std::env::temp_dir().join(format!(
        "tally-readme-cli-{}-{}.toml",
        std::process::id(),
        server.port
    ));
    std::fs::write(&config_path, &config).expect("write config");

    let mut bench = Bench {
        port: server.port,
        redis_url: redis.url(),
        config_path: config_path.clone(),
        bindings: BTreeMap::new(),
    };
    let (mut failures, mut ran, mut excluded) = (Vec::new(), 0, 0);
    for example in &examples {
        let Some(kind) = kind(&example.command) else {
            failures.push(format!(
                "README.md:{}: `{}` is neither run by this test nor in EXCLUDED",
                example.line, example.command
            ));
            continue;
        };
        if let Kind::Excluded(why) = kind {
            eprintln!(
                "excluded README.md:{} ({why}): {}",
                example.line, example.command
            );
            excluded += 1;
            continue;
        }
        eprintln!("running README.md:{}: {}", example.line, example.command);
        ran += 1;
        if let Err(e) = bench.run(example, &kind) {
            failures.push(format!(
                "README.md:{}: `{}`: {e}",
                example.line, example.command
            ));
        }
    }
    let _ = std::fs::remove_file(&config_path);

    // A rule that matches no example is stale: the README changed under it.
    for (s, why) in EXCLUDED.iter().chain(REPEATED).chain(HELD) {
        if !examples.iter().any(|e| e.command.contains(s)) {
            failures.push(format!(
                "no README example contains {s:?} ({why}): remove the rule"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} examples run failed ({excluded} excluded):\n{}\ntally serve log:\n{}",
        failures.len(),
        failures.join("\n"),
        server.log()
    );
    assert!(
        ran >= 10,
        "only {ran} examples found: is the README read right?"
    );
}
