//! `--self-test`: the check finds what it is for. Each fault is planted alone in a fresh copy
//! of a small clean tree (whose strings and comments hold upward paths that are not imports),
//! and the check must name it; the clean tree must pass.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::tree::ALLOW;

const LIB: &str = "//! # Planted\n//!\n//! # Layout\n//!\n//! * `cli/`; [`api`]: [`api::rls`]; [`stream`]; [`ops`]; [`config`].\n\
                   //!\n//! # After\n\npub mod api;\npub mod config;\npub mod ops;\npub mod stream;\n\
                   pub use std::collections as key;\n";

/// A tree that passes: downward imports only, and upward paths only in strings and comments.
fn clean() -> Files {
    let files: &[(&str, &str)] = &[
        ("src/lib.rs", LIB),
        // The binary's `key` is not the library's: `crate::key` in config is std's.
        ("src/main.rs", "mod cli;\nuse cli::run as key;\nfn main() { key() }\n"),
        ("src/cli/mod.rs", "pub fn run() { let _ = tally::api::rls::MAX; }\n"),
        (
            "src/config/mod.rs",
            "pub struct Model;\n/// Not an import: `crate::api::rls::MAX`.\n\
             pub const URL: &str = \"https://example.org/crate::api::rls\"; // crate::api::rls\n\
             /* crate::stream::a */\npub fn f() -> &'static str { \"crate::ops::x\" }\n\
             pub type Map = crate::key::HashMap<u8, u8>;\n",
        ),
        ("src/ops/mod.rs", "use crate::config::Model;\npub fn f(_: &Model) {}\n"),
        ("src/stream/mod.rs", "pub mod a;\npub mod b;\n"),
        ("src/stream/a.rs", "use super::b::B;\npub struct A;\nimpl A {\n    pub fn new(_: B) -> A {\n        A\n    }\n}\n"),
        ("src/stream/b.rs", "pub struct B;\n#[cfg(test)]\n#[path = \"b_props.rs\"]\nmod props;\n"),
        ("src/api/mod.rs", "pub mod rls;\n"),
        ("src/api/rls.rs", "use crate::stream::a::A;\npub const MAX: usize = 1;\npub fn g(_: &A) {}\n"),
        (ALLOW, "# planted\n[long_fns]\n"),
        ("docs/guide/15-layout.md", "# Layout\n\n`src/stream/a.rs`, `stream/{a,b}.rs` and `api/`.\n"),
        ("tests/it/main.rs", "#[test]\nfn short() {}\n"),
    ];
    let mut files: Files = files.iter().map(|(p, t)| (*p, t.to_string())).collect();
    // Test code by its declaration only: its names and functions are not the product's.
    files.push((
        "src/stream/b_props.rs",
        format!("pub struct B;\n{}", long_fn("", "long", 80)),
    ));
    files
}

/// A function of `body` lines between its `fn` line and its closing brace.
fn long_fn(attr: &str, name: &str, body: usize) -> String {
    format!(
        "{attr}fn {name}() {{\n{}}}\n",
        "    let _ = 1;\n".repeat(body)
    )
}

