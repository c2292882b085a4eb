//! The files checked: every `.rs` file of the crates' `src/` and of the test folders, parsed
//! once, each with its module path and whether it is test code.

use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::{Attribute, Item};

/// A crate of the workspace whose `src/` is checked.
pub struct CrateSpec {
    /// Its source folder, relative to the repository root.
    pub src: &'static str,
    /// The name its own code and its binary use for it (`tally::`).
    pub name: &'static str,
    /// Product code: the function, impl and type-name budgets apply (tests and tools are not).
    pub product: bool,
}

/// The crates checked: the service, the library, and the tools (this one included).
pub const CRATES: &[CrateSpec] = &[
    CrateSpec {
        src: "src",
        name: "tally",
        product: true,
    },
    CrateSpec {
        src: "crates/tally-counters/src",
        name: "tally_counters",
        product: true,
    },
    CrateSpec {
        src: "crates/tally-testkit/src",
        name: "tally_testkit",
        product: false,
    },
    CrateSpec {
        src: "crates/tally-bench/src",
        name: "tally_bench",
        product: false,
    },
    CrateSpec {
        src: "crates/tally-layers/src",
        name: "tally_layers",
        product: false,
    },
];

/// Test folders: read for the test-function budget only.
pub const TEST_ROOTS: &[&str] = &["tests", "crates/tally-counters/tests"];

/// The allow list of the budgets, relative to the repository root.
pub const ALLOW: &str = "crates/tally-layers/allow.toml";

/// One parsed file.
pub struct Source {
    /// Relative to the repository root, with `/`.
    pub path: String,
    /// Index into [`CRATES`]; `None` for a test folder.
    pub krate: Option<usize>,
    /// Its module path in its crate (`lib.rs`, `main.rs` and a test root are `[]`).
    pub module: Vec<String>,
    /// The whole file is test code (a test folder, `tests.rs`, or declared under `#[cfg(test)]`).
    pub test: bool,
    /// Part of the crate's binary (`main.rs` and the modules it declares), beside a `lib.rs`:
    /// its `crate::` is the binary's root, its `tally::` the library's.
    pub bin: bool,
    /// Newlines in the file, as the file-size limit counts them.
    pub lines: usize,
    pub text: String,
    pub ast: syn::File,
}

impl Source {
    /// Product code of a product crate (a file of tests is not).
    pub fn product(&self) -> bool {
        !self.test && self.krate.is_some_and(|k| CRATES[k].product)
    }
}

/// Every `.rs` file below `dir`, sorted.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path from its path under `src/`: `stream/sink/mod.rs` is `stream::sink`.
pub fn module_of(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Test files by name: `tests.rs`, a name ending in `_tests` or starting with `tests_`, or
/// anything in a `tests/` folder.
fn test_by_name(rel: &str) -> bool {
    let mut parts = rel.split('/').collect::<Vec<_>>();
    let file = parts.pop().unwrap_or_default();
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    stem == "tests"
        || stem.ends_with("_tests")
        || stem.starts_with("tests_")
        || parts.contains(&"tests")
}

/// `#[cfg(test)]`, or any `cfg` that requires `test` (`all(test, ..)`), not `not(test)`.
pub fn is_cfg_test(attrs: &[Attribute]) -> bool {
    fn requires_test(tokens: TokenStream) -> bool {
        let mut iter = tokens.into_iter().peekable();
        while let Some(tree) = iter.next() {
            match tree {
                TokenTree::Ident(i) if i == "not" => {
                    iter.next(); // the negated group
                }
                TokenTree::Ident(i) if i == "test" => return true,
                TokenTree::Group(g) if requires_test(g.stream()) => return true,
                _ => {}
            }
        }
        false
    }
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if requires_test(l.tokens.clone()))
    })
}

/// `#[test]`, `#[tokio::test]` and the like.
pub fn has_test_attr(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().segments.last().is_some_and(|s| s.ident == "test"))
}

/// Read and parse the files of one folder; a file that does not parse is a problem.
fn load_dir(
    root: &Path,
    dir: &str,
    krate: Option<usize>,
    problems: &mut Vec<String>,
) -> Vec<Source> {
    let mut files = Vec::new();
    walk(&root.join(dir), &mut files);
    let mut out = Vec::new();
    for full in files {
        let rel = full
            .strip_prefix(root.join(dir))
            .unwrap_or(&full)
            .to_string_lossy()
            .replace('\\', "/");
        let path = format!("{dir}/{rel}");
        let text = match fs::read_to_string(&full) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{path}: cannot be read: {e}"));
                continue;
            }
        };
        let ast = match syn::parse_file(&text) {
            Ok(ast) => ast,
            Err(e) => {
                let line = e.span().start().line;
                problems.push(format!("{path}:{line}: does not parse as Rust: {e}"));
                continue;
            }
        };
        let test = krate.is_none() || test_by_name(&rel);
        let lines = text.matches('\n').count();
        out.push(Source {
            path,
            krate,
            module: module_of(&rel),
            test,
            bin: false,
            lines,
            text,
            ast,
        });
    }
    out
}

