//! `tally-layers`: the source tree is a map, checked from Rust's own tokens (syn).
//!
//! * Imports run one way: no cycle between the children of any folder of a crate's `src/`, and
//!   at the service's top level none against the order of its stages (`layers.rs`).
//! * Sizes: no `.rs` file of a crate's `src/` over 500 lines; no struct over 12 fields in
//!   product code, except configuration sections (structs that derive `Deserialize`: inert data
//!   with one field per key, where a flattened split would lose `deny_unknown_fields`).
//! * Budgets with an allow list that can only shrink (`budgets.rs`, `allow.toml`): product
//!   functions over 80 lines, test functions over 120, one type name per type in a crate,
//!   a type's inherent `impl` in its own file.
//! * The maps: `src/lib.rs`'s `# Layout` names every top-level and `api/` module,
//!   `docs/guide/15-layout.md` names only paths that exist, and so do comments naming a `.rs`
//!   file (`maps.rs`).
//!
//! Usage: `cargo run -q -p tally-layers -- [--graph] [--self-test] [--shrink] [--root DIR]`;
//! exit 1 with the list of what is wrong. `--shrink` first rewrites the allow list to the tree
//! (deletes stale entries, lowers counts); it never adds an exception.

mod allow;
mod budgets;
mod items;
mod layers;
mod maps;
mod refs;
mod selftest;
mod tree;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use refs::{FileRefs, Resolver};
use tree::{Source, ALLOW, CRATES};

/// No `.rs` file of a crate's `src/` over this many lines.
pub const MAX_LINES: usize = 500;
/// No product struct over this many fields (configuration sections aside).
pub const MAX_FIELDS: usize = 12;

/// What a check found.
#[derive(Default)]
pub struct Report {
    pub problems: Vec<String>,
    pub summary: Vec<String>,
    /// How the allow list shrinks to the tree (see `budgets::Outcome::shrink`).
    pub shrink: Vec<(usize, Option<String>)>,
    pub files: usize,
}

/// The file-size and struct-field limits.
fn sizes(sources: &[Source], items: &[items::Items], problems: &mut Vec<String>) {
    for (s, items) in sources.iter().zip(items) {
        if s.krate.is_some() && s.lines > MAX_LINES {
            problems.push(format!(
                "{}: {} lines (at most {MAX_LINES})",
                s.path, s.lines
            ));
        }
        if !s.product() {
            continue;
        }
        for st in items
            .structs
            .iter()
            .filter(|st| !st.test && !st.deserialize && st.fields > MAX_FIELDS)
        {
            problems.push(format!(
                "{}:{}: struct {} has {} fields (at most {MAX_FIELDS})",
                s.path, st.line, st.name, st.fields
            ));
        }
    }
}

/// Each crate's resolver over its modules and its root's names.
fn resolvers(sources: &[Source], refs: &[FileRefs]) -> Vec<Resolver> {
    let mut out = Vec::new();
    for (k, spec) in CRATES.iter().enumerate() {
        let mut modules = std::collections::HashSet::new();
        let mut uses = Vec::new();
        for (s, r) in sources.iter().zip(refs).filter(|(s, _)| s.krate == Some(k)) {
            for n in 1..=s.module.len() {
                modules.insert(s.module[..n].to_vec());
            }
            modules.extend(r.inline_modules.iter().cloned());
            uses.extend(&r.uses);
        }
        out.push(Resolver::new(modules, spec.name, &uses));
    }
    out
}

/// Every check of the tree under `root`.
pub fn check(root: &Path, graph: bool) -> Report {
    let mut report = Report::default();
    let sources = tree::load(root, &mut report.problems);
    report.files = sources.len();
    let refs: Vec<FileRefs> = sources
        .iter()
        .map(|s| {
            refs::collect(
                &s.ast,
                &s.module,
                s.krate.map_or("tally", |k| CRATES[k].name),
                s.bin,
            )
        })
        .collect();
    let items: Vec<items::Items> = sources
        .iter()
        .map(|s| items::collect(&s.ast, &s.path, &s.module, s.test))
        .collect();
    let resolvers = resolvers(&sources, &refs);
    for (k, spec) in CRATES.iter().enumerate() {
        let of_crate: Vec<usize> = (0..sources.len())
            .filter(|&i| sources[i].krate == Some(k))
            .collect();
        let files: Vec<&Source> = of_crate.iter().map(|&i| &sources[i]).collect();
        let crate_refs: Vec<&FileRefs> = of_crate.iter().map(|&i| &refs[i]).collect();
        layers::check_crate(
            spec,
            &files,
            &crate_refs,
            &resolvers[k],
            &mut report.problems,
            graph,
        );
    }
    sizes(&sources, &items, &mut report.problems);
    let allow = match std::fs::read_to_string(root.join(ALLOW)) {
        Ok(text) => allow::parse(&text).unwrap_or_else(|e| {
            report.problems.push(format!("{ALLOW}: {e}"));
            allow::Allow::default()
        }),
        Err(_) => allow::Allow::default(),
    };
    let tree = budgets::Tree {
        sources: &sources,
        items: &items,
        refs: &refs,
        resolvers: &resolvers,
    };
    let outcome = budgets::check(&tree, &allow);
    report.problems.extend(outcome.problems);
    report.summary = outcome.summary;
    report.shrink = outcome.shrink;
    maps::check(root, &sources, &mut report.problems);
    report
}

/// Rewrite the allow list to the tree: stale entries deleted, counts lowered. Returns how
/// many entries were deleted and how many rewritten.
pub fn shrink_allow(root: &Path) -> Result<(usize, usize), String> {
    let report = check(root, false);
    if report.shrink.is_empty() {
        return Ok((0, 0));
    }
    let path = root.join(ALLOW);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{ALLOW}: {e}"))?;
    let shrunk = allow::shrink(&text, &report.shrink);
    std::fs::write(&path, shrunk).map_err(|e| format!("{ALLOW}: {e}"))?;
    let deleted = report.shrink.iter().filter(|(_, to)| to.is_none()).count();
    Ok((deleted, report.shrink.len() - deleted))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let (mut graph, mut shrink) = (false, false);
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--self-test" => return selftest::run(),
            "--graph" => graph = true,
            "--shrink" => shrink = true,
            "--root" => root = iter.next().map(PathBuf::from).unwrap_or(root),
            "-h" | "--help" => {
                println!("usage: tally-layers [--graph] [--self-test] [--shrink] [--root DIR]");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("tally-layers: unknown argument {other} (see --help)");
                return ExitCode::from(2);
            }
        }
    }
    if shrink {
        match shrink_allow(&root) {
            Ok((deleted, lowered)) => {
                println!("tally-layers: {ALLOW}: {deleted} entries deleted, {lowered} lowered")
            }
            Err(e) => {
                eprintln!("tally-layers: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let started = Instant::now();
    let report = check(&root, graph);
    for p in &report.problems {
        println!("{p}");
    }
    for line in &report.summary {
        println!("tally-layers: {line}");
    }
    let took = started.elapsed().as_millis();
    if !report.problems.is_empty() {
        eprintln!(
            "tally-layers: {} problem(s) in {} files ({took} ms)",
            report.problems.len(),
            report.files
        );
        return ExitCode::FAILURE;
    }
    println!(
        "tally-layers: {} files, no cycle, no upward import, no file over {MAX_LINES} lines, no struct over \
         {MAX_FIELDS} fields, budgets within {ALLOW}, maps true ({took} ms)",
        report.files
    );
    ExitCode::SUCCESS
}
