//! Command-line conventions: every subcommand's `--help` shows an example, `--help` exits 0 and
//! a usage error exits 64 (EX_USAGE), like a bad configuration.

use std::process::Command;

const SUBCOMMANDS: &[&str] = &[
    "run",
    "demo",
    "check",
    "mock-broker",
    "produce",
    "key",
    "query",
    "state",
    "serve",
    "hit",
    "limit",
    "quota",
    "once",
    "lock",
    "version",
];

#[test]
fn every_subcommand_help_shows_an_example() {
    for sub in SUBCOMMANDS {
        let out = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args([sub, "--help"])
            .output()
            .expect("run tally");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "tally {sub} --help: {text}");
        assert!(
            text.contains("Example") && text.contains(&format!("tally {sub}")),
            "tally {sub} --help shows no example:\n{text}"
        );
    }
}

#[test]
fn usage_errors_exit_64() {
    for args in [
        &["run", "--no-such-flag"][..],
        &["no-such-command"][..],
        &["limit", "--subject", "s"][..],
        // A secret is never a flag's value (visible in `ps`): `tally top` reads TALLY_TOKEN or
        // --token-file.
        &["top", "--token", "s3cret", "http://127.0.0.1:1"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(args)
            .output()
            .expect("run tally");
        assert_eq!(
            out.status.code(),
            Some(64),
            "tally {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `tally version` (and `--version`) say which build this is: the package version and the git
/// commit of the checkout it was built from.
#[test]
fn version_names_the_package_and_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("version")
        .output()
        .expect("run tally");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with(&format!("tally {}\n", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let commit = head.unwrap_or_else(|| "unknown".into());
    assert!(text.contains(&format!("commit: {commit}\n")), "{text}");
    let short = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--version")
        .output()
        .expect("run tally");
    assert_eq!(
        String::from_utf8_lossy(&short.stdout).trim(),
        format!("tally {} ({commit})", env!("CARGO_PKG_VERSION"))
    );
}

/// A command that cannot reach Redis says which Redis (its password masked), and says the cause
/// once.
#[test]
fn redis_errors_name_the_redis_without_its_password() {
    // Port 1 on loopback: nothing listens there, the connection is refused at once.
    let url = "redis://user:pw-of-the-test@127.0.0.1:1";
    let dims = ["--dim", "app_id=a", "--dim", "device_id=d", "--dim", "ip=1"];
    for args in [
        &["query", "--counter", "flow"][..],
        &["hit", "--counter", "flow"][..],
        &["state"][..],
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tally"));
        command.args(args).args(["--redis-url", url]);
        if args[0] != "state" {
            command.args(dims);
        }
        let out = command.output().expect("run tally");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "tally {args:?}: {err}");
        assert!(
            err.contains("redis redis://user:***@127.0.0.1:1"),
            "tally {args:?} names the Redis: {err}"
        );
        assert!(!err.contains("pw-of-the-test"), "tally {args:?}: {err}");
        assert_eq!(
            err.matches("refused").count(),
            1,
            "tally {args:?} says the cause once: {err}"
        );
    }
}