/// A `mod x;` declaration: the module it declares, whether it is test code (under
/// `#[cfg(test)]` or in a test file), and its file when `#[path]` names it.
struct Decl {
    module: Vec<String>,
    test: bool,
    path: Option<String>,
    /// The `#[path]` file is beside the declaring file (no `..`): the declared module is its
    /// own. A file up the tree is shared by several crates (a benchmark's binaries), and keeps
    /// the module of its place.
    beside: bool,
}

/// The `#[path = ".."]` of a declaration, relative to the declaring file's folder, and
/// whether it stays beside it.
fn path_attr(attrs: &[Attribute], declaring: &str) -> Option<(String, bool)> {
    let value = attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })?;
    let mut parts: Vec<&str> = declaring.split('/').collect();
    parts.pop();
    for part in value.split('/') {
        match part {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            p => parts.push(p),
        }
    }
    Some((parts.join("/"), !value.split('/').any(|p| p == "..")))
}

/// Every `mod x;` of a file (inline modules walked through).
fn declarations(source: &Source) -> Vec<Decl> {
    fn walk(items: &[Item], module: &mut Vec<String>, test: bool, file: &str, out: &mut Vec<Decl>) {
        for item in items {
            let Item::Mod(m) = item else { continue };
            let test = test || is_cfg_test(&m.attrs);
            module.push(m.ident.to_string());
            match &m.content {
                Some((_, inner)) => walk(inner, module, test, file, out),
                None => {
                    let (path, beside) = path_attr(&m.attrs, file).unzip();
                    let beside = beside.unwrap_or(true);
                    out.push(Decl {
                        module: module.clone(),
                        test,
                        path,
                        beside,
                    });
                }
            }
            module.pop();
        }
    }
    let mut out = Vec::new();
    walk(
        &source.ast.items,
        &mut source.module.clone(),
        source.test,
        &source.path,
        &mut out,
    );
    out
}

/// Crate `k`'s declarations applied: a file named by `#[path]` takes the declared module, and
/// a file declared under `#[cfg(test)]` (or from a test file) is test code.
fn apply_declarations(sources: &mut [Source], k: usize) {
    for pass in 0..2 {
        let decls: Vec<Decl> = sources
            .iter()
            .filter(|s| s.krate == Some(k))
            .flat_map(declarations)
            .collect();
        for s in sources.iter_mut().filter(|s| s.krate == Some(k)) {
            for d in &decls {
                let named = d.path.as_deref() == Some(s.path.as_str());
                if named && d.beside && pass == 0 {
                    s.module = d.module.clone();
                }
                if d.test && (named || (d.path.is_none() && s.module.starts_with(&d.module))) {
                    s.test = true;
                }
            }
        }
    }
}

/// The files of crate `k`'s binary, when it has a library too.
fn mark_bin(sources: &mut [Source], k: usize) {
    let (main, lib) = (
        format!("{}/main.rs", CRATES[k].src),
        format!("{}/lib.rs", CRATES[k].src),
    );
    if !sources.iter().any(|s| s.path == lib) {
        return;
    }
    let Some(main) = sources.iter().find(|s| s.path == main) else {
        return;
    };
    let heads: Vec<String> = main
        .ast
        .items
        .iter()
        .filter_map(|i| {
            if let Item::Mod(m) = i {
                Some(m.ident.to_string())
            } else {
                None
            }
        })
        .collect();
    for s in sources.iter_mut().filter(|s| s.krate == Some(k)) {
        s.bin = s.path == format!("{}/main.rs", CRATES[k].src)
            || s.module.first().is_some_and(|h| heads.contains(h));
    }
}

/// Every file of every crate and test folder under `root`, parsed.
pub fn load(root: &Path, problems: &mut Vec<String>) -> Vec<Source> {
    let mut sources = Vec::new();
    for (k, spec) in CRATES.iter().enumerate() {
        sources.extend(load_dir(root, spec.src, Some(k), problems));
    }
    for dir in TEST_ROOTS {
        sources.extend(load_dir(root, dir, None, problems));
    }
    for k in 0..CRATES.len() {
        apply_declarations(&mut sources, k);
        mark_bin(&mut sources, k);
    }
    sources
}
