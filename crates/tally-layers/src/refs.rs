//! What a file refers to: every `use` tree, every path in an expression, a type, a pattern or
//! an attribute, and the paths written inside macro calls, read from syn's tokens (so a string
//! or a comment is never a path). Paths are resolved against the crate's modules, `super::` and
//! `self::` from the module they are written in, and the crate root's imports and re-exports
//! (`pub use stream::sink::Sink as S;` makes `crate::S` a reference to `stream::sink`).

use std::collections::{HashMap, HashSet};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{Attribute, ItemMod, ItemUse, Macro, Meta, Path, UseTree};

/// A path as written, with where it was written.
pub struct RawRef {
    /// The module it is written in (the file's module and any inline module around it).
    pub from: Vec<String>,
    pub segs: Vec<String>,
    pub line: usize,
    /// Written in the crate's binary (see [`crate::tree::Source::bin`]).
    pub bin: bool,
}

/// A name a `use` item brings into a module (`use a::b as c;` is `c` -> `a::b`).
pub struct UseName {
    pub module: Vec<String>,
    pub name: String,
    pub segs: Vec<String>,
    pub bin: bool,
}

/// What one file refers to, and the names and inline modules it declares.
#[derive(Default)]
pub struct FileRefs {
    pub refs: Vec<RawRef>,
    pub uses: Vec<UseName>,
    pub inline_modules: Vec<Vec<String>>,
}

struct RefWalk<'a> {
    module: Vec<String>,
    self_name: &'a str,
    bin: bool,
    out: FileRefs,
}

impl RefWalk<'_> {
    fn push(&mut self, segs: Vec<String>, line: usize) {
        if !segs.is_empty() {
            self.out.refs.push(RawRef {
                from: self.module.clone(),
                segs,
                line,
                bin: self.bin,
            });
        }
    }

    /// `a::{b, c::d as e, f::*}` -> `a::b`, `a::c::d` (named `e`), `a::f`.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            UseTree::Name(n) => {
                let mut segs = prefix.clone();
                let name = if n.ident == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    n.ident.to_string()
                };
                if n.ident != "self" {
                    segs.push(name.clone());
                }
                self.named(segs, name, n.ident.span().start().line);
            }
            UseTree::Rename(r) => {
                let mut segs = prefix.clone();
                if r.ident != "self" {
                    segs.push(r.ident.to_string());
                }
                self.named(segs, r.rename.to_string(), r.ident.span().start().line);
            }
            UseTree::Glob(g) => self.push(prefix.clone(), g.star_token.spans[0].start().line),
            UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(item, prefix);
                }
            }
        }
    }

    fn named(&mut self, segs: Vec<String>, name: String, line: usize) {
        self.out.uses.push(UseName {
            module: self.module.clone(),
            name,
            segs: segs.clone(),
            bin: self.bin,
        });
        self.push(segs, line);
    }

    /// Paths inside a macro's tokens: `crate::`, `super::`, `self::` or the crate's own name,
    /// followed by `::`-separated names (literals are single tokens, so strings are skipped).
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(g) = &trees[i] {
                self.macro_tokens(g.stream());
            }
            let TokenTree::Ident(head) = &trees[i] else {
                i += 1;
                continue;
            };
            let name = head.to_string();
            let starts =
                matches!(name.as_str(), "crate" | "super" | "self") || name == self.self_name;
            let preceded =
                i >= 1 && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == ':');
            let mut segs = vec![name];
            let mut j = i + 1;
            while let (
                Some(TokenTree::Punct(a)),
                Some(TokenTree::Punct(b)),
                Some(TokenTree::Ident(next)),
            ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
            {
                if a.as_char() != ':' || a.spacing() != Spacing::Joint || b.as_char() != ':' {
                    break;
                }
                segs.push(next.to_string());
                j += 3;
            }
            if starts && !preceded && segs.len() > 1 {
                self.push(segs, head.span().start().line);
            }
            i = j.max(i + 1);
        }
    }
}

impl<'ast> Visit<'ast> for RefWalk<'_> {
    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            self.out.inline_modules.push(self.module.clone());
            visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast ItemUse) {
        if u.leading_colon.is_none() {
            self.use_tree(&u.tree, &mut Vec::new());
        }
    }

    fn visit_path(&mut self, p: &'ast Path) {
        if p.leading_colon.is_none() {
            let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = p
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.push(segs, line);
        }
        visit::visit_path(self, p);
    }

    /// Attribute arguments are tokens too (`#[schema(value_type = super::schemas::X)]`).
    fn visit_attribute(&mut self, a: &'ast Attribute) {
        if let Meta::List(list) = &a.meta {
            self.macro_tokens(list.tokens.clone());
        }
        visit::visit_attribute(self, a);
    }

    fn visit_macro(&mut self, m: &'ast Macro) {
        visit::visit_macro(self, m);
        self.macro_tokens(m.tokens.clone());
    }
}

/// Everything `ast` (the file of `module`, of the crate's binary if `bin`) refers to.
pub fn collect(ast: &syn::File, module: &[String], self_name: &str, bin: bool) -> FileRefs {
    let mut c = RefWalk {
        module: module.to_vec(),
        self_name,
        bin,
        out: FileRefs::default(),
    };
    c.visit_file(ast);
    c.out
}

/// A crate-absolute path, and whether it starts at the binary's root (`main.rs`).
pub type Absolute = (Vec<String>, bool);

/// Resolves written paths to a crate's modules: its files, its folders (a folder groups its
/// files even without a `mod.rs`) and the inline modules written in its files.
pub struct Resolver {
    pub modules: HashSet<Vec<String>>,
    /// The crate root's imports and re-exports: name -> absolute path (`None`: another crate);
    /// `[0]` the library's root (`lib.rs`), `[1]` the binary's (`main.rs`).
    root_names: [HashMap<String, Option<Absolute>>; 2],
    self_name: String,
}

