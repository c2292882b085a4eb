//! The budgets that today's tree does not meet everywhere yet: functions over 80 lines in
//! product code, test functions over 120 lines, a type name declared twice in one crate's
//! product code, and a type's inherent `impl` outside its own file. Each exception is listed in
//! the allow list; the check fails on an exception not listed, on a listed one that is gone
//! (stale: the list can only shrink) and on a listed function that grew past its count.

use std::collections::{BTreeMap, BTreeSet};

use crate::allow::{Allow, Value};
use crate::items::{ImplInfo, Items};
use crate::refs::{FileRefs, Resolver};
use crate::tree::{Source, ALLOW, CRATES};

/// Product functions and methods: at most this many lines.
pub const MAX_FN_LINES: usize = 80;
/// Test functions (and the helpers in test code): at most this many lines.
pub const MAX_TEST_FN_LINES: usize = 120;

/// What the budget checks read: every source with what it defines and refers to.
pub struct Tree<'a> {
    pub sources: &'a [Source],
    pub items: &'a [Items],
    pub refs: &'a [FileRefs],
    /// One per crate of [`CRATES`].
    pub resolvers: &'a [Resolver],
}

/// Problems (failing), the summary lines (printed either way), and how the allow list shrinks
/// to the tree (`--shrink`).
#[derive(Default)]
pub struct Outcome {
    pub problems: Vec<String>,
    pub summary: Vec<String>,
    /// (line of the allow list, its new text or `None` to delete it): only ever smaller.
    pub shrink: Vec<(usize, Option<String>)>,
}

impl Outcome {
    /// A listed exception that is no longer one (or no longer as large).
    fn stale(&mut self, section: &str, key: &str, line: usize, now: &str, to: Option<String>) {
        let fix = if to.is_some() {
            "shrink the entry"
        } else {
            "delete the entry"
        };
        self.problems.push(format!(
            "{ALLOW}:{line}: [{section}] \"{key}\" is stale ({now}): {fix} (--shrink does)"
        ));
        self.shrink.push((line, to));
    }
}

/// Functions over `max` lines (`test`: in test code, else in product code) against `section`.
fn fn_lengths(
    tree: &Tree,
    allow: &Allow,
    section: &str,
    max: usize,
    test: bool,
    out: &mut Outcome,
) {
    let mut over: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut all: BTreeMap<String, usize> = BTreeMap::new();
    for (s, items) in tree.sources.iter().zip(tree.items) {
        for f in &items.fns {
            let is_test = s.test || f.test;
            if is_test != test || (!test && !s.product()) {
                continue;
            }
            let mut key = f.key.clone();
            let mut n = 1;
            while all.contains_key(&key) {
                n += 1;
                key = format!("{}#{n}", f.key);
            }
            all.insert(key.clone(), f.lines);
            if f.lines > max {
                over.insert(key, (f.lines, format!("{}:{}", s.path, f.line)));
            }
        }
    }
    let listed: BTreeMap<&String, _> = allow.section(section).collect();
    for (key, (lines, at)) in &over {
        match listed.get(key).map(|e| (&e.value, e.line)) {
            None => out.problems.push(format!(
                "{at}: fn {key} has {lines} lines (at most {max}; [{section}] in {ALLOW} lists only the exceptions of 2026-12-07)"
            )),
            Some((Value::Int(n), line)) if lines > n => out.problems.push(format!(
                "{at}: fn {key} grew to {lines} lines, past its {n} in {ALLOW}:{line} (at most {max})"
            )),
            Some((Value::Int(n), line)) if lines < n => out.shrink.push((line, Some(format!("\"{key}\" = {lines}")))),
            Some((Value::Int(_), _)) => {}
            Some((_, line)) => out.problems.push(format!("{ALLOW}:{line}: [{section}] \"{key}\" needs a line count")),
        }
    }
    for (key, entry) in &listed {
        if !over.contains_key(*key) {
            let now = all
                .get(*key)
                .map_or("no such function".into(), |n| format!("{n} lines now"));
            out.stale(section, key, entry.line, &now, None);
        }
    }
    let list: Vec<String> = over
        .iter()
        .map(|(k, (n, _))| format!("{} {n}", short(k)))
        .collect();
    let what = if test { "test functions" } else { "functions" };
    out.summary.push(format!(
        "{} {what} over {max} lines allowed ({})",
        over.len(),
        list.join(", ")
    ));
}

