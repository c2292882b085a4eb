//! What a file defines, as the budgets count it: functions and methods with their length,
//! structs with their fields, type names, and inherent `impl` blocks.

use syn::visit::{self, Visit};
use syn::{
    Attribute, Block, Fields, ImplItemFn, Item, ItemFn, ItemImpl, ItemMod, ItemTrait, TraitItemFn,
    Type,
};

use crate::tree::{has_test_attr, is_cfg_test};

/// A function or method with a body.
pub struct FnInfo {
    /// `file::module::Type::name` (`<Type as Trait>::name` in a trait impl).
    pub key: String,
    pub line: usize,
    /// From the line of `fn` to the line of its closing brace.
    pub lines: usize,
    pub test: bool,
}

/// A struct and its field count.
pub struct StructInfo {
    pub name: String,
    pub line: usize,
    pub fields: usize,
    /// Derives `Deserialize`: a configuration section, exempt from the field limit.
    pub deserialize: bool,
    pub test: bool,
}

/// A struct, enum, union, trait or type alias declared at module level (not in a function).
pub struct TypeDef {
    pub name: String,
    pub module: Vec<String>,
    pub test: bool,
}

/// An inherent `impl Type { .. }` block.
pub struct ImplInfo {
    /// The self type's path as written (`Worker`, `super::Worker`).
    pub segs: Vec<String>,
    pub module: Vec<String>,
    pub line: usize,
    pub test: bool,
}

#[derive(Default)]
pub struct Items {
    pub fns: Vec<FnInfo>,
    pub structs: Vec<StructInfo>,
    pub types: Vec<TypeDef>,
    pub impls: Vec<ImplInfo>,
}

struct ItemWalk<'a> {
    file: &'a str,
    module: Vec<String>,
    /// Inline modules below the file's module (for function keys).
    scope: Vec<String>,
    /// Inside test code (`#[cfg(test)]`, or a file of tests).
    test: usize,
    /// Inside a function body: items there are local.
    in_fn: usize,
    /// `Type` or `<Type as Trait>` while inside an impl, `Trait` inside a trait.
    owner: Option<String>,
    out: Items,
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The last name of a type's path (`Worker` of `super::Worker<T>`), `&T` for a reference.
pub fn type_name(ty: &Type) -> String {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(|| "_".into(), |s| s.ident.to_string()),
        Type::Reference(r) => format!("&{}", type_name(&r.elem)),
        _ => "_".into(),
    }
}

fn derives_deserialize(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("derive")
            && a.parse_args_with(
                syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|ps| {
                ps.iter()
                    .any(|p| p.segments.last().is_some_and(|s| s.ident == "Deserialize"))
            })
    })
}

impl ItemWalk<'_> {
    fn function(&mut self, name: &syn::Ident, fn_line: usize, block: &Block, attrs: &[Attribute]) {
        if self.in_fn > 0 {
            return;
        }
        let mut key = vec![self.file.to_string()];
        key.extend(self.scope.iter().cloned());
        key.extend(self.owner.clone());
        key.push(name.to_string());
        let end = block.brace_token.span.close().end().line;
        self.out.fns.push(FnInfo {
            key: key.join("::"),
            line: fn_line,
            lines: end + 1 - fn_line,
            test: self.test > 0 || has_test_attr(attrs) || is_cfg_test(attrs),
        });
    }

    fn type_def(&mut self, name: &syn::Ident) {
        if self.in_fn == 0 {
            let mut module = self.module.clone();
            module.extend(self.scope.iter().cloned());
            self.out.types.push(TypeDef {
                name: name.to_string(),
                module,
                test: self.test > 0,
            });
        }
    }

    fn body(&mut self, f: impl FnOnce(&mut Self)) {
        self.in_fn += 1;
        f(self);
        self.in_fn -= 1;
    }
}

