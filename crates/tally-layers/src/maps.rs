//! The code maps stay true: every module of the service's top level and of `src/api/` is named
//! in the `# Layout` section of `src/lib.rs`, every path that `docs/guide/15-layout.md` names in
//! backticks exists, and so does every `.rs` file a comment names in backticks.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use syn::Item;

use crate::tree::{is_cfg_test, Source};

/// The layout page of the guide.
pub const GUIDE: &str = "docs/guide/15-layout.md";

/// The `# Layout` section of a crate's `//!` documentation (up to the next `# ` heading).
fn layout_section(lib: &Source) -> Option<String> {
    let mut lines = Vec::new();
    for attr in &lib.ast.attrs {
        if let syn::Meta::NameValue(nv) = &attr.meta {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            {
                if nv.path.is_ident("doc") {
                    lines.push(s.value().trim().to_string());
                }
            }
        }
    }
    let start = lines.iter().position(|l| l == "# Layout")?;
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("# "))
        .map_or(lines.len(), |n| start + 1 + n);
    Some(lines[start + 1..end].join("\n"))
}

/// The modules a file declares at its top (not under `#[cfg(test)]`).
fn declared(source: &Source) -> Vec<String> {
    let items = source.ast.items.iter();
    items
        .filter_map(|i| match i {
            Item::Mod(m) if !is_cfg_test(&m.attrs) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// `name` appears in `text` as a whole name followed by `` ` ``, `/`, `]` or `::`, after
/// `` ` ``, `[` or `::`/`/` of a prefix already matched.
fn names(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        matches!(before, Some('`' | '[' | ':' | '/'))
            && matches!(after, Some('`' | '/' | ']' | ':'))
    })
}

/// Modules of `src/` (lib.rs and main.rs) and of `src/api/` the Layout section does not name.
fn layout(sources: &[Source], problems: &mut Vec<String>) {
    let file = |p: &str| sources.iter().find(|s| s.path == p);
    let Some(lib) = file("src/lib.rs") else {
        return;
    };
    let Some(section) = layout_section(lib) else {
        problems.push("src/lib.rs: no `//! # Layout` section".into());
        return;
    };
    let mut wanted = BTreeSet::new();
    for root in ["src/lib.rs", "src/main.rs"] {
        wanted.extend(
            file(root)
                .map(declared)
                .unwrap_or_default()
                .into_iter()
                .map(|m| (m.clone(), m)),
        );
    }
    for m in file("src/api/mod.rs").map(declared).unwrap_or_default() {
        wanted.insert((format!("api::{m}"), format!("api/{m}")));
    }
    for (path, folder) in wanted {
        if !names(&section, &path) && !names(&section, &folder) {
            problems.push(format!(
                "src/lib.rs: module {path} is not named in the `# Layout` section"
            ));
        }
    }
}

/// `a/{b,c}/d` -> `a/b/d`, `a/c/d` (one level of braces).
fn expand(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else {
        return vec![token.to_string()];
    };
    if close < open {
        return vec![token.to_string()];
    }
    let (head, tail) = (&token[..open], &token[close + 1..]);
    token[open + 1..close]
        .split(',')
        .map(|part| format!("{head}{}{tail}", part.trim()))
        .collect()
}

/// A backticked token that is a path of the tree: a folder (`x/`) or a file of the
/// workspace's kinds, with no spaces, `::` or `|`.
fn path_like(token: &str) -> bool {
    let kinds = [
        ".rs", ".lua", ".toml", ".md", ".sh", ".proto", ".avsc", ".json", ".yml", ".yaml",
    ];
    let shaped = !token.is_empty()
        && !token.contains([' ', '|', '<', '*', '$', '='])
        && !token.contains("::");
    let named = !token.starts_with('.') || token.starts_with("./") || token.starts_with("../");
    shaped
        && named
        && !token.contains("://")
        && (token.contains('/') || kinds.iter().any(|k| token.ends_with(k)))
}

/// Every file and folder of the repository (relative, with a trailing `/` for folders),
/// without `target/` and hidden ones.
fn repo_paths(root: &Path, rel: &str, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(root.join(rel)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || (rel.is_empty() && name == "target") {
            continue;
        }
        let path = format!("{rel}{name}");
        if e.path().is_dir() {
            out.push(format!("{path}/"));
            repo_paths(root, &format!("{path}/"), out);
        } else {
            out.push(path);
        }
    }
}

/// Whether `path` (relative to the repository, or to the folder `near`) names a file or
/// folder of the tree: `sink/mod.rs` and `api/edge/` match wherever they end a path.
fn exists(all: &[String], near: &str, path: &str) -> bool {
    let path = path.trim_start_matches("./");
    let mut local: Vec<&str> = near.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            ".." => {
                local.pop();
            }
            p => local.push(p),
        }
    }
    let local = local.join("/");
    all.iter()
        .any(|p| *p == path || *p == local || p.ends_with(&format!("/{path}")))
}

/// Paths named in backticks on the guide's layout page that match nothing.
fn guide(root: &Path, all: &[String], problems: &mut Vec<String>) {
    let Ok(text) = fs::read_to_string(root.join(GUIDE)) else {
        problems.push(format!("{GUIDE}: missing"));
        return;
    };
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for token in line.split('`').skip(1).step_by(2).filter(|t| path_like(t)) {
            for path in expand(token).iter().filter(|p| !exists(all, "", p)) {
                problems.push(format!(
                    "{GUIDE}:{}: `{path}` names no file or folder of the tree",
                    n + 1
                ));
            }
        }
    }
}

/// `.rs` files named in backticks in comments (`//`, `///`, `//!`) that match nothing.
fn comments(sources: &[Source], all: &[String], problems: &mut Vec<String>) {
    for s in sources {
        let folder = s.path.rsplit_once('/').map_or("", |(f, _)| f);
        for (n, line) in s.text.lines().enumerate() {
            let Some(comment) = line.trim_start().strip_prefix("//") else {
                continue;
            };
            let tokens = comment.split('`').skip(1).step_by(2);
            for token in tokens.filter(|t| t.ends_with(".rs") && path_like(t)) {
                for path in expand(token).iter().filter(|p| !exists(all, folder, p)) {
                    problems.push(format!(
                        "{}:{}: `{path}` names no file of the tree",
                        s.path,
                        n + 1
                    ));
                }
            }
        }
    }
}

/// The maps.
pub fn check(root: &Path, sources: &[Source], problems: &mut Vec<String>) {
    let mut all = Vec::new();
    repo_paths(root, "", &mut all);
    layout(sources, problems);
    guide(root, &all, problems);
    comments(sources, &all, problems);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_a_whole_name_in_code_marks() {
        assert!(names("* [`api`]: the ports", "api"));
        assert!(names("* `main.rs` and `cli/`", "cli"));
        assert!(names("[`api::rls`] (Envoy)", "api::rls"));
        assert!(!names("[`api::rlsq`]", "api::rls"));
        assert!(!names("the api ports", "api"));
    }

    #[test]
    fn paths_and_braces() {
        assert!(path_like("src/stream/decode/{avro,protobuf}/"));
        assert!(path_like("window.rs"));
        assert!(!path_like("tally key|state"));
        assert!(!path_like("api::rls"));
        assert!(!path_like("https://example.org/x"));
        assert!(!path_like(".rs"));
        assert!(path_like("../config/mod.rs"));
        assert_eq!(expand("a/{b, c}/d.rs"), ["a/b/d.rs", "a/c/d.rs"]);
    }
}