impl Resolver {
    pub fn new(modules: HashSet<Vec<String>>, self_name: &str, uses: &[&UseName]) -> Resolver {
        let mut r = Resolver {
            modules,
            root_names: Default::default(),
            self_name: self_name.to_string(),
        };
        for u in uses.iter().filter(|u| u.module.is_empty()) {
            let target = r.absolute(&u.segs, &u.module, u.bin);
            r.root_names[usize::from(u.bin)].insert(u.name.clone(), target);
        }
        r
    }

    /// A written path as a crate-absolute path, if it names something of this crate: `crate::`,
    /// the crate's own name, `super::`/`self::` from `here`, or a child module of `here`. With
    /// it, whether it starts at the binary's root (`crate::` written in the binary).
    pub fn absolute(&self, segs: &[String], here: &[String], bin: bool) -> Option<Absolute> {
        let head = segs.first()?;
        if head == "crate" || *head == self.self_name {
            return Some((segs[1..].to_vec(), bin && head == "crate"));
        }
        if head == "super" || head == "self" {
            let mut base = here.to_vec();
            let mut rest = segs;
            while let Some(first) = rest.first().filter(|s| *s == "super" || *s == "self") {
                if first == "super" {
                    base.pop()?;
                }
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            return Some((base, bin));
        }
        let mut child = here.to_vec();
        child.push(head.clone());
        self.modules
            .contains(&child)
            .then(|| (here.iter().chain(segs).cloned().collect(), bin))
    }

    /// The module an absolute path lands in: the longest prefix that is a module, following
    /// the crate root's names (`crate::S` where the root has `pub use stream::sink::Sink as S`).
    pub fn module(&self, (path, bin): &Absolute) -> Vec<String> {
        self.module_at(path, *bin, 0)
    }

    fn module_at(&self, path: &[String], bin: bool, depth: usize) -> Vec<String> {
        let mut here: Vec<String> = Vec::new();
        for (i, seg) in path.iter().enumerate() {
            let mut next = here.clone();
            next.push(seg.clone());
            if self.modules.contains(&next) {
                here = next;
                continue;
            }
            if here.is_empty() && depth < 8 {
                if let Some(target) = self.root_names[usize::from(bin)].get(seg) {
                    let Some((target, bin)) = target else {
                        return Vec::new();
                    };
                    let full: Vec<String> = target.iter().chain(&path[i + 1..]).cloned().collect();
                    return self.module_at(&full, *bin, depth + 1);
                }
            }
            break;
        }
        here
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(code: &str, module: &[&str]) -> FileRefs {
        let module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
        collect(&syn::parse_file(code).unwrap(), &module, "tally", false)
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn strings_and_comments_are_not_paths_but_macros_and_attributes_are() {
        let code = "// crate::a::b\n/* crate::c */\nconst S: &str = \"crate::d // x\";\n\
                    fn f() { println!(\"{}\", crate::e::F); }\n#[schema(value_type = super::g::G)]\nstruct H;\n\
                    fn i() -> crate::j::J { todo!() }\nuse crate::{k::{self, L as M}, n::*};\n";
        let found: Vec<String> = refs(code, &["x"])
            .refs
            .iter()
            .map(|r| format!("{}@{}", r.segs.join("::"), r.line))
            .collect();
        for want in [
            "crate::e::F@4",
            "super::g::G@5",
            "crate::j::J@7",
            "crate::k@8",
            "crate::k::L@8",
            "crate::n@8",
        ] {
            assert!(found.contains(&want.to_string()), "{want} not in {found:?}");
        }
        assert!(!found.iter().any(|f| f.starts_with("crate::a")
            || f.starts_with("crate::c")
            || f.starts_with("crate::d")));
    }

    #[test]
    fn paths_resolve_through_super_children_and_the_roots_names() {
        let modules: HashSet<Vec<String>> = [vec!["a"], vec!["a", "b"], vec!["c"], vec!["cli"]]
            .into_iter()
            .map(|m| strings(&m))
            .collect();
        let lib = refs("pub use a::b::Thing as S;\npub use other_crate::x;\n", &[]);
        let bin = refs("mod cli;\nuse cli::run as x;\n", &[]);
        let mut uses: Vec<&UseName> = lib.uses.iter().collect();
        let bin_uses: Vec<UseName> = bin
            .uses
            .into_iter()
            .map(|u| UseName { bin: true, ..u })
            .collect();
        uses.extend(&bin_uses);
        let r = Resolver::new(modules, "tally", &uses);
        let module = |segs: &[&str], here: &[&str], bin: bool| {
            r.absolute(&strings(segs), &strings(here), bin)
                .map(|p| r.module(&p).join("::"))
        };
        assert_eq!(
            module(&["super", "super", "c", "D"], &["a", "b"], false),
            Some("c".into())
        );
        assert_eq!(
            module(&["self", "b", "X"], &["a"], false),
            Some("a::b".into())
        );
        assert_eq!(module(&["b", "X"], &["a"], false), Some("a::b".into()));
        assert_eq!(module(&["crate", "S"], &["c"], false), Some("a::b".into()));
        assert_eq!(module(&["tally", "S"], &["cli"], true), Some("a::b".into()));
        // `x` is another crate's in the library, the binary's own `cli::run` in the binary.
        assert_eq!(
            module(&["crate", "x", "Y"], &["c"], false),
            Some(String::new())
        );
        assert_eq!(module(&["crate", "x"], &["cli"], true), Some("cli".into()));
        assert_eq!(module(&["std", "x"], &["c"], false), None);
        assert_eq!(module(&["super", "super"], &["c"], false), None);
    }
}