/// `src/a/b.rs::Type::f` -> `Type::f` (or `b::f` for a free function).
fn short(key: &str) -> String {
    let parts: Vec<&str> = key.split("::").collect();
    let mut folders = parts[0].rsplit('/');
    let mut file = folders.next().unwrap_or_default().trim_end_matches(".rs");
    if file == "mod" {
        file = folders.next().unwrap_or_default();
    }
    match parts.len() {
        2 => format!("{file}::{}", parts[1]),
        _ => parts[1..].join("::"),
    }
}

/// Type names declared in more than one file of one crate's product code.
fn duplicate_names(tree: &Tree, allow: &Allow, out: &mut Outcome) {
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (s, items) in tree.sources.iter().zip(tree.items) {
        let Some(k) = s.krate.filter(|_| s.product()) else {
            continue;
        };
        for t in items.types.iter().filter(|t| !t.test) {
            found
                .entry(format!("{}::{}", CRATES[k].name, t.name))
                .or_default()
                .insert(s.path.clone());
        }
    }
    found.retain(|_, files| files.len() > 1);
    let listed: BTreeMap<&String, _> = allow.section("duplicate_names").collect();
    for (key, files) in &found {
        let list: Vec<&str> = files.iter().map(String::as_str).collect();
        match listed.get(key).map(|e| (&e.value, e.line)) {
            Some((Value::List(l), line)) => {
                let l: BTreeSet<String> = l.iter().cloned().collect();
                if files.is_subset(&l) && files != &l {
                    let to = list
                        .iter()
                        .map(|f| format!("\"{f}\""))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let now = format!("now only in {}", list.join(", "));
                    out.stale(
                        "duplicate_names",
                        key,
                        line,
                        &now,
                        Some(format!("\"{key}\" = [{to}]")),
                    );
                } else if !files.is_subset(&l) {
                    out.problems.push(format!(
                        "{key} is declared in {} (more than {ALLOW}:{line} lists)",
                        list.join(", ")
                    ));
                }
            }
            Some((_, line)) => out.problems.push(format!(
                "{ALLOW}:{line}: \"{key}\" needs the list of its files"
            )),
            None => out.problems.push(format!(
                "type name {key} is declared in {}: one name, one type in a crate's product code",
                list.join(", ")
            )),
        }
    }
    for (key, entry) in &listed {
        if !found.contains_key(*key) {
            out.stale("duplicate_names", key, entry.line, "declared once", None);
        }
    }
    out.summary.push(format!(
        "{} duplicate type names allowed ({})",
        found.len(),
        found
            .keys()
            .map(|k| k.split("::").last().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(", ")
    ));
}

/// The file that declares the type an inherent impl is for (in its crate's product code).
fn owner_file<'a>(
    tree: &'a Tree,
    k: usize,
    s: &Source,
    refs: &FileRefs,
    imp: &ImplInfo,
) -> Option<&'a str> {
    let name = imp.segs.last()?;
    let defs: Vec<(&'a Source, &Vec<String>)> = tree
        .sources
        .iter()
        .zip(tree.items)
        .filter(|(d, _)| d.krate == Some(k) && d.product())
        .flat_map(|(d, items)| {
            items
                .types
                .iter()
                .filter(|t| &t.name == name && !t.test)
                .map(move |t| (d, &t.module))
        })
        .collect();
    if defs.len() <= 1 {
        return defs.first().map(|(d, _)| d.path.as_str());
    }
    if let Some((d, _)) = defs.iter().find(|(d, _)| d.path == s.path) {
        return Some(d.path.as_str());
    }
    // Written as a path, or imported by name: the module it comes from.
    let resolver = &tree.resolvers[k];
    let written = match imp.segs.len() {
        1 => refs
            .uses
            .iter()
            .find(|u| &u.name == name && imp.module.starts_with(&u.module))
            .map(|u| (&u.segs, &u.module)),
        _ => Some((&imp.segs, &imp.module)),
    };
    let module = written
        .and_then(|(segs, at)| resolver.absolute(segs.split_last()?.1, at, s.bin))
        .map(|m| resolver.module(&m));
    // The declaration in that module, else the one nearest to it (or to the impl).
    let near = module.as_ref().unwrap_or(&imp.module);
    let best = defs.iter().max_by_key(|(_, m)| {
        let common = m.iter().zip(near).take_while(|(a, b)| a == b).count();
        (module.as_ref() == Some(*m), common)
    });
    best.map(|(d, _)| d.path.as_str())
}