/// Files written over the clean tree: (path, text).
type Files = Vec<(&'static str, String)>;

/// A fault: what it is, the files it writes over the clean tree, what the check must say.
type Fault = (&'static str, Files, String);

/// Every fault planted.
fn faults() -> Vec<Fault> {
    let mut all = layer_faults();
    all.extend(budget_faults());
    all
}

/// The import faults, and a struct too wide.
fn layer_faults() -> Vec<Fault> {
    let owner: String = (1..14).map(|i| format!("    pub f{i}: u8,\n")).collect();
    let lib = |extra: &str| format!("{LIB}{extra}");
    vec![
        (
            "an upward import after a string holding //",
            vec![("src/config/mod.rs", "pub struct Model;\npub const URL: &str = \"https://example.org/x\";\n\
                  pub fn f() -> usize { crate::api::rls::MAX }\npub const Y: &str = \"y\";\n".into())],
            "src: config imports api, a stage above it (src/config/mod.rs:3)".into(),
        ),
        (
            "an upward import through a lib.rs re-export",
            vec![
                ("src/lib.rs", lib("pub use stream::a::A as S;\n")),
                ("src/config/mod.rs", "pub struct Model;\npub fn g(_: &crate::S) {}\n".into()),
            ],
            "src: config imports stream, a stage above it (src/config/mod.rs:2)".into(),
        ),
        (
            "an upward import inside a macro call",
            vec![("src/config/mod.rs", "pub struct Model;\npub fn h() {\n    println!(\"{}\", crate::api::rls::MAX);\n}\n".into())],
            "src: config imports api, a stage above it (src/config/mod.rs:3)".into(),
        ),
        (
            "an upward import by super:: from an inline module",
            vec![("src/ops/mod.rs", "mod inner {\n    pub fn f() -> usize {\n        super::super::api::rls::MAX\n    }\n}\n".into())],
            "src: ops imports api, a stage above it (src/ops/mod.rs:3)".into(),
        ),
        ("a top-level module outside the layers", vec![("src/extra/mod.rs", "use crate::config::Model;\n".into())], "top-level module extra has no place".into()),
        (
            "a 14-field struct whose first field is Box<dyn Fn(u8) -> u8>",
            vec![("src/ops/owner.rs", format!("pub struct Owner {{\n    pub call: Box<dyn Fn(u8) -> u8>,\n{owner}}}\n"))],
            "src/ops/owner.rs:1: struct Owner has 14 fields (at most 12)".into(),
        ),
        (
            "an import cycle between siblings",
            vec![("src/stream/b.rs", "use crate::stream::{a::A};\npub struct B;\npub fn f(_: A) {}\n".into())],
            "src/stream: cycle between a, b: a -> b (src/stream/a.rs:1); b -> a (src/stream/b.rs:1)".into(),
        ),
    ]
}

/// The size and budget faults, and the maps'.
fn budget_faults() -> Vec<Fault> {
    let lib = |extra: &str| format!("{LIB}{extra}");
    vec![
        (
            "a file over 500 lines",
            vec![("src/ops/big.rs", "\n".repeat(501))],
            "src/ops/big.rs: 501 lines (at most 500)".into(),
        ),
        (
            "a function over 80 lines",
            vec![("src/ops/long.rs", long_fn("", "long", 80))],
            "src/ops/long.rs:1: fn src/ops/long.rs::long has 82 lines".into(),
        ),
        (
            "a test function over 120 lines",
            vec![("tests/it/main.rs", long_fn("#[test]\n", "long", 120))],
            "tests/it/main.rs:2: fn tests/it/main.rs::long has 122 lines".into(),
        ),
        (
            "a listed function that grew",
            vec![
                ("src/ops/long.rs", long_fn("", "long", 80)),
                (ALLOW, "[long_fns]\n\"src/ops/long.rs::long\" = 81\n".into()),
            ],
            "fn src/ops/long.rs::long grew to 82 lines, past its 81".into(),
        ),
        (
            "a stale allow entry",
            vec![(ALLOW, "[long_fns]\n\"src/ops/mod.rs::gone\" = 90\n".into())],
            format!("{ALLOW}:2: [long_fns] \"src/ops/mod.rs::gone\" is stale"),
        ),
        (
            "a second impl file",
            vec![(
                "src/stream/b.rs",
                "pub struct B;\nimpl super::a::A {\n    pub fn more(&self) {}\n}\n".into(),
            )],
            "src/stream/b.rs:2: impl A outside its home file src/stream/a.rs".into(),
        ),
        (
            "a duplicate type name",
            vec![("src/ops/model.rs", "pub enum Model {}\n".into())],
            "type name tally::Model is declared in src/config/mod.rs, src/ops/model.rs".into(),
        ),
        (
            "a module missing from the Layout",
            vec![
                ("src/lib.rs", lib("pub mod jobs;\n")),
                ("src/jobs/mod.rs", String::new()),
            ],
            "src/lib.rs: module jobs is not named in the `# Layout` section".into(),
        ),
        (
            "an api module missing from the Layout",
            vec![
                ("src/api/mod.rs", "pub mod rls;\npub mod rlqs;\n".into()),
                ("src/api/rlqs.rs", String::new()),
            ],
            "src/lib.rs: module api::rlqs is not named".into(),
        ),
        (
            "a comment naming a file that does not exist",
            vec![(
                "src/ops/mod.rs",
                "//! Reads `../config/mod.rs` and `stream/{a,c}.rs`.\n".into(),
            )],
            "src/ops/mod.rs:1: `stream/c.rs` names no file of the tree".into(),
        ),
        (
            "a path of the layout page that does not exist",
            vec![(
                "docs/guide/15-layout.md",
                "# Layout\n\n`request/limit.rs`\n".into(),
            )],
            "docs/guide/15-layout.md:3: `request/limit.rs` names no file or folder".into(),
        ),
    ]
}

fn plant(dir: &Path, files: &[(&str, String)]) -> Result<(), String> {
    for (rel, text) in files {
        let path = dir.join(rel);
        let parent = path.parent().ok_or("no parent")?;
        fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The problems the check finds in the clean tree with `fault` written over it.
fn check_planted(n: usize, fault: &[(&str, String)]) -> Result<Vec<String>, String> {
    let dir = planted(n, fault)?;
    let report = crate::check(&dir, false);
    let _ = fs::remove_dir_all(&dir);
    Ok(report.problems)
}

/// The clean tree with `fault` written over it, in a fresh temporary folder.
fn planted(n: usize, fault: &[(&str, String)]) -> Result<PathBuf, String> {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("tally-layers-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    plant(&dir, &clean())?;
    plant(&dir, fault)?;
    Ok(dir)
}

/// `--shrink` deletes the stale entries and lowers a count, and adds nothing: an exception
/// not listed still fails after it.
fn shrinks() -> Result<(), String> {
    let allow =
        "# kept\n[long_fns]\n\"src/ops/long.rs::long\" = 90\n\"src/ops/mod.rs::gone\" = 90\n\
                 [duplicate_names]\n\"tally::B\" = [\"src/stream/a.rs\", \"src/stream/b.rs\"]\n";
    let fault = [
        ("src/ops/long.rs", long_fn("", "long", 80)),
        ("src/ops/longer.rs", long_fn("", "longer", 81)),
        (ALLOW, allow.to_string()),
    ];
    let dir = planted(99, &fault)?;
    crate::shrink_allow(&dir)?;
    let text = fs::read_to_string(dir.join(ALLOW)).map_err(|e| e.to_string())?;
    let problems = crate::check(&dir, false).problems;
    let _ = fs::remove_dir_all(&dir);
    let want = "# kept\n[long_fns]\n\"src/ops/long.rs::long\" = 82\n[duplicate_names]\n";
    if text != want || problems.len() != 1 || !problems[0].contains("longer has 83 lines") {
        return Err(format!(
            "--shrink: the list became\n{text}with problems {problems:?}"
        ));
    }
    Ok(())
}

/// Every fault caught, the clean tree passing: the number of faults, or what went wrong.
pub fn self_test() -> Result<usize, String> {
    let problems = check_planted(0, &[])?;
    if !problems.is_empty() {
        return Err(format!("the clean tree fails:\n{}", problems.join("\n")));
    }
    let faults = faults();
    for (n, (what, files, expected)) in faults.iter().enumerate() {
        let problems = check_planted(n + 1, files)?;
        if !problems.iter().any(|p| p.contains(expected.as_str())) {
            return Err(format!(
                "{what}: not caught (wanted `{expected}`), found:\n{}",
                problems.join("\n")
            ));
        }
    }
    shrinks()?;
    Ok(faults.len())
}

pub fn run() -> ExitCode {
    match self_test() {
        Ok(n) => {
            println!(
                "tally-layers: self-test passed ({n} planted faults caught, the clean tree passes)"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tally-layers: self-test failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_planted_fault_is_caught() {
        assert_eq!(super::self_test(), Ok(super::faults().len()));
    }
}
