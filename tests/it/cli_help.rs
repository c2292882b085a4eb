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