/// Inherent impls outside the file of their type (a second file needs a reason in the list).
fn split_impls(tree: &Tree, allow: &Allow, out: &mut Outcome) {
    // (name, home) -> file -> first impl line
    let mut owners: BTreeMap<(String, String), BTreeMap<String, usize>> = BTreeMap::new();
    for ((s, items), refs) in tree.sources.iter().zip(tree.items).zip(tree.refs) {
        let Some(k) = s.krate.filter(|_| s.product()) else {
            continue;
        };
        for imp in items.impls.iter().filter(|i| !i.test) {
            let Some(name) = imp.segs.last() else {
                continue;
            };
            let home = owner_file(tree, k, s, refs, imp)
                .unwrap_or(&s.path)
                .to_string();
            owners
                .entry((name.clone(), home))
                .or_default()
                .entry(s.path.clone())
                .or_insert(imp.line);
        }
    }
    let mut extra: BTreeMap<String, String> = BTreeMap::new(); // "Type: file" -> "file:line"
    let mut per_type: BTreeMap<String, usize> = BTreeMap::new();
    for ((name, home), files) in &owners {
        let home = if files.contains_key(home) {
            home.clone()
        } else {
            files.keys().next().cloned().unwrap_or_default()
        };
        for (file, line) in files.iter().filter(|(f, _)| **f != home) {
            extra.insert(
                format!("{name}: {file}"),
                format!("{file}:{line}: impl {name} outside its home file {home}"),
            );
            *per_type.entry(name.clone()).or_default() += 1;
        }
    }
    let listed: BTreeMap<&String, _> = allow.section("split_impls").collect();
    for (key, what) in &extra {
        match listed.get(key).map(|e| (&e.value, e.line)) {
            Some((Value::Str(reason), _)) if !reason.trim().is_empty() => {}
            Some((_, line)) => out.problems.push(format!("{ALLOW}:{line}: \"{key}\" needs a reason (a string)")),
            None => out.problems.push(format!(
                "{what} (one type, one file: a second file needs \"{key}\" = \"why\" in [split_impls] of {ALLOW})"
            )),
        }
    }
    for (key, entry) in &listed {
        if !extra.contains_key(*key) {
            out.stale("split_impls", key, entry.line, "no impl of it there", None);
        }
    }
    let list: Vec<String> = per_type.iter().map(|(t, n)| format!("{t} +{n}")).collect();
    let over: Vec<String> = per_type
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(t, n)| format!("{t} {}", n + 1))
        .collect();
    out.summary.push(format!(
        "{} impl files apart from their type allowed ({}); types in more than two files, to fold back: {}",
        extra.len(),
        list.join(", "),
        if over.is_empty() { "none".to_string() } else { over.join(", ") }
    ));
}

/// Every budget against the allow list.
pub fn check(tree: &Tree, allow: &Allow) -> Outcome {
    let mut out = Outcome::default();
    fn_lengths(tree, allow, "long_fns", MAX_FN_LINES, false, &mut out);
    fn_lengths(
        tree,
        allow,
        "long_test_fns",
        MAX_TEST_FN_LINES,
        true,
        &mut out,
    );
    duplicate_names(tree, allow, &mut out);
    split_impls(tree, allow, &mut out);
    out
}