impl<'ast> Visit<'ast> for ItemWalk<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        let test = is_cfg_test(item_attrs(item));
        self.test += usize::from(test);
        visit::visit_item(self, item);
        self.test -= usize::from(test);
    }

    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        self.scope.push(m.ident.to_string());
        visit::visit_item_mod(self, m);
        self.scope.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast ItemFn) {
        self.function(
            &f.sig.ident,
            f.sig.fn_token.span.start().line,
            &f.block,
            &f.attrs,
        );
        let owner = self.owner.take();
        self.body(|c| visit::visit_item_fn(c, f));
        self.owner = owner;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast ImplItemFn) {
        let test = is_cfg_test(&f.attrs);
        self.test += usize::from(test);
        self.function(
            &f.sig.ident,
            f.sig.fn_token.span.start().line,
            &f.block,
            &f.attrs,
        );
        self.body(|c| visit::visit_impl_item_fn(c, f));
        self.test -= usize::from(test);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast TraitItemFn) {
        if let Some(block) = &f.default {
            self.function(
                &f.sig.ident,
                f.sig.fn_token.span.start().line,
                block,
                &f.attrs,
            );
        }
        self.body(|c| visit::visit_trait_item_fn(c, f));
    }

    fn visit_item_impl(&mut self, i: &'ast ItemImpl) {
        let ty = type_name(&i.self_ty);
        let owner = match &i.trait_ {
            Some((_, path, _)) => {
                let t = path
                    .segments
                    .last()
                    .map_or_else(String::new, |s| s.ident.to_string());
                format!("<{ty} as {t}>")
            }
            None => ty,
        };
        if i.trait_.is_none() && self.in_fn == 0 {
            if let Type::Path(p) = &*i.self_ty {
                let segs = p
                    .path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect();
                let mut module = self.module.clone();
                module.extend(self.scope.iter().cloned());
                let line = i.impl_token.span.start().line;
                self.out.impls.push(ImplInfo {
                    segs,
                    module,
                    line,
                    test: self.test > 0,
                });
            }
        }
        let saved = self.owner.replace(owner);
        visit::visit_item_impl(self, i);
        self.owner = saved;
    }

    fn visit_item_trait(&mut self, t: &'ast ItemTrait) {
        self.type_def(&t.ident);
        let saved = self.owner.replace(t.ident.to_string());
        visit::visit_item_trait(self, t);
        self.owner = saved;
    }

    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        self.type_def(&s.ident);
        let fields = match &s.fields {
            Fields::Named(f) => f.named.len(),
            Fields::Unnamed(f) => f.unnamed.len(),
            Fields::Unit => 0,
        };
        let (name, line) = (s.ident.to_string(), s.struct_token.span.start().line);
        let deserialize = derives_deserialize(&s.attrs);
        self.out.structs.push(StructInfo {
            name,
            line,
            fields,
            deserialize,
            test: self.test > 0,
        });
        visit::visit_item_struct(self, s);
    }

    fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
        self.type_def(&e.ident);
        visit::visit_item_enum(self, e);
    }

    fn visit_item_union(&mut self, u: &'ast syn::ItemUnion) {
        self.type_def(&u.ident);
        visit::visit_item_union(self, u);
    }

    fn visit_item_type(&mut self, t: &'ast syn::ItemType) {
        self.type_def(&t.ident);
        visit::visit_item_type(self, t);
    }
}

/// What the file `path` (module `module`, all test code when `test`) defines.
pub fn collect(ast: &syn::File, path: &str, module: &[String], test: bool) -> Items {
    let mut c = ItemWalk {
        file: path,
        module: module.to_vec(),
        scope: Vec::new(),
        test: usize::from(test),
        in_fn: 0,
        owner: None,
        out: Items::default(),
    };
    c.visit_file(ast);
    c.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(code: &str) -> Items {
        collect(
            &syn::parse_file(code).unwrap(),
            "src/a.rs",
            &["a".into()],
            false,
        )
    }

    #[test]
    fn functions_are_counted_from_fn_to_the_closing_brace() {
        let code = "impl Foo {\n    pub fn new() -> Foo {\n        Foo\n    }\n}\n\
                    impl std::fmt::Display for Foo {\n    fn fmt(&self) {}\n}\n\
                    mod inner {\n    fn helper() {\n        fn nested() {}\n    }\n}\n\
                    #[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n\
                    #[tokio::test]\nasync fn loose() {}\n";
        let found: Vec<(String, usize, usize, bool)> = items(code)
            .fns
            .into_iter()
            .map(|f| (f.key, f.line, f.lines, f.test))
            .collect();
        assert_eq!(
            found,
            [
                ("src/a.rs::Foo::new".to_string(), 2, 3, false),
                ("src/a.rs::<Foo as Display>::fmt".to_string(), 7, 1, false),
                ("src/a.rs::inner::helper".to_string(), 10, 3, false),
                ("src/a.rs::tests::t".to_string(), 17, 1, true),
                ("src/a.rs::loose".to_string(), 20, 1, true),
            ]
        );
    }

    #[test]
    fn fields_are_syntax_not_brackets() {
        let code = "struct A {\n    f: Box<dyn Fn(u8) -> u8>,\n    g: std::collections::HashMap<String, Vec<(u8, u8)>>,\n    h: [u8; 4],\n}\n\
                    #[derive(Debug, serde::Deserialize)]\nstruct Section {\n    a: u8,\n}\nstruct T(u8, u8);\n";
        let found: Vec<(String, usize, bool)> = items(code)
            .structs
            .into_iter()
            .map(|s| (s.name, s.fields, s.deserialize))
            .collect();
        assert_eq!(
            found,
            [
                ("A".into(), 3, false),
                ("Section".into(), 1, true),
                ("T".into(), 2, false)
            ]
        );
    }

    #[test]
    fn types_in_function_bodies_are_local_and_impls_are_inherent_only() {
        let code = "fn f() {\n    struct Local;\n    impl Local {}\n}\nenum E {}\ntrait T {}\ntype Alias = u8;\n\
                    impl E {}\nimpl T for E {}\n#[cfg(test)]\nimpl E {}\n";
        let items = items(code);
        let names: Vec<&str> = items.types.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["E", "T", "Alias"]);
        let impls: Vec<(String, bool)> = items
            .impls
            .iter()
            .map(|i| (i.segs.join("::"), i.test))
            .collect();
        assert_eq!(impls, [("E".to_string(), false), ("E".to_string(), true)]);
    }
}
